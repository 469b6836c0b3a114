--[[
  The job holding a loner identity, if it still waits (PolicyQueue.holder / enqueued). A marker
  whose holder no longer waits answers "nobody" and is left for the next enqueue to replace.

  KEYS  by name (rq_policies/ops.py): marker (rq:policies:loner:<q>:<digest>)
  ARGV[1]  msgpack map: job_prefix (rq:job:)

  Returns the holder's job id, or false.
]]
local rcall = redis.call
-- @include "lib/codec.lua"
-- @include "lib/holder_waiting.lua"
local a = decode_args(ARGV[1])
local holder = rcall('GET', KEYS[a.k.marker])
if holder and holder_waiting(a.job_prefix, holder) then
  return holder
end
return false
