--[[
  Change one key's limit at run time (Concurrency.override / clear): the key's parked jobs are
  looked at by the next fetch (its due-index entry is set to now) and its queues' idle
  PolicyWorkers are woken, so a raised limit is used at once.

  KEYS  by name (rq_policies/ops.py, built by rq_policies.concurrency):
    limits     rq:policies:keylimits      HASH '<scope>:<key>' -> limit
    parked     rq:policies:keyparked:concurrency:<scope>:<key>
    keydue     rq:policies:keydue
  ARGV[1]  one msgpack map (lib/codec.lua): channel ('<scope>:<key>'), limit (a positive
    integer, or 0 to clear the override), job_prefix (rq:job:), wake (rq:policies:wake:)

  Returns 1 when an override was there before, else 0.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"

local a = decode_args(ARGV[1])
local limits = KEYS[a.k.limits]
local had = rcall('HEXISTS', limits, a.channel)
if a.limit > 0 then
  rcall('HSET', limits, a.channel, a.limit)
else
  rcall('HDEL', limits, a.channel)
end
local head = rcall('LINDEX', KEYS[a.k.parked], 0)
if head then
  rcall('ZADD', KEYS[a.k.keydue], server_now(), 'concurrency:' .. a.channel)
  local origin = rcall('HGET', a.job_prefix .. head, 'origin')
  if origin then
    rcall('PUBLISH', a.wake .. origin, 'capacity')
  end
end
return had
