--[[
  Policy part: concurrency (Concurrency: at most N jobs of one key running at once, cluster-wide;
  a per-job policy, declared on the job's function). Included by the framework scripts through
  `-- @policies`, and by lua/key_release.lua; defines functions only.

  The job hash carries the policy (field policies_concurrency = '<limit> <scope>:<key>', written
  at enqueue), so a worker needs no import of the job's function to enforce it. Keys are built
  from the prefixes in ctx.kp (rq_policies.concurrency.keyed_args), '<scope>:<key>' appended:
    holds   rq:policies:keyholds:<scope>:<key>   ZSET hold ledger (QueueSlot's model: member =
                                                  claim token, score = expiry, server clock);
                                                  a member 'unpark:<job id>' is the unit reserved
                                                  for a job given back to its queue, until a
                                                  worker takes it (at most ctx.ttl seconds)
    parked  rq:policies:keyparked:concurrency:<scope>:<key>   LIST of parked job ids, FIFO
    limits  rq:policies:keylimits   HASH '<scope>:<key>' -> a limit set at run time (override)
    block   rq:policies:keyblock:<scope>:<key>    a BackOff(key=True) (lib/key_blocked.lua)

  Hooks of a per-job part (lua/fetch.lua calls them for a popped job carrying the field):
    admit_job(ctx, jid, raw) -> nil: allowed (state for take_job in ctx.kj.concurrency); or a
      refusal {parked = list key, member = due-index member, due = server time the key could
      free, head = park at the head: a job given back keeps its place} (check only: nothing
      written; a reservation of this very job is dropped by refused())
    take_job(ctx, jid, raw)  -> the ledger key the claim's hold was added to
    refused(ctx, jid, raw)   -> the job is parked (by this part or another): its reservation, if
      any, goes, and the key is due now (its next parked job may use the unit)
    due(ctx, channel)        -> the key's entry in the due index came due: give parked jobs back
      while units are free (each with a reservation), at most 10 per call; returns the next
      time to look (nil: no parked job left)
]]
-- @include "lib/outlive.lua"
-- @include "lib/ledger_live.lua"
-- @include "lib/ledger_add.lua"
-- @include "lib/key_blocked.lua"
-- @include "lib/key_unpark.lua"
P.concurrency = {fields = {'policies_concurrency'}}

local function cc_parse(raw)
  local limit, channel = string.match(raw, '^(%d+) (.+)$')
  return tonumber(limit), channel
end

local function cc_limit(ctx, channel, declared)
  return tonumber(redis.call('HGET', ctx.kp.limits, channel)) or declared
end

-- The time the earliest live hold of `ledger` expires (the key could free then), else now.
local function cc_first_expiry(ledger, now)
  local first = redis.call('ZRANGEBYSCORE', ledger, string.format('(%.6f', now), '+inf', 'WITHSCORES',
    'LIMIT', 0, 1)
  return tonumber(first[2]) or now
end

function P.concurrency.admit_job(ctx, jid, raw)
  local limit, channel = cc_parse(raw)
  if not limit then
    return nil -- not written by Concurrency (which validates): ignored rather than blocking forever
  end
  local parked = ctx.kp.parked .. 'concurrency:' .. channel
  local member = 'concurrency:' .. channel
  local blocked = key_blocked(ctx.kp, channel, ctx.now)
  local ledger = ctx.kp.holds .. channel
  local mine = redis.call('ZSCORE', ledger, 'unpark:' .. jid)
  if blocked then
    return {parked = parked, member = member, due = blocked, head = mine and true or false}
  end
  limit = cc_limit(ctx, channel, limit)
  local others = ledger_live(ledger, ctx.now)
  if mine and tonumber(mine) > ctx.now then
    others = others - 1
  end
  -- A job that was not given back by an unpark waits behind the key's parked jobs (FIFO per key).
  if others < limit and (mine or redis.call('LLEN', parked) == 0) then
    return nil
  end
  local due = others < limit and ctx.now or cc_first_expiry(ledger, ctx.now)
  return {parked = parked, member = member, due = due, head = mine and true or false}
end

function P.concurrency.take_job(ctx, jid, raw)
  local _, channel = cc_parse(raw)
  local ledger = ctx.kp.holds .. channel
  redis.call('ZREM', ledger, 'unpark:' .. jid)
  redis.call('ZREMRANGEBYSCORE', ledger, '-inf', ctx.now)
  ledger_add(ledger, ctx.token, ctx.ttl, ctx.now)
  return ledger
end

function P.concurrency.refused(ctx, jid, raw)
  local _, channel = cc_parse(raw)
  if channel and redis.call('ZREM', ctx.kp.holds .. channel, 'unpark:' .. jid) == 1 then
    -- the unit reserved for this job is free again: the key's next parked job may use it
    redis.call('ZADD', ctx.kp.due, ctx.now, 'concurrency:' .. channel)
  end
end

function P.concurrency.due(ctx, channel)
  local parked, raw, stop, due = key_due_start(ctx, 'concurrency', channel)
  if stop then
    return due
  end
  local ledger = ctx.kp.holds .. channel
  redis.call('ZREMRANGEBYSCORE', ledger, '-inf', ctx.now)
  local room = cc_limit(ctx, channel, cc_parse(raw or '') or 1) - redis.call('ZCARD', ledger)
  local moved = key_unpark(ctx.kp, parked, math.min(room, 10), 'policies_concurrency', function(jid)
    ledger_add(ledger, 'unpark:' .. jid, ctx.ttl, ctx.now)
  end)
  if redis.call('LLEN', parked) == 0 then
    return nil
  end
  if moved < room then
    return ctx.now -- stale ids or the per-call bound stopped it: the next fetch goes on
  end
  return cc_first_expiry(ledger, ctx.now)
end
