--[[
  Claim this identity's throttle slot for a job and write the job, or drop it, in one atomic step
  (the leading edge: Throttle(slot), and Throttle.admit).

  The slot is the epoch-aligned one the server clock is in (includes/slot.lua). Its key holds only
  the winner's job id and expires when the slot ends. Replay-safe: a job id that already owns the
  slot (a retried call whose reply was lost) is answered "admitted" again and nothing is written
  twice. With the Loner flag set, a waiting job that holds the loner marker also drops the extra,
  and the winner takes the marker; the slot is tested first, so a drop names the slot's owner
  whenever the slot is held.

  KEYS[1]  slot key prefix        rq:policies:throttle:<q>:<digest>: (the slot number is appended)
  KEYS[2]  job hash               rq:job:<id>
  KEYS[3]  destination            rq:queue:<q> (mode R/L), rq:scheduled:<q> (mode S), unused (D/N)
  KEYS[4]  queues set             rq:queues
  KEYS[5]  loner marker           rq:policies:loner:<q>:<digest> (read only with ARGV[8] = 1)
  KEYS[6]  drop counters          rq:policies:drops

  ARGV[1]  job id
  ARGV[2]  slot width             seconds, a whole number >= 1
  ARGV[3]  mode                   R | L | S | D (see includes/save_job.lua), or N: claim only, write
                                  no job (Throttle.admit)
  ARGV[4]  score                  epoch seconds the job is scheduled for (mode S), else 0
  ARGV[5]  ttl                    seconds the job hash (and its loner marker) lives; -1 for no expiry
  ARGV[6]  queue key              rq:queue:<q>, added to rq:queues
  ARGV[7]  job key prefix         rq:job:
  ARGV[8]  loner                  1 to apply the Loner check as well, 0 not to
  ARGV[9]  throttle drop field    throttle:<q>
  ARGV[10] loner drop field       loner:<q>
  ARGV[11] wake channel           rq:policies:wake:<q>; published on a push so idle PolicyWorkers wake
  ARGV[12..] job hash field/value pairs

  Returns {code, job id, slot end, server now}: code 1 admitted (job id = ours), 0 dropped because
  the slot is held (job id = the slot's owner), -1 dropped by the Loner check (job id = the waiting
  holder). Slot end is epoch seconds (an integer); server now is a string with microseconds.
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
if owner == jid then
  return {1, jid, ends, format_now(now)}
end
if owner then
  rcall('HINCRBY', KEYS[6], ARGV[9], 1)
  return {0, owner, ends, format_now(now)}
end
if loner then
  local holder = rcall('GET', KEYS[5])
  if holder and holder ~= jid and holder_waiting(job_prefix, holder) then
    rcall('HINCRBY', KEYS[6], ARGV[10], 1)
    return {-1, holder, ends, format_now(now)}
  end
end

set_until(key, jid, ends, now)
if mode ~= 'N' then
  if loner then take_marker(KEYS[5], jid, ttl) end
  save_job(KEYS[2], KEYS[3], KEYS[4], queue_key, jid, mode, score, ttl, {unpack(ARGV, 12)})
  if mode == 'R' or mode == 'L' then
    rcall('PUBLISH', ARGV[11], jid)
  end
end
return {1, jid, ends, format_now(now)}
