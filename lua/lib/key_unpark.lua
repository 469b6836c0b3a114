-- Shared (per-key policies): the parked lists of a key (rq:policies:keyparked:<policy>:<scope>:<key>).
-- `kp` is the per-key prefixes map (rq_policies.concurrency.keyed_args: job, queue, deferred, wake).

-- @include "lib/keys.lua"
-- @include "lib/key_blocked.lua"

-- The id at the head of parked list `parked` whose job is still parked (status deferred), after
-- dropping ids whose job is gone or no longer parked (deleted, cancelled meanwhile); at most 10
-- are dropped per call, so a list of stale ids cannot stall the server (the rest go next time).
-- Returns the id and the job's `field` (nil when the list has no parked job at its head).
local function key_parked_head(kp, parked, field)
  for _ = 1, 10 do
    local jid = redis.call('LINDEX', parked, 0)
    if not jid then
      return nil
    end
    local job = redis.call('HMGET', key_of(kp.job, jid), 'status', 'origin', field)
    if job[1] == 'deferred' and job[2] then
      return jid, job[3]
    end
    redis.call('LPOP', parked)
  end
  return nil
end

-- Give the head jobs of `parked` back to their queues, `n` at most (each found live by
-- key_parked_head, reading the policy's job `field`), at the front and in their parked order (they were
-- refused before every later job of their key), status queued, out of rq's deferred registry,
-- and wake each queue's idle PolicyWorkers. `each(jid)` runs for every job moved (a reservation);
-- `fits(jid, raw)`, when given, is asked before each head job moves (with its `field`), and a false
-- answer stops the moves there. `ctx` is the caller's (its per-key prefixes `ctx.kp`); when it has
-- a list `ctx.moved` (the fetch's due phase), each job moved is added to it as {jid, origin} (the
-- fetch reports it: `unparked`). Returns how many were moved.
local function key_unpark(ctx, parked, n, field, each, fits)
  local kp = ctx.kp
  local moved = {}
  while #moved < n do
    local head, raw = key_parked_head(kp, parked, field)
    if not head or (fits and not fits(head, raw)) then
      break
    end
    local jid = redis.call('LPOP', parked)
    local job_key = key_of(kp.job, jid)
    local origin = redis.call('HGET', job_key, 'origin')
    redis.call('HSET', job_key, 'status', 'queued')
    redis.call('ZREM', key_of(kp.deferred, origin), jid)
    each(jid)
    moved[#moved + 1] = {jid, origin}
    if ctx.moved then
      ctx.moved[#ctx.moved + 1] = moved[#moved]
    end
  end
  local woken = {}
  for i = #moved, 1, -1 do
    local jid, origin = moved[i][1], moved[i][2]
    redis.call('LPUSH', key_of(kp.queue, origin), jid)
    if not woken[origin] then
      woken[origin] = true
      redis.call('SPUBLISH', key_of(kp.wake, origin), 'released')
    end
  end
  return #moved
end

-- The start of a per-key policy's `due(ctx, key_id)`, shared by every such policy: the parked
-- list of `policy` of the key `key_id`, and its live head's `policies_<policy>` field. `stop` says
-- the due function answers `due` at once: the key is backed off (until `due`), or its list has no
-- live head (`due` is now while stale ids are left, for the next fetch to go on; nil when the list
-- is empty).
local function key_due_start(ctx, policy, key_id)
  local parked = key_of(ctx.kp.parked, policy, key_id)
  local head, raw = key_parked_head(ctx.kp, parked, 'policies_' .. policy)
  if not head then
    return parked, nil, true, redis.call('LLEN', parked) > 0 and ctx.now or nil
  end
  local blocked = key_blocked(ctx.kp, key_id, ctx.now)
  if blocked then
    return parked, raw, true, blocked
  end
  return parked, raw, false, nil
end
