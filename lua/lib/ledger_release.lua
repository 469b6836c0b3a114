-- Shared: give back hold `token` of `ledger`. It names one member only, so a release arriving
-- after its own hold lapsed frees nothing that someone else holds now. Returns 1 when the hold
-- was still in the ledger, else 0.
local function ledger_release(ledger, token)
  return redis.call('ZREM', ledger, token)
end
