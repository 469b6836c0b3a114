-- Shared: write hold `token` into `ledger`, live `ttl` seconds from the server's clock `now`
-- (a member already there is refreshed, never counted twice), and keep the key alive at least
-- as long (lib/outlive.lua, which the including script includes too).
local function ledger_add(ledger, token, ttl, now)
  redis.call('ZADD', ledger, now + ttl, token)
  outlive(ledger, ttl)
end
