--[[
  Policy part: fair (Fair: weighted fair share of a queue's starts among the keys with waiting
  jobs, by virtual time; priority within a key; per-key pause and backlog cap). Included by the
  framework scripts through `-- @policies`; defines functions only.

  A Fair job waits in its key's line, not on its queue's list: status deferred, in rq's deferred
  registry of its queue (stock rq reads it as it reads a parked per-key job), its id in
    wait    rq:policies:fair:wait:<queue>:<scope>:<key>  ZSET id -> -priority * 2^40 + seq
            (higher priority first, FIFO among equals: seq counts the line's admissions,
            rq:policies:fair:seq:<queue>:<scope>:<key>, gone with the line's last job)
  and the key, while it has waiting jobs and is not paused, in its queue's
    active  rq:policies:fair:active:<queue>  ZSET '<scope>:<key>' -> the key's virtual time
  A start moves the key's virtual time on by 1 / weight (the weight set at run time,
  rq:policies:fair:weights '<scope>:<key>' -> weight, else the one the job declares); the key
  with the lowest virtual time starts next (ties: by name). A key that becomes active (its first
  waiting job, a resume) starts at the lowest virtual time of the queue's active keys (0 when none
  is): an idle key earns no credit, and a newcomer's first job starts within one round. A start
  costs O(log keys) (ZRANGE 0 0, ZPOPMIN, ZADD), whatever the number of keys or waiting jobs.
  Pause: rq:policies:fair:paused (HASH '<scope>:<key>' -> 1). A paused key's jobs stay in its
  lines; the key leaves each queue's active set when a fetch meets it there or an admission finds
  it paused, and the queue is noted in rq:policies:fair:pausedin:<scope>:<key> (SET), which
  lua/fair_pause.lua's resume reads to make the key active again.

  Admission (lua/admit.lua; p = Fair.admit_part's arguments; keys fair.wait, fair.active,
  fair.paused, fair.pausedin, fair.seq, fair.deferred):
    check(ctx, p)   a job written to its queue now (mode R or L) whose key already has
                    p.max_waiting jobs waiting is dropped ({who = the key's first job, n = the
                    count}); a scheduled or dependent job is not Fair's until it runs (it joins
                    its queue directly when rq releases it)
    commit(ctx, p)  plans the hash-only write (ctx.mode 'D'); force likewise
    written(ctx, p) files the written job in its key's line (status deferred, rq's deferred
                    registry), activates the key unless paused, wakes the queue's idle workers
  Fetch (lua/fetch.lua; keys fair.active: a key list, queue i's active ZSET; the
  prefixes rq:policies:fair:wait:, :seq:, :pausedin:, named fair.waits, fair.seqs, fair.pausedins;
  fair.weights; fair.paused):
    source(ctx, i)  asked when queue i's list is empty: the first job of the active key with the
                    lowest virtual time, status queued, out of the deferred registry; the key's
                    virtual time moves on (or it leaves the active set with its last job); a
                    paused key met there leaves the active set. An
                    id whose job is gone or no longer waits (deleted, cancelled) is dropped
                    without a charge, at most 10 a call.
    admit_job(ctx, jid, value)  (its field, `policies_fair`, declared) a Fair job popped off the
                    list instead (handed back by lua/hand_back.lua after its taker died, requeued
                    by rq) is filed again in its key's line, first among its priority, under the
                    key's pause: {filed = true}; the one source handed over (ctx.sourced) runs
  Replays: an admission's replay is answered by admit.lua before any part runs; a fetch's by its
  claim record.
]]
-- @include "lib/keys.lua"
P.fair = {fields = {'policies_fair'}}

-- The queue's virtual time now: the lowest of its active keys' (0 when none is active).
local function fair_floor(active)
  local first = redis.call('ZRANGE', active, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) or 0
end

function P.fair.check(ctx, p)
  if not p.key_id or (ctx.mode ~= 'R' and ctx.mode ~= 'L') or not p.max_waiting then
    return nil
  end
  local wait = ctx.key('fair.wait')
  local count = redis.call('ZCARD', wait)
  if count >= p.max_waiting then
    local head = redis.call('ZRANGE', wait, 0, 0)
    return {who = head[1] or '', n = count}
  end
  return nil
end

function P.fair.commit(ctx, p)
  if p.key_id and (ctx.mode == 'R' or ctx.mode == 'L') then
    ctx.mode = 'D' -- the hash only: written() files the job in its key's line
    ctx.fair = true
  end
end

P.fair.force = P.fair.commit

function P.fair.written(ctx, p)
  if not ctx.fair then
    return
  end
  local job_key = ctx.key('job')
  redis.call('HSET', job_key, 'status', 'deferred')
  redis.call('ZADD', ctx.key('fair.deferred'), ctx.now, ctx.jid)
  local seq = redis.call('INCR', ctx.key('fair.seq'))
  redis.call('ZADD', ctx.key('fair.wait'), -p.priority * 1099511627776 + seq, ctx.jid)
  if redis.call('HEXISTS', ctx.key('fair.paused'), p.key_id) == 1 then
    redis.call('SADD', ctx.key('fair.pausedin'), p.queue)
  else
    local active = ctx.key('fair.active')
    if not redis.call('ZSCORE', active, p.key_id) then
      redis.call('ZADD', active, fair_floor(active), p.key_id)
    end
  end
  redis.call('SPUBLISH', p.wake, ctx.jid)
end

-- A Fair job met on its queue's list (handed back after its taker died before the start, requeued
-- by rq, retried by rq's cleanup) rather than handed over by source: filed again in its key's line,
-- first among its priority (its key already paid the turn that took it), under the key's pause.
function P.fair.admit_job(ctx, jid, value)
  local waits = ctx.key('fair.waits')
  if ctx.sourced == jid or not waits then
    return nil
  end
  local priority, key_id = string.match(value, '^%S+ (%S+) (.+)$')
  priority = tonumber(priority)
  if not priority then
    return nil -- not written by Fair (which validates): run as it is rather than lost
  end
  local queue = ctx.names[ctx.i]
  redis.call('ZADD', key_of(waits, queue, key_id), -priority * 1099511627776, jid)
  if redis.call('HEXISTS', ctx.key('fair.paused'), key_id) == 1 then
    redis.call('SADD', key_of(ctx.key('fair.pausedins'), key_id), queue)
  else
    local active = ctx.key_at('fair.active', ctx.i)
    if not redis.call('ZSCORE', active, key_id) then
      redis.call('ZADD', active, fair_floor(active), key_id)
    end
  end
  return {filed = true}
end

function P.fair.source(ctx, i)
  local active = ctx.key_at('fair.active', i)
  local queue = ctx.names[i]
  for _ = 1, 10 do
    local top = redis.call('ZRANGE', active, 0, 0, 'WITHSCORES')
    local key_id, vt = top[1], tonumber(top[2])
    if not key_id then
      return nil
    end
    local wait = key_of(ctx.key('fair.waits'), queue, key_id)
    local jid, left
    if redis.call('HEXISTS', ctx.key('fair.paused'), key_id) == 1 then
      redis.call('ZREM', active, key_id) -- paused: its jobs wait until a resume makes it active
      redis.call('SADD', key_of(ctx.key('fair.pausedins'), key_id), queue)
    else
      jid = redis.call('ZPOPMIN', wait)[1]
      left = redis.call('ZCARD', wait)
    end
    if jid then
      local job_key = key_of(ctx.kp.job, jid)
      local job = redis.call('HMGET', job_key, 'status', 'origin', 'policies_fair')
      if job[1] == 'deferred' and job[2] == queue and job[3] then
        if left > 0 then
          local weight = tonumber(redis.call('HGET', ctx.key('fair.weights'), key_id))
            or tonumber(string.match(job[3], '^(%d+) ')) or 1
          redis.call('ZADD', active, vt + 1 / weight, key_id)
        else
          redis.call('ZREM', active, key_id)
          redis.call('DEL', key_of(ctx.key('fair.seqs'), queue, key_id))
        end
        redis.call('HSET', job_key, 'status', 'queued')
        redis.call('ZREM', key_of(ctx.kp.deferred, queue), jid)
        return jid
      end
    end
    if left == 0 then
      redis.call('ZREM', active, key_id)
      redis.call('DEL', key_of(ctx.key('fair.seqs'), queue, key_id))
    end
  end
  return nil
end
