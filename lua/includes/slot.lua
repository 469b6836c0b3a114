-- Shared: the epoch-aligned throttle slot the server clock is in. Slot number i covers
-- [i * width, (i + 1) * width) seconds since the Unix epoch, so every producer means the same
-- slot whatever its own clock says. A slot key is the identity's prefix plus the slot number:
-- the number comes from the server clock, so it cannot arrive in KEYS.
local function slot_at(now, width)
  local index = math.floor(now / width)
  return index, (index + 1) * width
end

local function slot_key(prefix, index)
  return prefix .. string.format('%d', index)
end

-- Set `key` to `value` until epoch second `until_s` (never less than 1 ms), so a slot key or a
-- pending-job pointer expires by itself when it stops meaning anything: no reaper.
local function set_until(key, value, until_s, now)
  local ms = math.ceil((until_s - now) * 1000)
  if ms < 1 then ms = 1 end
  redis.call('SET', key, value, 'PX', ms)
end

-- Is job `jid` still pending in the scheduled registry, with its run time not yet reached? A job
-- whose time has come may be in the middle of rq's scheduler moving it to the queue, so it is
-- never replaced or dropped: only a job that cannot have been picked up yet is.
local function pending_at(registry, jid, now)
  if not jid then return false end
  local score = redis.call('ZSCORE', registry, jid)
  return score and tonumber(score) > now
end

-- Drop a pending job that is being superseded or reset: out of the scheduled registry and its
-- hash deleted, in that order, only when it is still pending. Returns 1 when it was dropped.
local function drop_pending(registry, job_prefix, jid, now)
  if not pending_at(registry, jid, now) then return 0 end
  redis.call('ZREM', registry, jid)
  redis.call('DEL', job_prefix .. jid)
  return 1
end

-- The job hash was built as a queued job; an extra that waits for its run time is a scheduled
-- one, exactly as rq's schedule_job writes it (no enqueued_at until the scheduler moves it).
local function mark_scheduled(job_key)
  redis.call('HSET', job_key, 'status', 'scheduled')
  redis.call('HDEL', job_key, 'enqueued_at')
end

local function format_now(now)
  return string.format('%.6f', now)
end
