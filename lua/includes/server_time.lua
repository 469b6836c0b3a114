-- Shared: the server's clock in seconds (with microseconds), so every producer and worker
-- agrees on "now" whatever its own clock says.
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
