--[[
  Policy part: batch (Batch: the enqueues of one key run as one job, `size` at a time or
  `max_wait` seconds after the key's first waiting member). Included by the framework scripts
  through `-- @policies`; defines functions only.

  A member is an ordinary rq job (its own id, its hash) parked on its key instead of pushed:
  status deferred, in rq's deferred registry of its queue, its id in
    parked  rq:policies:keyparked:batch:<scope>:<key>   LIST of member ids, FIFO
  and the key, while it has waiting members, in the due index (rq:policies:keydue, member
  'batch:<scope>:<key>', score: the server time its batch is due). The member's hash carries
    policies_batch  '<size> <max_wait> <min_size> <scope>:<key>'
    batch_item      its payload, pickled as a fragment (rq_policies.policies.batch.rules.fragment)
    batch_head      the batch job's data up to its first member (the function's name)
    batch_at        the server time it was parked ('%.6f')
  and, once its batch formed, batch_id (the batch job's id).

  Admission (lua/admit.lua; p = Batch.admit_part's arguments; keys batch.parked, batch.due,
  batch.deferred):
    check(ctx, p)    nothing to check (a member is never dropped by Batch)
    commit(ctx, p)   plans the hash-only write (ctx.mode 'D'); force likewise
    written(ctx, p)  parks the written member on its key; the key is due now when `size` wait, else
                     at its first waiting member's time + max_wait once `min_size` wait (ZADD LT: an
                     earlier due time is kept); the queue's idle workers are woken (now), or told
                     when to look ('scheduled <time>')
  Fetch (lua/fetch.lua):
    due(ctx, key_id) the key came due: form one batch (bt_form) when `size` members wait, or when
                     max_wait passed since the first and `min_size` wait; returns the next time
                     to look (nil: nothing left to wait for)
    admit_job(ctx, jid, value) a member met on a queue's list (requeued by hand, handed back):
                     parked again on its key, due now
  Forming (bt_form), atomic in the fetch's script: up to `size` live members (status deferred,
  with their item) leave the parked list and rq's deferred registry; the batch job's hash is the
  first member's with: id '<first member id>-batch', data = batch_head .. the items .. 'lt}t.'
  (rq unpickles (func_name, None, ([payload, ...],), {})), status queued, created_at and
  enqueued_at the forming's server time (batch_formed_at too, '%.6f', which a retry leaves),
  policies_batch_members = the members' ids (space-separated), no member fields, and each other
  per-job part's field as its merge hook makes it of every member's (ctx.merged: Concurrency's and
  Rate's costs add up), else the first member's; it is pushed to
  the tail of its first member's queue and that queue's idle workers are woken; each member's
  hash gets batch_id and expires a day later (BT_MEMBER_TTL). A member goes into exactly one
  batch: it leaves the parked list in the script that writes its batch_id.
  Replays: a fetch replayed after a lost reply forms nothing again (its members left the list);
  it may form the key's next batch from members that came since, which is that batch's first
  forming. An admission's replay is answered by admit.lua before any part runs.
]]
-- @include "lib/keys.lua"
-- @include "lib/key_unpark.lua"
-- @include "lib/iso_time.lua"
P.batch = {fields = {'policies_batch'}}

-- Seconds a member's hash lives once its batch formed (rq_policies.policies.batch.rules.MEMBER_TTL; a
-- shorter ttl it was enqueued with is kept): the batch job holds its payload, the member is a handle.
local BT_MEMBER_TTL = 86400

local function bt_parse(raw)
  local size, wait, min, key_id = string.match(raw or '', '^(%d+) ([%d%.]+) (%d+) (.+)$')
  return tonumber(size), tonumber(wait), tonumber(min), key_id
end

function P.batch.check(ctx, p)
  return nil
end

function P.batch.commit(ctx, p)
  if p.key_id and (ctx.mode == 'R' or ctx.mode == 'L') then
    ctx.mode = 'D' -- the hash only: written() parks the member on its key
    ctx.batch = true
  end
end

P.batch.force = P.batch.commit

-- The server time the key's batch is due with `n` members waiting, the first parked at `first_at`
-- (nil: not before more come).
local function bt_due_at(n, first_at, size, wait, min, now)
  if n >= size then
    return now
  end
  if n < min then
    return nil
  end
  return math.max(now, first_at + wait)
end

function P.batch.written(ctx, p)
  if not ctx.batch then
    return
  end
  local now_s = string.format('%.6f', ctx.now)
  redis.call('HSET', ctx.key('job'), 'status', 'deferred', 'batch_at', now_s)
  redis.call('ZADD', ctx.key('batch.deferred'), ctx.now, ctx.jid)
  local parked = ctx.key('batch.parked')
  local n = redis.call('RPUSH', parked, ctx.jid)
  local first_at = ctx.now
  if n > 1 then
    local first = redis.call('LINDEX', parked, 0)
    first_at = tonumber(redis.call('HGET', key_of(p.job_prefix, first), 'batch_at')) or ctx.now
  end
  local due = bt_due_at(n, first_at, p.size, p.max_wait, p.min_size, ctx.now)
  if due then
    redis.call('ZADD', ctx.key('batch.due'), 'LT', due, 'batch:' .. p.key_id)
    if due <= ctx.now then
      redis.call('SPUBLISH', p.wake, ctx.jid)
    else
      redis.call('SPUBLISH', p.wake, 'scheduled ' .. string.format('%.6f', due))
    end
  end
end

-- Form one batch of up to `size` members of `parked` (see the header); returns the batch job's id,
-- or nil when no live member was left.
local function bt_form(ctx, parked, size)
  local ids, items = {}, {}
  -- The other per-job parts' first fields (a part with a merge hook gets every member's value).
  local merging, read = {}, {'status', 'batch_item', 'origin'}
  for _, item in ipairs(ctx.job_parts) do
    if item[1] ~= 'batch' then
      merging[#merging + 1] = {item[1], ctx.job_fields[item[2]], {}}
      read[#read + 1] = ctx.job_fields[item[2]]
    end
  end
  for _ = 1, size + 10 do
    if #ids >= size then
      break
    end
    local jid = redis.call('LPOP', parked)
    if not jid then
      break
    end
    local member = redis.call('HMGET', key_of(ctx.kp.job, jid), unpack(read))
    if member[1] == 'deferred' and member[2] and member[3] then
      ids[#ids + 1] = jid
      items[#items + 1] = member[2]
      redis.call('ZREM', key_of(ctx.kp.deferred, member[3]), jid)
      for n, merge in ipairs(merging) do
        if member[3 + n] then
          merge[3][#merge[3] + 1] = member[3 + n]
        end
      end
    end
  end
  if #ids == 0 then
    return nil
  end
  local bid = ids[1] .. '-batch'
  local hash = redis.call('HGETALL', key_of(ctx.kp.job, ids[1]))
  local skip = {
    data = true, status = true, policies_batch = true, batch_item = true, batch_head = true, batch_at = true,
    batch_id = true, batch_formed_at = true, started_at = true, ended_at = true, last_heartbeat = true,
    worker_name = true, exc_info = true, result = true, description = true, created_at = true,
    enqueued_at = true,
  }
  local out, head, origin = {}, '', nil
  for n = 1, #hash, 2 do
    local field, value = hash[n], hash[n + 1]
    if field == 'batch_head' then
      head = value
    elseif field == 'origin' then
      origin = value
    end
    if not skip[field] then
      out[#out + 1] = field
      out[#out + 1] = value
    end
  end
  -- A per-job field the first member carries: what its part makes of every member's (Concurrency and
  -- Rate: the sum of their costs), else the first member's (copied above).
  for _, merge in ipairs(merging) do
    local values = merge[3]
    local value = values[1] and #values > 1 and ctx.merged(merge[1], values)
    if value then
      for n = 1, #out, 2 do
        if out[n] == merge[2] then
          out[n + 1] = value
        end
      end
    end
  end
  out[#out + 1] = 'data'
  out[#out + 1] = head .. table.concat(items) .. 'lt}t.'
  out[#out + 1] = 'status'
  out[#out + 1] = 'queued'
  local formed = rq_utcformat(ctx.now)
  out[#out + 1] = 'created_at'
  out[#out + 1] = formed
  out[#out + 1] = 'enqueued_at'
  out[#out + 1] = formed
  out[#out + 1] = 'batch_formed_at' -- enqueued_at moves on a retry; this stays
  out[#out + 1] = string.format('%.6f', ctx.now)
  out[#out + 1] = 'description'
  out[#out + 1] = 'batch of ' .. #ids .. ' (' .. ids[1] .. ', ...)'
  out[#out + 1] = 'policies_batch_members'
  out[#out + 1] = table.concat(ids, ' ')
  local job_key = key_of(ctx.kp.job, bid)
  redis.call('DEL', job_key)
  redis.call('HSET', job_key, unpack(out))
  for _, jid in ipairs(ids) do
    local member = key_of(ctx.kp.job, jid)
    redis.call('HSET', member, 'batch_id', bid)
    redis.call('EXPIRE', member, BT_MEMBER_TTL, 'LT') -- a handle now: it goes a day after its batch formed
  end
  redis.call('RPUSH', key_of(ctx.kp.queue, origin), bid)
  redis.call('SPUBLISH', key_of(ctx.kp.wake, origin), bid)
  return bid
end

function P.batch.due(ctx, key_id)
  local parked = key_of(ctx.kp.parked, 'batch', key_id)
  local head, raw = key_parked_head(ctx.kp, parked, 'policies_batch')
  if not head then
    return redis.call('LLEN', parked) > 0 and ctx.now or nil
  end
  local size, wait, min = bt_parse(raw)
  if not size then
    return nil
  end
  local first_at = tonumber(redis.call('HGET', key_of(ctx.kp.job, head), 'batch_at')) or ctx.now
  local due = bt_due_at(redis.call('LLEN', parked), first_at, size, wait, min, ctx.now)
  if not due or due > ctx.now then
    return due
  end
  bt_form(ctx, parked, size)
  head = redis.call('LINDEX', parked, 0)
  if not head then
    return nil
  end
  first_at = tonumber(redis.call('HGET', key_of(ctx.kp.job, head), 'batch_at')) or ctx.now
  return bt_due_at(redis.call('LLEN', parked), first_at, size, wait, min, ctx.now)
end

-- A member met on a queue's list (requeued, handed back): parked again on its key, due now.
function P.batch.admit_job(ctx, jid, value)
  local _, _, _, key_id = bt_parse(value)
  if not key_id then
    return nil -- not written by Batch (which validates): run as it is rather than lost
  end
  return {parked = key_of(ctx.kp.parked, 'batch', key_id), member = 'batch:' .. key_id, due = ctx.now,
          head = false}
end
