--[[
  Enqueue a job now whatever its policies say (PolicyQueue.force), in one atomic step: the job
  takes the identity's current throttle slot (its key now names this job, until the slot ends),
  any pending trailing job or pending debounced job of the identity is dropped (deleted, out of
  the scheduled registry), and the job is pushed. With the Loner flag, the job takes the loner
  marker when no other job holds it; a waiting holder keeps it (both then wait, which is what
  "regardless" asks for).

  Pending jobs whose run time has been reached are left alone: rq's scheduler may be moving them.

  KEYS[1]  slot key prefix        rq:policies:throttle:<q>:<digest>: (the slot number is appended)
  KEYS[2]  trailing pointer       rq:policies:trailing:<q>:<digest>
  KEYS[3]  debounce hash          rq:policies:debounce:<q>:<digest>
  KEYS[4]  job hash               rq:job:<id>
  KEYS[5]  queue                  rq:queue:<q>
  KEYS[6]  scheduled registry     rq:scheduled:<q>
  KEYS[7]  queues set             rq:queues
  KEYS[8]  loner marker           rq:policies:loner:<q>:<digest> (used only with ARGV[7] = 1)

  ARGV[1]  job id
  ARGV[2]  slot width             seconds, or 0 when the job has no Throttle
  ARGV[3]  mode                   R | L | D (see includes/save_job.lua)
  ARGV[4]  ttl                    seconds the job hash (and its loner marker) lives; -1 for no expiry
  ARGV[5]  queue key              rq:queue:<q>, added to rq:queues
  ARGV[6]  job key prefix         rq:job:
  ARGV[7]  loner                  1 when the job has a Loner, else 0
  ARGV[8]  wake channel           rq:policies:wake:<q>
  ARGV[9..] job hash field/value pairs

  Returns {job id, dropped trailing job id or '', dropped debounced job id or ''}.
]]
local rcall = redis.call
local jid = ARGV[1]
local width = tonumber(ARGV[2])
local mode = ARGV[3]
local ttl = tonumber(ARGV[4])
local queue_key = ARGV[5]
local job_prefix = ARGV[6]
local loner = ARGV[7] == '1'

-- @include "includes/server_time.lua"
-- @include "includes/slot.lua"
-- @include "includes/waiting.lua"
-- @include "includes/save_job.lua"

local now = server_now()

local trailing = rcall('GET', KEYS[2])
local dropped_trailing = ''
if drop_pending(KEYS[6], job_prefix, trailing, now) == 1 then
  dropped_trailing = trailing
end
rcall('DEL', KEYS[2])

if width > 0 then
  local index, ends = slot_at(now, width)
  set_until(slot_key(KEYS[1], index), jid, ends, now)
  -- The dropped trailing job had taken the next slot as its run; that run is gone now.
  local next_key = slot_key(KEYS[1], index + 1)
  if dropped_trailing ~= '' and rcall('GET', next_key) == dropped_trailing then
    rcall('DEL', next_key)
  end
end

local debounced = rcall('HGET', KEYS[3], 'job')
local dropped_debounced = ''
if drop_pending(KEYS[6], job_prefix, debounced, now) == 1 then
  dropped_debounced = debounced
end
rcall('DEL', KEYS[3])

if loner then
  local holder = rcall('GET', KEYS[8])
  if not (holder and holder ~= jid and holder_waiting(job_prefix, holder)) then
    take_marker(KEYS[8], jid, ttl)
  end
end

save_job(KEYS[4], KEYS[5], KEYS[7], queue_key, jid, mode, 0, ttl, {unpack(ARGV, 9)})
if mode == 'R' or mode == 'L' then
  rcall('PUBLISH', ARGV[8], jid)
end
return {jid, dropped_trailing, dropped_debounced}
