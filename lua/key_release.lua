--[[
  Give back one per-key hold (Concurrency), and when the key has parked jobs, give the freed unit
  to the oldest of them: it goes back to the front of its queue with the unit reserved for it
  (see lua/policies/concurrency.lua), and its queue's idle PolicyWorkers are woken. Rides the
  worker's pipeline (its heartbeat) like a queue hold's bare ZREM does.

  Replay-safe: only a call that removed its own hold moves a parked job, so a replay (the hold
  already gone) moves nothing; a release arriving after its hold lapsed frees nothing either (the
  due index, which every fetch reads, gives the parked jobs of a key whose hold expired back).

  KEYS  by name (rq_policies/ops.py, built by rq_policies.concurrency.release_call):
    ledger     rq:policies:keyholds:<scope>:<key>   the key's hold ledger
    parked     rq:policies:keyparked:concurrency:<scope>:<key>   the key's parked jobs
    keydue     rq:policies:keydue                   the due index of keys with parked jobs
  ARGV[1]  one msgpack map (lib/codec.lua):
    token      the claim token naming the hold
    key_id     '<scope>:<key>' (the key id)
    ttl        seconds a reserved unit lives (the worker's hold ttl)
    keyed      the per-key prefixes (rq_policies.concurrency.keyed_args)

  Returns 1 when the hold was still in the ledger, else 0.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/keys.lua"

local a = decode_args(ARGV[1])
local P = {}
-- @include "policies/concurrency.lua"

local removed = rcall('ZREM', KEYS[a.k.ledger], a.token)
rcall('ZREM', key_of(a.keyed.units, a.key_id), a.token) -- its cost, if above 1 (Concurrency(cost=))
if removed == 1 then
  local member = 'concurrency:' .. a.key_id
  -- The parked list itself is asked, not the due index: a release also finds parked jobs whose
  -- due-index entry was lost (a failover to a replica that missed it).
  if rcall('EXISTS', KEYS[a.k.parked]) == 1 then
    local ctx = {now = server_now(), ttl = a.ttl, kp = a.keyed}
    local next_at = P.concurrency.due(ctx, a.key_id)
    if next_at then
      rcall('ZADD', KEYS[a.k.keydue], next_at, member)
    else
      rcall('ZREM', KEYS[a.k.keydue], member)
    end
  end
end
return removed
