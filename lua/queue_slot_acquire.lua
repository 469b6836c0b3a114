--[[
  Take one of a queue's slots, or report that the cluster is at capacity (QueueSlot.acquire).

  Expired holds are purged first, under the server's clock. Replay-safe: a holder whose member is
  already live (a retried call whose reply was lost) is refreshed and answered 1 again, never
  counted twice.

  KEYS[1]  slot ledger     rq:policies:slots:<q>  (ZSET member = holder, score = expiry epoch s)
  ARGV[1]  capacity        cluster-wide cap, a positive integer
  ARGV[2]  holder token    names this hold
  ARGV[3]  ttl             seconds the hold lives unless refreshed

  Returns 1 when the caller now holds a slot, 0 when the queue is at capacity.
]]
local rcall = redis.call
local capacity = tonumber(ARGV[1])
local token = ARGV[2]
local ttl = tonumber(ARGV[3])

-- @include "includes/server_time.lua"
-- @include "includes/outlive.lua"

local now = server_now()
rcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not rcall('ZSCORE', KEYS[1], token) and rcall('ZCARD', KEYS[1]) >= capacity then
  return 0
end
rcall('ZADD', KEYS[1], now + ttl, token)
outlive(KEYS[1], ttl)
return 1
