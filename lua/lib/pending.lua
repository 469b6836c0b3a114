-- Shared: a pending job in rq's scheduled registry (a trailing or debounced job).
-- pending_at: is job `jid` still pending, its run time not yet reached? A job whose time has
-- come may be in the middle of rq's scheduler moving it to the queue, so it is never replaced or
-- dropped: only a job that cannot have been picked up yet is.
-- drop_pending: take such a job out of the registry and delete its hash, in that order, only
-- while it is still pending. Returns 1 when it was dropped.
local function pending_at(registry, jid, now)
  if not jid then return false end
  local score = redis.call('ZSCORE', registry, jid)
  return score and tonumber(score) > now
end

local function drop_pending(registry, job_prefix, jid, now)
  if not pending_at(registry, jid, now) then return 0 end
  redis.call('ZREM', registry, jid)
  redis.call('DEL', job_prefix .. jid)
  return 1
end
