-- Shared: extend hold `token` of `ledger` to `ttl` seconds from `now`. A refresh comes only from
-- the owner of a job that still runs, so a hold found lapsed (expired, removed, or gone with a
-- restart without persistence) is written again: the ledger must count every job that runs. The
-- re-added hold may put the ledger over its cap for a while; new fetches are refused until the
-- real count is under it again. Returns true when the hold was live, false when it had lapsed
-- and was re-added (the caller counts and logs that). Needs lib/outlive.lua.
local function ledger_refresh(ledger, token, ttl, now)
  local score = tonumber(redis.call('ZSCORE', ledger, token))
  redis.call('ZADD', ledger, now + ttl, token)
  outlive(ledger, ttl)
  return score ~= nil and score > now
end
