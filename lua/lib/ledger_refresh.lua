-- Shared: extend hold `token` of `ledger` to `ttl` seconds from `now`, only while it is still
-- live: a lapsed hold's capacity may already be someone else's, and reviving it would run the
-- ledger over its cap. Returns true when the hold was live and is extended. Needs lib/outlive.lua.
local function ledger_refresh(ledger, token, ttl, now)
  local score = tonumber(redis.call('ZSCORE', ledger, token))
  if not score or score <= now then
    return false
  end
  redis.call('ZADD', ledger, 'XX', now + ttl, token)
  outlive(ledger, ttl)
  return true
end
