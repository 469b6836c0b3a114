--[[
  Policy part: key_rate (Rate: at most `limit` job starts of one key every `per` seconds,
  cluster-wide, GCRA on the server clock as QueueRate; a per-job policy, declared on the job's
  function). Included by the framework scripts through `-- @policies`; defines functions only.

  The job hash carries the policy (field policies_key_rate = '<limit> <per> <burst> <scope>:<key>',
  written at enqueue) and, once a parked job was given back with its start paid for, the field
  policies_key_rate_paid. Keys, from the prefixes in ctx.kp, the key id '<scope>:<key>' appended:
    tat     rq:policies:keytat:<scope>:<key>     STRING '<tat> <interval>' (lib/rate_tat.lua),
                                                  expiring once tat is past
    parked  rq:policies:keyparked:key_rate:<scope>:<key>   LIST of parked job ids, FIFO
    block   rq:policies:keyblock:<scope>:<key>   a BackOff(key=True) (lib/key_blocked.lua)
  and ctx.kp.rates, rq:policies:keyrates, HASH '<scope>:<key>' -> '<limit> <per> <burst>': a rate
  set at run time (Rate.set), which wins over the rate the job declares.

  admit_job(ctx, jid, raw, paid): a job whose start was paid for when it was given back runs;
    another waits behind the key's parked jobs (FIFO per key), or until its key's GCRA allows a
    start (emission interval T = per / limit, tolerance (burst - 1) * T). Writes nothing.
  take_job(ctx, jid, raw, paid): records the start (the arrival time moves on by T, or by
    cost x T for a job of Rate(cost=), whose field reads '<burst>*<cost>'), or clears the paid
    mark; returns 0 (a rate takes no hold: a start is never refunded).
  due(ctx, key_id): gives back parked jobs one by one while the GCRA allows a start (at most 10),
    each with its start paid (the arrival time moves on by its cost); returns when the next start
    is allowed, or nil when no parked job is left.
]]
-- @include "lib/keys.lua"
-- @include "lib/rate_tat.lua"
-- @include "lib/key_blocked.lua"
-- @include "lib/key_unpark.lua"
P.key_rate = {fields = {'policies_key_rate', 'policies_key_rate_paid'}}

-- A job's cost (Rate(cost=)): '<burst>*<cost>' in its field, else 1.
local function kr_parse(ctx, raw)
  local limit, per, burst, cost, key_id = string.match(raw, '^(%d+) (%d+) (%d+)%*?(%d*) (.+)$')
  if not limit then
    return nil
  end
  local set = redis.call('HGET', ctx.kp.rates, key_id)
  if set then
    local l, p, b = string.match(set, '^(%d+) (%d+) (%d+)$')
    if l then
      limit, per, burst = l, p, b
    end
  end
  local interval = tonumber(per) / tonumber(limit)
  return interval, (tonumber(burst) - 1) * interval, key_id, tonumber(cost) or 1
end

-- The GCRA now: the arrival time under `interval`, and the server time the next start is allowed.
local function kr_state(ctx, key_id, interval, tolerance)
  local tat = rate_tat(redis.call('GET', key_of(ctx.kp.tat, key_id)), interval, ctx.now)
  return tat, tat - tolerance
end

local function kr_record(ctx, key_id, tat, interval)
  local ms = math.ceil((tat - ctx.now) * 1000)
  redis.call('SET', key_of(ctx.kp.tat, key_id), string.format('%.6f %.17g', tat, interval), 'PX', math.max(ms, 1))
end

function P.key_rate.admit_job(ctx, jid, raw, paid)
  local interval, tolerance, key_id = kr_parse(ctx, raw)
  if not interval then
    return nil -- not written by Rate (which validates): ignored rather than blocking forever
  end
  local parked = key_of(ctx.kp.parked, 'key_rate', key_id)
  local member = 'key_rate:' .. key_id
  local blocked = key_blocked(ctx.kp, key_id, ctx.now)
  if blocked then
    return {parked = parked, member = member, due = blocked, head = paid and true or false}
  end
  if paid then
    return nil
  end
  local _, allowed_at = kr_state(ctx, key_id, interval, tolerance)
  if allowed_at <= ctx.now and redis.call('LLEN', parked) == 0 then
    return nil
  end
  return {parked = parked, member = member, due = math.max(allowed_at, ctx.now), head = false}
end

function P.key_rate.take_job(ctx, jid, raw, paid)
  if paid then
    redis.call('HDEL', key_of(ctx.kp.job, jid), 'policies_key_rate_paid')
    return 0
  end
  local interval, tolerance, key_id, cost = kr_parse(ctx, raw)
  local tat = kr_state(ctx, key_id, interval, tolerance)
  kr_record(ctx, key_id, tat + cost * interval, interval)
  return 0
end

function P.key_rate.due(ctx, key_id)
  local parked, raw, stop, due = key_due_start(ctx, 'key_rate', key_id)
  if stop then
    return due
  end
  local interval, tolerance = kr_parse(ctx, raw)
  local tat, allowed_at = kr_state(ctx, key_id, interval, tolerance)
  if allowed_at > ctx.now then
    return allowed_at
  end
  -- Head jobs in their parked order while a start is allowed (at most 10): each pays its own cost
  -- (Rate(cost=)).
  local cost = 1
  key_unpark(ctx, parked, 10, 'policies_key_rate', function(jid)
    redis.call('HSET', key_of(ctx.kp.job, jid), 'policies_key_rate_paid', '1')
    tat = tat + cost * interval
  end, function(_, raw)
    if tat - tolerance > ctx.now + 1e-9 then
      return false
    end
    local _, _, _, c = kr_parse(ctx, raw or '')
    cost = c or 1
    return true
  end)
  kr_record(ctx, key_id, tat, interval)
  if redis.call('LLEN', parked) == 0 then
    return nil
  end
  return math.max(tat - tolerance, ctx.now)
end
