--[[
  Policy part: key_rate (Rate: at most `limit` job starts of one key every `per` seconds,
  cluster-wide, GCRA on the server clock as QueueRate, of one window or several; a per-job policy,
  declared on the job's function). Included by the framework scripts through `-- @policies`;
  defines functions only.

  The job hash carries the policy (field policies_key_rate = '<limit> <per> <burst> <scope>:<key>',
  written at enqueue; with several windows each of the three a comma-separated list, one entry per
  window: lib/rate_windows.lua) and, once a parked job was given back with its start paid for, the
  field policies_key_rate_paid. Keys, from the prefixes in ctx.kp, the key id '<scope>:<key>'
  appended:
    tat     rq:policies:keytat:<scope>:<key>     STRING '<tat> <interval>' (lib/rate_tat.lua; with
                                                  several windows '<tat> <interval> <per>' per
                                                  window), expiring once the last tat is past
    parked  rq:policies:keyparked:key_rate:<scope>:<key>   LIST of parked job ids, FIFO
    block   rq:policies:keyblock:<scope>:<key>   a BackOff(key=True) (lib/key_blocked.lua)
  and ctx.kp.rates, rq:policies:keyrates, HASH '<scope>:<key>' -> '<limit> <per> <burst>' (lists
  with several windows): a rate set at run time (Rate.set), which wins over the scope's rule
  (ctx.kp.rules, rq:policies:keyrules, field 'key_rate:<scope>', lib/key_rule.lua), which wins
  over the rate the job declares.

  admit_job(ctx, jid, raw, paid): a job whose start was paid for when it was given back runs;
    another waits behind the key's parked jobs (FIFO per key), or until every window's GCRA allows
    a start (emission interval T = per / limit, tolerance (burst - 1) * T). Writes nothing, so a
    refusal by one window consumes nothing of another.
  take_job(ctx, jid, raw, paid): records the start (each window's arrival time moves on by its T,
    or by cost x T for a job of Rate(cost=), whose field reads '<burst>*<cost>'), or clears the paid
    mark; returns 0 (a rate takes no hold: a start is never refunded).
  merge(ctx, values): one job formed from jobs with these fields (Batch): the first's rate and key,
    the sum of the costs, at most its smallest window's limit (a larger cost could never start).
  due(ctx, key_id): gives back parked jobs one by one while every window allows a start (at most
    10), each with its start paid (every arrival time moves on by its cost); returns when the next
    start is allowed, or nil when no parked job is left.
]]
-- @include "lib/keys.lua"
-- @include "lib/rate_windows.lua"
-- @include "lib/key_blocked.lua"
-- @include "lib/key_unpark.lua"
-- @include "lib/key_rule.lua"
P.key_rate = {fields = {'policies_key_rate', 'policies_key_rate_paid'}}

-- A job's rate (the run-time one when set, else the one it declares: lib/rate_windows.lua), key id
-- and cost (Rate(cost=): '<burst>*<cost>' in its field, else 1); nil when not written by Rate.
local function kr_parse(ctx, raw)
  local limits, pers, bursts, cost, key_id = string.match(raw, '^([%d,]+) ([%d,]+) ([%d,]+)%*?(%d*) (.+)$')
  if not limits then
    return nil
  end
  local windows
  -- the run-time rate (Rate.set), else the scope's rule (Rate.set_rule), else the declared one
  local set = redis.call('HGET', ctx.kp.rates, key_id) or key_rule(ctx.kp, 'key_rate', key_id)
  if set then
    local l, p, b = string.match(set, '^([%d,]+) ([%d,]+) ([%d,]+)$')
    windows = l and rate_windows(l, p, b)
  end
  windows = windows or rate_windows(limits, pers, bursts)
  if not windows then
    return nil
  end
  return windows, key_id, tonumber(cost) or 1
end

-- The GCRA now: each window's arrival time, and the server time the next start is allowed.
local function kr_state(ctx, key_id, windows)
  local tats = rate_tats(redis.call('GET', key_of(ctx.kp.tat, key_id)), windows, ctx.now)
  return tats, rate_allowed_at(windows, tats)
end

function P.key_rate.merge(ctx, values)
  local pattern = '^([%d,]+) ([%d,]+) ([%d,]+)%*?(%d*) (.+)$'
  local limits, pers, bursts, _, key_id = string.match(values[1], pattern)
  if not limits then
    return values[1]
  end
  local cap, total = nil, 0
  for limit in string.gmatch(limits, '%d+') do
    cap = math.min(cap or tonumber(limit), tonumber(limit))
  end
  for _, raw in ipairs(values) do
    local _, _, _, cost = string.match(raw, pattern)
    total = total + (tonumber(cost) or 1)
  end
  total = math.min(total, cap)
  return limits .. ' ' .. pers .. ' ' .. bursts .. (total > 1 and ('*' .. total) or '') .. ' ' .. key_id
end

function P.key_rate.admit_job(ctx, jid, raw, paid)
  local windows, key_id, cost = kr_parse(ctx, raw)
  if not windows then
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
  local tats, allowed_at = kr_state(ctx, key_id, windows)
  if allowed_at <= ctx.now and redis.call('LLEN', parked) == 0 then
    -- what the take of this job reads again, unless another part refuses it (nothing else in this
    -- script writes the key's rate or arrival times in between)
    ctx.key_rate_allowed = {jid, windows, key_id, cost, tats}
    return nil
  end
  return {parked = parked, member = member, due = math.max(allowed_at, ctx.now), head = false}
end

function P.key_rate.take_job(ctx, jid, raw, paid)
  if paid then
    redis.call('HDEL', key_of(ctx.kp.job, jid), 'policies_key_rate_paid')
    return 0
  end
  local windows, key_id, cost, tats
  local allowed = ctx.key_rate_allowed
  if allowed and allowed[1] == jid then
    windows, key_id, cost, tats = allowed[2], allowed[3], allowed[4], allowed[5]
  else
    windows, key_id, cost = kr_parse(ctx, raw)
    tats = kr_state(ctx, key_id, windows)
  end
  rate_take(windows, tats, cost)
  rate_store(key_of(ctx.kp.tat, key_id), windows, tats, ctx.now)
  return 0
end

function P.key_rate.due(ctx, key_id)
  local parked, raw, stop, due = key_due_start(ctx, 'key_rate', key_id)
  if stop then
    return due
  end
  local windows = kr_parse(ctx, raw)
  local tats, allowed_at = kr_state(ctx, key_id, windows)
  if allowed_at > ctx.now then
    return allowed_at
  end
  -- Head jobs in their parked order while every window allows a start (at most 10): each pays its
  -- own cost (Rate(cost=)) in every window.
  local cost = 1
  key_unpark(ctx, parked, 10, 'policies_key_rate', function(jid)
    redis.call('HSET', key_of(ctx.kp.job, jid), 'policies_key_rate_paid', '1')
    rate_take(windows, tats, cost)
  end, function(_, raw)
    if rate_allowed_at(windows, tats) > ctx.now + 1e-9 then
      return false
    end
    local _, _, c = kr_parse(ctx, raw or '')
    cost = c or 1
    return true
  end)
  rate_store(key_of(ctx.kp.tat, key_id), windows, tats, ctx.now)
  if redis.call('LLEN', parked) == 0 then
    return nil
  end
  return math.max(rate_allowed_at(windows, tats), ctx.now)
end
