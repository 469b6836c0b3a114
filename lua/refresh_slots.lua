--[[
  Refresh every hold one process has, on the heartbeat it was sending anyway (QueueSlot.refresh_in).

  A hold that already expired is not revived (ZADD XX on a member that is still live only): its
  capacity may already have been handed to someone else, and reviving it would run the queue
  over its cap.

  KEYS[i]    slot ledger of hold i     rq:policies:slots:<q>
  ARGV[1]    ttl                       seconds each hold lives from now
  ARGV[1+i]  holder token of hold i

  Returns the number of holds refreshed.
]]
local rcall = redis.call
local ttl = tonumber(ARGV[1])

-- @include "includes/server_time.lua"
-- @include "includes/outlive.lua"

local now = server_now()
local refreshed = 0
for i = 1, #KEYS do
  local score = tonumber(rcall('ZSCORE', KEYS[i], ARGV[1 + i]))
  if score and score > now then
    rcall('ZADD', KEYS[i], 'XX', now + ttl, ARGV[1 + i])
    outlive(KEYS[i], ttl)
    refreshed = refreshed + 1
  end
end
return refreshed
