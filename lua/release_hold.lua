--[[
  Give back one hold of a hold ledger and wake the queue's idle PolicyWorkers (QueueSlot.release
  called on a connection; on a pipeline, whose answer nobody reads, the release is a bare ZREM).
  The answer says whether the hold was still in the ledger; a ZREM's replay after a lost reply
  says 0 although the first attempt removed it, so the answer is kept under the call's request id
  (lib/answer.lua), and a replay answers what the first run did and writes nothing.

  KEYS  by name (rq_policies/engine/ops.py, built by rq_policies.engine.ledger.Ledger.release):
    ledger     the hold ledger (rq:policies:slots:<q>, ZSET member = hold token)
    answer     rq:policies:answer:<request id>
  ARGV[1]  one msgpack map (lib/codec.lua): token (the hold's token), wake (the queue's wake-up
           channel, or nil), message (what it publishes: ledger.release_message), answer_ttl

  Returns 1 when the hold was still in the ledger, else 0.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/answer.lua"

local a = decode_args(ARGV[1])
local kept = kept_answer(a)
if kept then
  return tonumber(kept)
end
local removed = rcall('ZREM', KEYS[a.k.ledger], a.token)
if a.wake then
  rcall('SPUBLISH', a.wake, a.message)
end
return keep_answer(a, removed)
