-- Shared: a pending job in rq's scheduled registry (a trailing or debounced job).
-- pending_at: is job `jid` still pending, its run time not yet reached? A job whose time has
-- come may be in the middle of rq's scheduler moving it to the queue, so it is never replaced or
-- dropped: only a job that cannot have been picked up yet is.
-- drop_pending: take such a job out of the registry and delete its hash, in that order, only
-- while it is still pending, and leave a tombstone (`tomb` .. jid, `tomb_ttl` seconds): rq's
-- scheduler reads due jobs by its own host's clock and writes them back to the queue in a second
-- step, so a host clock ahead of the server's can bring the deleted job back after this drop;
-- the fetch then finds the tombstone and drops that id. The tombstone names what superseded the
-- job, `policy` and job id `by` ("<policy> <id>"; "reset " for rq-policies reset), which
-- rq-policies explain reads; a job replaced by an enqueue of its own id is written again at once
-- and leaves none (it would drop itself). Returns 1 when it was dropped.
local function pending_at(registry, jid, now)
  if not jid then return false end
  local score = redis.call('ZSCORE', registry, jid)
  return score and tonumber(score) > now
end

local function drop_pending(registry, job_prefix, jid, now, tomb, tomb_ttl, policy, by)
  if not pending_at(registry, jid, now) then return 0 end
  redis.call('ZREM', registry, jid)
  redis.call('DEL', job_prefix .. jid)
  if tomb and by ~= jid then
    redis.call('SET', tomb .. jid, (policy or 'reset') .. ' ' .. (by or ''), 'EX', tomb_ttl)
  end
  return 1
end
