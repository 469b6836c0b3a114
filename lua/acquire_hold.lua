--[[
  Take one hold in a hold ledger, or report that the ledger is at capacity (QueueSlot.acquire,
  and a LimitedCapacityWorker job when it starts). Expired holds are purged first, under the
  server's clock. Replay-safe: a hold whose member is already live (a retried call whose reply
  was lost) is refreshed and answered 1 again, never counted twice.

  KEYS  by name (rq_policies/ops.py, built by rq_policies.ledger.acquire_call):
    ledger     the hold ledger      rq:policies:slots:<q> or rq:policies:lcw-running:<class>
                                    (ZSET, member = hold token, score = expiry, epoch s)
  ARGV[1]  one msgpack map (lib/codec.lua):
    capacity   the ledger's cap     live holds allowed at once, a positive integer
    token      the hold's token     names this hold (a claim token, or <host>:<pid>:<job id>)
    ttl        seconds              how long the hold lives unless refreshed

  Returns 1 when the caller now has the hold, 0 when the ledger is at capacity.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/outlive.lua"
-- @include "lib/ledger_count.lua"
-- @include "lib/ledger_add.lua"

local a = decode_args(ARGV[1])
local ledger = KEYS[a.k.ledger]
local now = server_now()
if not rcall('ZSCORE', ledger, a.token) and ledger_count(ledger, now) >= a.capacity then
  return 0
end
ledger_add(ledger, a.token, a.ttl, now)
return 1
