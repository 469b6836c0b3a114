-- Shared (QueueRate, Rate): a rate of one window or several, each a GCRA (emission interval
-- T = per / limit, tolerance (burst - 1) * T). A rate is stored (on a job hash, in the settings
-- hashes) as '<limits> <pers> <bursts>', each word a comma-separated list of integers with one
-- entry per window, shortest period first: '5 1 2' is one window, as before windows existed;
-- '3,5 1,10 3,5' is two. A start is allowed when every window allows one, and it moves every
-- window's arrival time on: a refusal by one window consumes nothing of another (nothing is
-- written until the start is taken).
--
-- A rate's arrival times live in one STRING, expiring once the last of them is past:
--   one window   '<tat> <interval>'                      (lib/rate_tat.lua, as before windows)
--   several      '<tat> <interval> <per>' for each window, space-separated
-- Each is read under its window's current interval (lib/rate_tat.lua: the starts owed keep
-- their count at a changed rate). A window reads the entry of its own period; the one-window
-- layout counts for every window (a change from one window to several grants no fresh burst),
-- and a window whose period has no entry owes nothing.
-- @include "lib/rate_tat.lua"

-- The windows of a stored rate ({per = '<per>' as stored, interval, tolerance} each), or nil
-- when its three lists do not make one (not written by rq-policies, which validates).
local function rate_windows(limits, pers, bursts)
  if not string.find(limits, ',', 1, true) then -- one window: the common case, no iterators
    local limit, per, burst = tonumber(limits), tonumber(pers), tonumber(bursts)
    if not (limit and per and burst) or limit < 1 then
      return nil
    end
    local interval = per / limit
    return {{per = pers, interval = interval, tolerance = (burst - 1) * interval}}
  end
  local windows = {}
  local next_per, next_burst = string.gmatch(pers, '[^,]+'), string.gmatch(bursts, '[^,]+')
  for l in string.gmatch(limits, '[^,]+') do
    local p, b = next_per(), next_burst()
    local limit, per, burst = tonumber(l), tonumber(p), tonumber(b)
    if not (limit and per and burst) or limit < 1 then
      return nil
    end
    local interval = per / limit
    windows[#windows + 1] = {per = p, interval = interval, tolerance = (burst - 1) * interval}
  end
  if next_per() or next_burst() then
    return nil
  end
  return windows
end

-- Each window's arrival time now (>= now), from the stored string `raw` (nil: none).
local function rate_tats(raw, windows, now)
  local tats = {}
  local space = raw and string.find(raw, ' ', 1, true)
  if space and string.find(raw, ' ', space + 1, true) then -- several windows' layout
    local stored = {}
    for tat, interval, per in string.gmatch(raw, '(%S+) (%S+) (%S+)') do
      stored[per] = tat .. ' ' .. interval
    end
    for i = 1, #windows do
      tats[i] = rate_tat(stored[windows[i].per], windows[i].interval, now)
    end
    return tats
  end
  for i = 1, #windows do -- the one-window layout (or none) counts for every window
    tats[i] = rate_tat(raw, windows[i].interval, now)
  end
  return tats
end

-- The server time the rate next allows a start (<= now: now), and the index of the window that
-- decides it (the one allowing it last).
local function rate_allowed_at(windows, tats)
  local at, held = tats[1] - windows[1].tolerance, 1
  for i = 2, #windows do
    local t = tats[i] - windows[i].tolerance
    if t > at then
      at, held = t, i
    end
  end
  return at, held
end

-- A start of `cost` units: every window's arrival time moves on by cost x its interval.
local function rate_take(windows, tats, cost)
  for i = 1, #windows do
    tats[i] = tats[i] + cost * windows[i].interval
  end
end

-- Store the arrival times in `key`, expiring once the last is past (at least 1 ms).
local function rate_store(key, windows, tats, now)
  local value, last
  if #windows == 1 then
    value, last = string.format('%.6f %.17g', tats[1], windows[1].interval), tats[1]
  else
    local parts = {}
    last = tats[1]
    for i, w in ipairs(windows) do
      parts[i] = string.format('%.6f %.17g %s', tats[i], w.interval, w.per)
      last = math.max(last, tats[i])
    end
    value = table.concat(parts, ' ')
  end
  local ms = math.ceil((last - now) * 1000)
  redis.call('SET', key, value, 'PX', math.max(ms, 1))
end
