--[[
  Block keys for a while (a job raised BackOff(seconds, key=True)): no PolicyWorker starts a job
  of these keys until then; their jobs are parked until the block ends. A block that already ends
  later is kept. Rides the worker's pipeline that puts the job back on its queue.

  KEYS  by name (rq_policies/ops.py, built by rq_policies.concurrency.backoff_call):
    blocks     key list     rq:policies:keyblock:<scope>:<key>, one per key of the job
  ARGV[1]  one msgpack map (lib/codec.lua): seconds (a positive number)

  Returns the server time the block ends ('%.6f').
]]
-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"

local a = decode_args(ARGV[1])
local now = server_now()
local until_ = now + a.seconds
local first, n = a.kl.blocks[1], a.kl.blocks[2]
for i = first, first + n - 1 do
  local current = tonumber(redis.call('GET', KEYS[i]))
  if not current or current < until_ then
    redis.call('SET', KEYS[i], string.format('%.6f', until_), 'PX', math.max(math.ceil(a.seconds * 1000), 1))
  end
end
return string.format('%.6f', until_)
