-- Shared: the server's clock in seconds (with microseconds), so every producer and worker
-- agrees on "now" whatever its own clock says; format_now is how a script reports it.
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function format_now(now)
  return string.format('%.6f', now)
end
