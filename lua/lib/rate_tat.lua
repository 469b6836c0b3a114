-- Shared (QueueRate, Rate): a GCRA's arrival time, stored as '<tat> <interval it was reached
-- at>' (epoch s, s), read under the current interval: the starts still owed keep their count and are paid at the new rate, so a
-- changed rate applies from the next fetch on, and the change alone grants no fresh burst.
local function rate_tat(raw, interval, now)
  if not raw then
    return now
  end
  local tat, was = string.match(raw, '^(%S+) (%S+)$')
  tat, was = tonumber(tat), tonumber(was)
  if not tat or tat <= now then
    return now
  end
  if was and was > 0 and was ~= interval then
    tat = now + (tat - now) / was * interval
  end
  return tat
end
