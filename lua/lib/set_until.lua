-- Shared: set `key` to `value` until epoch second `until_s` (never less than 1 ms), so a window
-- key or a pending-job pointer expires by itself when it stops meaning anything: no reaper.
local function set_until(key, value, until_s, now)
  local ms = math.ceil((until_s - now) * 1000)
  if ms < 1 then ms = 1 end
  redis.call('SET', key, value, 'PX', ms)
end
