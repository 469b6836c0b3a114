--[[
  Policy part: concurrency (Concurrency: at most N jobs of one key running at once, cluster-wide;
  a per-job policy, declared on the job's function). Included by the framework scripts through
  `-- @policies`, and by lua/key_release.lua; defines functions only.

  The job hash carries the policy (field policies_concurrency = '<limit> <scope>:<key>', written
  at enqueue), so a worker needs no import of the job's function to enforce it. Keys are built
  from the prefixes in ctx.kp (rq_policies.concurrency.keyed_args), the key id '<scope>:<key>'
  appended:
    holds   rq:policies:keyholds:<scope>:<key>   ZSET hold ledger (QueueSlot's model: member =
                                                  claim token, score = expiry, server clock);
                                                  a member 'unpark:<job id>' is the unit reserved
                                                  for a job given back to its queue, until a
                                                  worker takes it (at most ctx.ttl seconds)
    parked  rq:policies:keyparked:concurrency:<scope>:<key>   LIST of parked job ids, FIFO
    limits  rq:policies:keylimits   HASH '<scope>:<key>' -> a limit set at run time (override)
    rules   rq:policies:keyrules    HASH 'concurrency:<scope>' -> the scope's stated rule
                                    (lib/key_rule.lua): below the override, above the declared limit
    block   rq:policies:keyblock:<scope>:<key>    a BackOff(key=True) (lib/key_blocked.lua)
    units   rq:policies:keyunits:<scope>:<key>    ZSET hold member -> its cost, for the holds (and
                                                  reservations) of a cost above 1 (Concurrency(cost=):
                                                  field '<limit>*<cost> <scope>:<key>'); a live hold
                                                  counts its cost, others 1; members whose hold is gone
                                                  are dropped at a take, the key with its last member

  Hooks of a per-job part (lua/fetch.lua calls them for a popped job carrying the field):
    admit_job(ctx, jid, raw) -> nil: allowed (state for take_job in ctx.kj.concurrency); or a
      refusal {parked = list key, member = due-index member, due = server time the key could
      free, head = park at the head: a job given back keeps its place} (check only: nothing
      written; a reservation of this very job is dropped by refused())
    take_job(ctx, jid, raw)  -> the ledger key the claim's hold was added to
    merge(ctx, values)       -> one job formed from jobs with these fields (Batch): the first's limit
      and key, the sum of the costs, at most the limit
    refused(ctx, jid, raw)   -> the job is parked (by this part or another): its reservation, if
      any, goes, and the key is due now (its next parked job may use the unit)
    due(ctx, key_id)         -> the key's entry in the due index came due: give parked jobs back
      while units are free (each with a reservation), at most 10 per call; returns the next
      time to look (nil: no parked job left)
]]
-- @include "lib/keys.lua"
-- @include "lib/outlive.lua"
-- @include "lib/ledger_live.lua"
-- @include "lib/ledger_add.lua"
-- @include "lib/key_blocked.lua"
-- @include "lib/key_unpark.lua"
-- @include "lib/key_rule.lua"
P.concurrency = {fields = {'policies_concurrency'}}

local function cc_parse(raw)
  local limit, cost, key_id = string.match(raw, '^(%d+)%*?(%d*) (.+)$')
  return tonumber(limit), key_id, tonumber(cost) or 1
end

-- The units of the key `key_id` in use under the server's clock: its live holds, each counting its
-- cost, member `except` (a job's own reservation) left out. A key without costed holds pays one
-- EXISTS beside the ZCOUNT; one with costed holds reads its live holds (at most `limit` of them).
local function cc_units(ctx, ledger, key_id, except)
  local units = key_of(ctx.kp.units, key_id)
  if redis.call('EXISTS', units) == 0 then
    local n = ledger_live(ledger, ctx.now)
    if except and (tonumber(redis.call('ZSCORE', ledger, except)) or 0) > ctx.now then
      n = n - 1
    end
    return n
  end
  local total = 0
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', ledger, string.format('(%.6f', ctx.now), '+inf')) do
    if member ~= except then
      total = total + (tonumber(redis.call('ZSCORE', units, member)) or 1)
    end
  end
  return total
end

-- Drop the cost of every member of `units` whose hold in `ledger` is gone (released, lapsed).
local function cc_prune(ctx, ledger, units)
  for _, member in ipairs(redis.call('ZRANGE', units, 0, -1)) do
    local score = tonumber(redis.call('ZSCORE', ledger, member))
    if not score or score <= ctx.now then
      redis.call('ZREM', units, member)
    end
  end
end

-- The key's limit: its run-time setting (Concurrency.set), else its scope's rule
-- (Concurrency.set_rule, lib/key_rule.lua), else the limit the job declares.
local function cc_limit(ctx, key_id, declared)
  local set = tonumber(redis.call('HGET', ctx.kp.limits, key_id))
  if set then
    return set
  end
  return tonumber((key_rule(ctx.kp, 'concurrency', key_id))) or declared
end

-- The time the earliest live hold of `ledger` expires (the key could free then), else now.
local function cc_first_expiry(ledger, now)
  local first = redis.call('ZRANGEBYSCORE', ledger, string.format('(%.6f', now), '+inf', 'WITHSCORES',
    'LIMIT', 0, 1)
  return tonumber(first[2]) or now
end

-- One job formed from jobs of these fields (Batch): the first one's limit and key, the sum of their
-- costs, at most that limit (a cost above it could never start).
function P.concurrency.merge(ctx, values)
  local limit, key_id = cc_parse(values[1])
  if not limit then
    return values[1]
  end
  local total = 0
  for _, raw in ipairs(values) do
    local _, _, cost = cc_parse(raw)
    total = total + (cost or 1)
  end
  total = math.min(total, limit)
  return total > 1 and (limit .. '*' .. total .. ' ' .. key_id) or (limit .. ' ' .. key_id)
end

function P.concurrency.admit_job(ctx, jid, raw)
  local limit, key_id, cost = cc_parse(raw)
  if not limit then
    return nil -- not written by Concurrency (which validates): ignored rather than blocking forever
  end
  local parked = key_of(ctx.kp.parked, 'concurrency', key_id)
  local member = 'concurrency:' .. key_id
  local blocked = key_blocked(ctx.kp, key_id, ctx.now)
  local ledger = key_of(ctx.kp.holds, key_id)
  local mine = redis.call('ZSCORE', ledger, 'unpark:' .. jid)
  if blocked then
    return {parked = parked, member = member, due = blocked, head = mine and true or false}
  end
  limit = cc_limit(ctx, key_id, limit)
  local others = cc_units(ctx, ledger, key_id, mine and ('unpark:' .. jid) or nil)
  local fits = others + cost <= limit
  -- A job that was not given back by an unpark waits behind the key's parked jobs (FIFO per key).
  if fits and (mine or redis.call('LLEN', parked) == 0) then
    return nil
  end
  local due = fits and ctx.now or cc_first_expiry(ledger, ctx.now)
  return {parked = parked, member = member, due = due, head = mine and true or false}
end

function P.concurrency.take_job(ctx, jid, raw)
  local _, key_id, cost = cc_parse(raw)
  local ledger = key_of(ctx.kp.holds, key_id)
  redis.call('ZREM', ledger, 'unpark:' .. jid)
  redis.call('ZREMRANGEBYSCORE', ledger, '-inf', ctx.now)
  ledger_add(ledger, ctx.token, ctx.ttl, ctx.now)
  local units = key_of(ctx.kp.units, key_id)
  if cost > 1 then
    redis.call('ZADD', units, cost, ctx.token)
  end
  if cost > 1 or redis.call('EXISTS', units) == 1 then
    cc_prune(ctx, ledger, units)
  end
  return ledger
end

function P.concurrency.refused(ctx, jid, raw)
  local _, key_id = cc_parse(raw)
  if key_id then
    redis.call('ZREM', key_of(ctx.kp.units, key_id), 'unpark:' .. jid)
  end
  if key_id and redis.call('ZREM', key_of(ctx.kp.holds, key_id), 'unpark:' .. jid) == 1 then
    -- the unit reserved for this job is free again: the key's next parked job may use it
    redis.call('ZADD', ctx.kp.due, ctx.now, 'concurrency:' .. key_id)
  end
end

function P.concurrency.due(ctx, key_id)
  local parked, raw, stop, due = key_due_start(ctx, 'concurrency', key_id)
  if stop then
    return due
  end
  local ledger = key_of(ctx.kp.holds, key_id)
  redis.call('ZREMRANGEBYSCORE', ledger, '-inf', ctx.now)
  local room = cc_limit(ctx, key_id, cc_parse(raw or '') or 1) - cc_units(ctx, ledger, key_id, nil)
  local units = key_of(ctx.kp.units, key_id)
  -- One job at a time while its cost fits (each with a reservation of its cost), at most 10.
  local full, moved = false, {}
  for _ = 1, 10 do
    local head, head_raw = key_parked_head(ctx.kp, parked, 'policies_concurrency')
    if not head then
      break
    end
    local _, _, cost = cc_parse(head_raw or '')
    if cost > room then
      full = true
      break
    end
    key_unpark(ctx, parked, 1, 'policies_concurrency', function(jid)
      ledger_add(ledger, 'unpark:' .. jid, ctx.ttl, ctx.now)
      if cost > 1 then
        redis.call('ZADD', units, cost, 'unpark:' .. jid)
      end
      moved[#moved + 1] = jid
    end)
    room = room - cost
  end
  -- Each went to the front of its queue on its own: put them back in their parked order.
  local by_queue = {}
  for _, jid in ipairs(moved) do
    local origin = redis.call('HGET', key_of(ctx.kp.job, jid), 'origin')
    by_queue[origin] = by_queue[origin] or {}
    table.insert(by_queue[origin], jid)
  end
  for origin, ids in pairs(by_queue) do
    if #ids > 1 then
      local queue = key_of(ctx.kp.queue, origin)
      redis.call('LPOP', queue, #ids)
      for i = #ids, 1, -1 do
        redis.call('LPUSH', queue, ids[i])
      end
    end
  end
  if redis.call('LLEN', parked) == 0 then
    return nil
  end
  if not full and room > 0 then
    return ctx.now -- stale ids or the per-call bound stopped it: the next fetch goes on
  end
  return cc_first_expiry(ledger, ctx.now)
end
