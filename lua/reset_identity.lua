--[[
  Clear one identity's policy state on one queue (PolicyQueue.reset), in one atomic step: the
  current and next throttle slot keys, the pending trailing job, the loner marker, and the pending
  debounced job. Pending jobs are deleted (out of the scheduled registry, hash removed); a job
  already queued or running is left alone, only the marker that held its identity goes.

  Pending jobs whose run time has been reached are left alone: rq's scheduler may be moving them.

  KEYS[1]  slot key prefix        rq:policies:throttle:<q>:<digest>: (the slot number is appended)
  KEYS[2]  trailing pointer       rq:policies:trailing:<q>:<digest>
  KEYS[3]  loner marker           rq:policies:loner:<q>:<digest>
  KEYS[4]  debounce hash          rq:policies:debounce:<q>:<digest>
  KEYS[5]  scheduled registry     rq:scheduled:<q>
  KEYS[6..] more slot keys        rq:policies:throttle:<q>:<digest>:<slot>, found by SCAN when the slot
                                  width is not known (`rq-policies reset` of a function it cannot import)

  ARGV[1]  slot width             seconds, or 0 when the identity has no Throttle
  ARGV[2]  job key prefix         rq:job:

  Returns the number of keys removed (policy keys and the hashes of the pending jobs dropped).
]]
local rcall = redis.call
local width = tonumber(ARGV[1])
local job_prefix = ARGV[2]

-- @include "includes/server_time.lua"
-- @include "includes/slot.lua"

local now = server_now()
local removed = 0

if width > 0 then
  local index = slot_at(now, width)
  removed = removed + rcall('DEL', slot_key(KEYS[1], index), slot_key(KEYS[1], index + 1))
end
removed = removed + drop_pending(KEYS[5], job_prefix, rcall('GET', KEYS[2]), now)
removed = removed + drop_pending(KEYS[5], job_prefix, rcall('HGET', KEYS[4], 'job'), now)
removed = removed + rcall('DEL', KEYS[2], KEYS[3], KEYS[4])
for i = 6, #KEYS do
  removed = removed + rcall('DEL', KEYS[i])
end
return removed
