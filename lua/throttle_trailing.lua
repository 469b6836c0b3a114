--[[
  The trailing edge of a throttle (Throttle(slot, trailing=True)), in one atomic step: a job that
  finds its slot free wins it and is written like a leading-edge winner; a job that finds the slot
  held becomes the slot's pending trailing job, scheduled for the slot's end in rq's scheduled-job
  registry, replacing (and deleting) the pending trailing job an earlier extra of the same slot
  left there. Only the latest payload runs, and the last event of a burst is never lost.

  The trailing job counts as the next slot's run: it also takes the next slot's key, so an extra
  arriving in the next slot queues behind it as that slot's trailing job instead of running at
  once right after it. A pending job whose run time has been reached is never replaced (rq's
  scheduler may be moving it), so it runs, and the new extra becomes the pending one.

  Replay-safe: a job id that already owns the slot is answered as before and nothing is written
  twice; one that is the pending trailing job replaces itself in place (same run time, and the
  payload of the latest call). With the Loner flag set, a waiting holder of
  the loner marker drops the extra, unless that holder is the very pending trailing job this extra
  replaces; the winner and the pending trailing job take the marker.

  KEYS[1]  slot key prefix        rq:policies:throttle:<q>:<digest>: (the slot number is appended)
  KEYS[2]  trailing pointer       rq:policies:trailing:<q>:<digest> (id of the pending trailing job)
  KEYS[3]  job hash               rq:job:<id>
  KEYS[4]  queue                  rq:queue:<q>
  KEYS[5]  scheduled registry     rq:scheduled:<q>
  KEYS[6]  queues set             rq:queues
  KEYS[7]  loner marker           rq:policies:loner:<q>:<digest> (read only with ARGV[8] = 1)
  KEYS[8]  drop counters          rq:policies:drops

  ARGV[1]  job id
  ARGV[2]  slot width             seconds, a whole number >= 1
  ARGV[3]  mode                   R | L (push when the slot is won) or S (scheduled, enqueue_at/in)
  ARGV[4]  score                  epoch seconds asked for (mode S), else 0; an extra runs at the
                                  later of this and the slot's end
  ARGV[5]  ttl                    seconds the job hash (and its loner marker) lives; -1 for no expiry
  ARGV[6]  queue key              rq:queue:<q>, added to rq:queues
  ARGV[7]  job key prefix         rq:job:
  ARGV[8]  loner                  1 to apply the Loner check as well, 0 not to
  ARGV[9]  loner drop field       loner:<q>
  ARGV[10] wake channel           rq:policies:wake:<q>
  ARGV[11..] job hash field/value pairs, written as a queued job (a trailing job is rewritten as
             a scheduled one)

  Returns {code, job id, epoch seconds, server now, superseded id}: code 1 won the slot (seconds =
  slot end), 2 pending trailing job (seconds = its run time; superseded id = the job it replaced
  and deleted, or ''), -1 dropped by the Loner check (job id = the waiting holder).
]]
local rcall = redis.call
local jid = ARGV[1]
local width = tonumber(ARGV[2])
local mode = ARGV[3]
local score = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local queue_key = ARGV[6]
local job_prefix = ARGV[7]
local loner = ARGV[8] == '1'

-- @include "includes/server_time.lua"
-- @include "includes/slot.lua"
-- @include "includes/waiting.lua"
-- @include "includes/save_job.lua"

local now = server_now()
local index, ends = slot_at(now, width)
local key = slot_key(KEYS[1], index)
local owner = rcall('GET', key)
local pending = rcall('GET', KEYS[2])
local nowstr = format_now(now)

if owner == jid then
  return {1, jid, ends, nowstr, ''}
end

local replaceable = pending and pending_at(KEYS[5], pending, now)

if loner then
  local holder = rcall('GET', KEYS[7])
  if holder and holder ~= jid and holder_waiting(job_prefix, holder)
      and not (replaceable and holder == pending) then
    rcall('HINCRBY', KEYS[8], ARGV[9], 1)
    return {-1, holder, ends, nowstr, ''}
  end
end

local fields = {unpack(ARGV, 11)}

if not owner then
  set_until(key, jid, ends, now)
  if loner then take_marker(KEYS[7], jid, ttl) end
  local dest = KEYS[4]
  if mode == 'S' then dest = KEYS[5] end
  save_job(KEYS[3], dest, KEYS[6], queue_key, jid, mode, score, ttl, fields)
  if mode == 'R' or mode == 'L' then
    rcall('PUBLISH', ARGV[10], jid)
  end
  return {1, jid, ends, nowstr, ''}
end

local superseded = ''
if replaceable then
  drop_pending(KEYS[5], job_prefix, pending, now)
  superseded = pending
end
local run_at = ends
if mode == 'S' and score > run_at then run_at = score end
save_job(KEYS[3], KEYS[5], KEYS[6], queue_key, jid, 'S', run_at, ttl, fields)
mark_scheduled(KEYS[3])
if loner then take_marker(KEYS[7], jid, ttl) end
set_until(KEYS[2], jid, run_at, now)
set_until(slot_key(KEYS[1], index + 1), jid, ends + width, now)
return {2, jid, run_at, nowstr, superseded}
