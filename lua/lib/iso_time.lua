-- Shared: rq's utcformat ('%Y-%m-%dT%H:%M:%S.%fZ', UTC) of epoch seconds `t` (a server time), as rq writes
-- its timestamps (rq.utils.utcformat): the promotion's enqueued_at (lib/promote.lua) and a job hash a script writes
-- whole (Batch's batch job, lua/policies/batch.lua). The civil date from the day count (H. Hinnant's
-- civil_from_days); microseconds rounded, carried into the second.
local function rq_utcformat(t)
  local secs = math.floor(t)
  local micros = math.floor((t - secs) * 1000000 + 0.5)
  if micros >= 1000000 then
    secs, micros = secs + 1, micros - 1000000
  end
  local days = math.floor(secs / 86400)
  local rem = secs - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local y = yoe + era * 400
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  if m <= 2 then y = y + 1 end
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%06dZ', y, m, d, math.floor(rem / 3600),
    math.floor(rem % 3600 / 60), rem % 60, micros)
end
