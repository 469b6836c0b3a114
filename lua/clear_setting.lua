--[[
  Remove one run-time setting stored in a hash (QueueSlot.clear: a queue's cap; QueueRate.clear:
  a queue's rate, and its arrival time with it; Fair.clear: a key's weight), wake the queue's idle
  PolicyWorkers when the setting limits fetches, and answer whether there was a setting to remove.

  A plain HDEL answers 0 when redis-py resends it after a lost reply, although the first attempt
  removed the setting: the answer is kept under the call's request id (lib/answer.lua), and a
  replay answers what the first run did and writes nothing.

  KEYS  by name (rq_policies/engine/ops.py, built by rq_policies.engine.admin.clear_setting):
    settings   the hash holding the setting (rq:policies:capacity, rq:policies:rate,
               rq:policies:fair:weights)
    answer     rq:policies:answer:<request id>
    and the key list `also`: keys deleted with the setting (QueueRate's rq:policies:tat:<queue>)
  ARGV[1]  one msgpack map (lib/codec.lua): field (the queue name or key id), wake (a queue's
           wake-up channel, rq:policies:wake:<queue>, or nil: none) and message (what it publishes),
           answer_ttl (seconds the answer is kept)

  Returns 1 when the setting was there, else 0.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/answer.lua"

local a = decode_args(ARGV[1])
local kept = kept_answer(a)
if kept then
  return tonumber(kept)
end
local removed = rcall('HDEL', KEYS[a.k.settings], a.field)
local also = a.kl and a.kl.also
if also and also[2] > 0 then
  rcall('DEL', unpack(KEYS, also[1], also[1] + also[2] - 1))
end
if a.wake then
  rcall('SPUBLISH', a.wake, a.message)
end
return keep_answer(a, removed)
