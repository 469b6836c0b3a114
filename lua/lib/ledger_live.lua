-- Shared: how many holds of a ledger are live under the server's clock `now`, without writing:
-- one O(log n) read, so a look over many full queues costs one command each. The expired
-- members are purged where the ledger is written (a take, lib/ledger_count.lua).
local function ledger_live(ledger, now)
  return redis.call('ZCOUNT', ledger, string.format('(%.6f', now), '+inf')
end
