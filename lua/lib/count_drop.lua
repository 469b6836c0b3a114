-- Shared: count one dropped enqueue of field `<policy>:<queue>`: in the all-time counter
-- (rq:policies:drops) and in the counter of the current minute of the server's clock
-- (`minute_prefix` .. epoch minute, a HASH), which expires an hour after its minute ends, so at
-- most 61 minute keys are ever live and the dashboard's last-hour chart reads them (bounded).
local function count_drop(total_key, minute_prefix, field, now)
  redis.call('HINCRBY', total_key, field, 1)
  local minute = math.floor(now / 60)
  local key = minute_prefix .. string.format('%d', minute)
  redis.call('HINCRBY', key, field, 1)
  redis.call('EXPIREAT', key, (minute + 61) * 60)
end
