-- Shared: the live holds of a hold ledger (ZSET, member = hold token, score = epoch second the
-- hold expires), after purging the expired ones under the server's clock `now`: a killed
-- holder's hold stops counting by itself, with no reaper.
local function ledger_count(ledger, now)
  redis.call('ZREMRANGEBYSCORE', ledger, '-inf', now)
  return redis.call('ZCARD', ledger)
end
