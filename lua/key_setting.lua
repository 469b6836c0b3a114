--[[
  Change one key's setting at run time (Concurrency.set / clear: its limit; Rate.set / clear: its
  rate): the key's parked jobs are looked at by the next fetch (its due-index entry is set to
  now) and its queues' idle PolicyWorkers are woken, so a raised limit is used at once.

  KEYS  by name (rq_policies/ops.py, built by rq_policies.concurrency):
    limits     rq:policies:keylimits (Concurrency) or rq:policies:keyrates (Rate),
               HASH '<scope>:<key>' -> the setting
    parked     rq:policies:keyparked:<policy>:<scope>:<key>
    keydue     rq:policies:keydue
    answer     rq:policies:answer:<request id>: this call's answer (lib/answer.lua; a clear's,
               whose answer the caller reads)
  ARGV[1]  one msgpack map (lib/codec.lua): key_id ('<scope>:<key>', the key id), policy
    (concurrency or key_rate), value (the setting as stored, or '' to clear it), job_prefix
    (rq:job:), wake (rq:policies:wake:), answer_ttl (seconds the answer is kept)

  Returns 1 when an override was there before, else 0; a replay of a call with an answer key
  answers what its first run did and writes nothing.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/answer.lua"

local a = decode_args(ARGV[1])
local kept = kept_answer(a)
if kept then
  return tonumber(kept)
end
local limits = KEYS[a.k.limits]
local had = rcall('HEXISTS', limits, a.key_id)
if a.value ~= '' then
  rcall('HSET', limits, a.key_id, a.value)
else
  rcall('HDEL', limits, a.key_id)
end
local head = rcall('LINDEX', KEYS[a.k.parked], 0)
if head then
  rcall('ZADD', KEYS[a.k.keydue], server_now(), a.policy .. ':' .. a.key_id)
  local origin = rcall('HGET', a.job_prefix .. head, 'origin')
  if origin then
    rcall('SPUBLISH', a.wake .. origin, 'capacity')
  end
end
return keep_answer(a, had)
