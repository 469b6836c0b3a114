--[[
  The job holding a loner identity, if it still holds it (PolicyQueue.holder / enqueued): while
  it waits, or, when it was admitted with until='finished' (its hash says policies_loner_until),
  while it runs on a live worker or in a live horse (lib/holder_running.lua). A marker whose
  holder does neither answers "nobody" and is left for the next enqueue to replace.

  KEYS  by name (rq_policies/ops.py): marker (rq:policies:loner:<q>:<digest>)
  ARGV[1]  msgpack map: job_prefix (rq:job:), worker_prefix (rq:worker:), alive_prefix
           (rq:policies:alive:)

  Returns the holder's job id, or false.
]]
local rcall = redis.call
-- @include "lib/codec.lua"
-- @include "lib/keys.lua"
-- @include "lib/holder_waiting.lua"
-- @include "lib/holder_running.lua"
local a = decode_args(ARGV[1])
local holder = rcall('GET', KEYS[a.k.marker])
if not holder then return false end
if holder_waiting(a.job_prefix, holder) then
  return holder
end
if rcall('HGET', key_of(a.job_prefix, holder), 'policies_loner_until') == 'finished'
    and holder_running(a.job_prefix, a.worker_prefix, holder, a.alive_prefix) then
  return holder
end
return false
