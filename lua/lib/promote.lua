-- Shared: promote due jobs of rq's scheduled registries (rq:scheduled:<q>, score = epoch seconds)
-- onto their queues, by the server's clock, as rq's scheduler does (RQScheduler.enqueue_scheduled_jobs
-- through Queue._enqueue_job): status queued, enqueued_at now, origin, timeout (the queue default
-- when the job has none), the job's ttl applied (Job.cleanup), out of the deferred registry if it
-- was deferred, pushed to the tail (or the head: Job.should_enqueue_at_front), out of the
-- registry; and the queue in rq:queues, where schedule_job put it. A due id whose hash is gone is
-- only taken out of the registry, as rq's scheduler does.
--
-- Who promotes: rq's schedulers share a queue through its lock, rq:scheduler-lock:<q> (value: the
-- scheduler's name, refreshed to interval + 60 s every interval while it lives). Promotion joins
-- that protocol, so a job is promoted once even with rq's scheduler running beside the workers:
-- a queue whose lock a live scheduler holds is left to it; otherwise the lock is taken (value
-- `owner`, `lock_ttl` s) and the due jobs are promoted here. Among PolicyWorkers the ZREM (in the
-- same atomic script) is the arbiter. A scheduler's lock not refreshed for `stale` seconds (its
-- remaining ttl below 60 - stale: the scheduler died, as it does on a connection error) is taken
-- over: its heartbeat, which comes before its next enqueue pass, finds the lock taken and drops
-- the queue.
--
-- A job under rq 3's RateLimit (fields rate_limit_key and rate_limit_concurrency) goes through
-- rq's rate-limit registry when its scheduler enqueues it; promotion leaves such a job in the
-- registry (`rate_limited` set), for rq's scheduler, and looks past it.
-- @include "lib/keys.lua"
-- @include "lib/iso_time.lua"

local PROMOTE_FIELDS = {'status', 'timeout', 'ttl', 'enqueue_at_front', 'enqueue_at_front_on_retry', 'ended_at',
                        'rate_limit_key', 'rate_limit_concurrency'}

-- May this fetch promote queue `name`'s due jobs (lock key `lock`)? Takes the lock when it may.
-- Returns true, or the server time the holder's lock turns stale.
local function promote_lock(lock, pr, now)
  local holder = redis.call('GET', lock)
  if holder and holder ~= pr.owner then
    local left = redis.call('PTTL', lock) / 1000
    if left > 60 - pr.stale then
      return now + left - (60 - pr.stale)
    end
  elseif holder and redis.call('PTTL', lock) / 1000 > pr.lock_ttl - pr.refresh then
    return true -- ours, refreshed lately
  end
  redis.call('SET', lock, pr.owner, 'EX', pr.lock_ttl)
  return true
end

-- Promote one due id of queue `name` (list `queue_key`) out of `registry`: 1 promoted, 0 gone,
-- false left in the registry (rate-limited).
local function promote_one(registry, queue_key, name, job_prefix, jid, pr, stamp)
  local job_key = key_of(job_prefix, jid)
  local f = redis.call('HMGET', job_key, unpack(PROMOTE_FIELDS))
  if not f[1] then
    if redis.call('EXISTS', job_key) == 0 then
      redis.call('ZREM', registry, jid)
      return 0
    end
  end
  if pr.rate_limited and f[7] and f[7] ~= '' and f[8] and f[8] ~= '' and f[8] ~= '0' then
    return false
  end
  redis.call('ZREM', registry, jid)
  if f[1] == 'deferred' then
    redis.call('ZREM', key_of(pr.deferred, name), jid)
  end
  if f[2] then
    redis.call('HSET', job_key, 'status', 'queued', 'enqueued_at', stamp, 'origin', name)
  else
    redis.call('HSET', job_key, 'status', 'queued', 'enqueued_at', stamp, 'origin', name, 'timeout', pr.timeout)
  end
  local ttl = tonumber(f[3])
  if ttl and ttl > 0 then
    redis.call('EXPIRE', job_key, ttl)
    redis.call('EXPIRE', key_of(job_prefix, jid, 'dependents'), ttl)
    redis.call('EXPIRE', rq_dependencies_key(job_prefix, jid), ttl)
  end
  local at_front = (f[5] and f[5] ~= '' and f[5] ~= '0' and f[6] and f[6] ~= '') or (f[4] and f[4] ~= '' and f[4] ~= '0')
  redis.call(at_front and 'LPUSH' or 'RPUSH', queue_key, jid)
  return 1
end

-- Promote up to pr.batch due jobs, oldest first, over the queues in order. Returns how many were
-- promoted, and per queue index, how many of queue i's (absent: none).
local function promote_due(names, queue_at, registry_at, lock_at, job_prefix, pr, now)
  local budget = pr.batch
  local stamp
  local promoted = 0
  local by_queue = {}
  local now_s = string.format('%.6f', now)
  for i = 1, #names do
    if budget <= 0 then break end
    local registry = registry_at(i)
    local due = redis.call('ZRANGEBYSCORE', registry, '-inf', now_s, 'LIMIT', 0, budget)
    if #due > 0 and promote_lock(lock_at(i), pr, now) == true then
      stamp = stamp or rq_utcformat(now)
      local before = promoted
      local skipped, windows = 0, 0
      while #due > 0 and windows < 3 do
        windows = windows + 1
        for _, jid in ipairs(due) do
          local got = promote_one(registry, queue_at(i), names[i], job_prefix, jid, pr, stamp)
          if got == false then
            skipped = skipped + 1
          else
            budget = budget - 1
            promoted = promoted + got
          end
        end
        if budget <= 0 or skipped == 0 then break end
        due = redis.call('ZRANGEBYSCORE', registry, '-inf', now_s, 'LIMIT', skipped, budget)
      end
      if promoted > before then
        by_queue[i] = promoted - before
      end
      if promoted > 0 then
        redis.call('SADD', pr.queues_set, queue_at(i))
      end
      if skipped > 0 and redis.call('GET', lock_at(i)) == pr.owner then
        redis.call('DEL', lock_at(i)) -- rate-limited jobs wait for rq's scheduler: let it take the lock
      end
    end
  end
  return promoted, by_queue
end

-- When an idle worker should look again for queue i's scheduled jobs: the registry's earliest
-- score, now when one is due (a bounded batch left some), or, for a queue a live scheduler
-- promotes, the time its lock turns stale. nil when the registry is empty.
local function promote_next(registry, lock, pr, now)
  local head = redis.call('ZRANGE', registry, 0, 0, 'WITHSCORES')
  local at = tonumber(head[2])
  if not at then return nil end
  local holder = redis.call('GET', lock)
  if holder and holder ~= pr.owner then
    local left = redis.call('PTTL', lock) / 1000
    local stale_at = now + math.max(left - (60 - pr.stale), 0)
    if stale_at > at then at = stale_at end
  end
  if at <= now then
    -- still due after this fetch's promotion (its batch ran out while the queue is gated, or a
    -- rate-limited job waits for rq's scheduler): look again in a second, rq's scheduler's pace
    at = now + 1
  end
  return at
end
