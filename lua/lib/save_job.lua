-- Shared: write an admitted job exactly as rq's own enqueue would, so that rq, rq-dashboard and
-- stock workers read it unchanged, and wake idle PolicyWorkers when it was pushed. `fields` is a
-- flat field/value list from Job.to_dict(); `mode` is "R" (push to the tail), "L" (push to the
-- head), "S" (add to the scheduled registry at `score`), or "D" (hash only: the caller completes
-- a deferred enqueue through rq). `ttl` > 0 expires the hash like Job.cleanup(ttl) does. `wake`
-- is the queue's wake-up channel (a shard channel: SPUBLISH, in the slot of every key here), given
-- the job id on a push, or 'scheduled <score>' on a schedule (nil: no wake-up).
-- place_job is the same write after the hash (its HSET made by the caller: lua/admit_narrow.lua
-- sends the fields as its ARGV tail and writes them without copying them into a table).
local function place_job(job_key, dest_key, queues_key, queue_key, jid, mode, score, ttl, wake)
  if ttl > 0 then
    redis.call('EXPIRE', job_key, ttl)
  end
  if mode == 'R' then
    redis.call('RPUSH', dest_key, jid)
  elseif mode == 'L' then
    redis.call('LPUSH', dest_key, jid)
  elseif mode == 'S' then
    redis.call('ZADD', dest_key, score, jid)
  end
  redis.call('SADD', queues_key, queue_key)
  if wake and (mode == 'R' or mode == 'L') then
    redis.call('SPUBLISH', wake, jid)
  elseif wake and mode == 'S' then
    redis.call('SPUBLISH', wake, 'scheduled ' .. score) -- idle PolicyWorkers wake at its due time
  end
end

local function save_job(job_key, dest_key, queues_key, queue_key, jid, mode, score, ttl, fields, wake)
  redis.call('HSET', job_key, unpack(fields))
  place_job(job_key, dest_key, queues_key, queue_key, jid, mode, score, ttl, wake)
end
