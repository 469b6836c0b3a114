-- Shared: count one dropped enqueue of field `<policy>:<queue>`: in the all-time counter
-- (rq:policies:drops) and in the counter of the current minute of the server's clock
-- (`minute_prefix` .. epoch minute, a HASH), which expires an hour after its minute ends, so at
-- most 61 minute keys are ever live and the dashboard's last-hour chart reads them (bounded).
-- `now` is 0 when the script skipped the clock (every declared policy said `clock = false`):
-- the drop then reads it, so only a drop pays for it.
-- @include "lib/server_time.lua"
-- @include "lib/keys.lua"
local function count_drop(total_key, minute_prefix, field, now)
  redis.call('HINCRBY', total_key, field, 1)
  if now == 0 then
    now = server_now()
  end
  local minute = math.floor(now / 60)
  local key = key_num(minute_prefix, minute)
  -- The field's first count of the minute sets the key's expiry (a new key's field always starts at 1,
  -- and every count goes through here): later drops of the minute skip the EXPIREAT.
  if redis.call('HINCRBY', key, field, 1) == 1 then
    redis.call('EXPIREAT', key, (minute + 61) * 60)
  end
end
