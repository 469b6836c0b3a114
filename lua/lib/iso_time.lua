-- Shared: a server time (epoch seconds, a float) as rq writes its timestamps (rq.utils.utcformat,
-- '%Y-%m-%dT%H:%M:%S.%fZ', UTC), for a job hash a script writes whole (Batch's batch job).
local function iso_time(t)
  local secs = math.floor(t)
  local micros = math.min(math.floor((t - secs) * 1000000 + 0.5), 999999)
  local days = math.floor(secs / 86400)
  local rest = secs - days * 86400
  -- civil_from_days (H. Hinnant's algorithm): the proleptic Gregorian date of day `days` since 1970-01-01
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%06dZ', y, m, d, math.floor(rest / 3600),
    math.floor(rest % 3600 / 60), rest % 60, micros)
end
