--[[
  Take the next job for a PolicyWorker, in one atomic step: pop it, run every policy's fetch
  hooks, and hand it over with the holds its fetch policies took. There is never a job without
  its hold nor a hold without its job.

  Queues are tried in the worker's order. Before a queue is popped, each fetch policy's gate
  decides (a part, lua/policies/<name>.lua, included by `-- @policies`, may define):
    gate(ctx, i)               -> true: the queue may be taken from; false: skip it (it is full
                                  until something is released); a number: skip it until that
                                  server time (epoch s)
    take(ctx, i, job_key, jid) -> the fetch policy's commit for the job taken from queue i: 1
                                  when it took a hold (named ctx.token, ctx.ttl seconds), else 0
    taken(job_key, jid)        -> any policy (an admission one, such as loner): the job was
                                  taken off its queue; free what it held while it waited (or
                                  mark what it holds until it ends: Loner until='finished')
  A per-job policy (declared on the job's function, the job hash carries its setting: Concurrency,
  Rate) defines instead:
    fields                     -> the job hash fields it reads (one or two; the first says the job
                                  is under the policy); every per-job part's fields are read with
                                  one HMGET per popped job, and a job carrying none pays only that
    admit_job(ctx, jid, value, extra) -> (value, extra: its fields' values) nil: allowed; or a
                                  refusal {parked = list key, member = its
                                  member of the due index, due = server time the key could
                                  free, head = park at the head of the list}
    take_job(ctx, jid, value, extra) -> like take: 0, 1, or the ledger key the claim's hold went to
    refused(ctx, jid, value, extra) -> the job is parked (refused by this part or another): free
                                  what this part holds for it (checks run first, takes after: a
                                  refusal by one consumes nothing of another)
    source(ctx, i)             -> (any fetch policy) a job id of queue i the part keeps waiting in
                                  a store of its own (its status and registry already left as
                                  the pop expects: Fair's turn of a key), or nil; asked when
                                  queue i's list has nothing left to pop, so a queue's plain jobs
                                  come first. The id is popped as if it came off the list.
    due(ctx, channel)          -> the part's member '<part>:<channel>' of the due index came due:
                                  give parked jobs back while the key allows; returns the next
                                  time to look, or nil (no parked job left)
  A refused job is *parked*: its id moves off the intermediate list to the key's parked list, its
  status becomes deferred and it joins rq's deferred registry of its queue (stock rq reads it
  sanely, and its maintenance leaves it alone), and the pop goes on with the jobs behind it: no
  head-of-line blocking. At most 100 jobs are parked per call (each parked job costs O(1) once
  per refusal); a call that stopped there takes nothing and reports its queue skipped until now,
  so the worker looks again at once. The due index (keydue, ZSET member -> the earliest time a
  key with parked jobs could free) is read at the start of every fetch with one ZRANGEBYSCORE
  LIMIT (O(log n), whatever the number of keys or parked jobs); up to 4 due keys are served per
  call. An idle look also reports the index's head as its `until`, so an idle worker looks again
  when a key could free by itself (a killed holder's hold expiring emits no event).
  ctx.q is scratch space a gate leaves for its own take, emptied for every queue. The job id
  moves to the queue's intermediate list (LMOVE), as rq's own single-queue fetch does, so a
  worker that dies between this pop and the job's start leaves the job where rq's maintenance
  finds it, for single- and multi-queue workers alike. An id whose job hash is gone is dropped
  from the intermediate list and the pop goes on (at most 100 ids per queue, so a list full of
  dangling ids cannot stall the server), as rq's dequeue does.

  KEYS  by name (rq_policies/ops.py, built by rq_policies.fetch.fetch_call):
    queues          key list        queue i's list, rq:queue:<q>
    intermediate    key list        queue i's intermediate list, rq:queue:<q>:intermediate
    claim           key             rq:policies:claim:<token>: this claim's record (see below)
    and each fetch policy's keys, named '<policy>.<what>' (queue_slot.capacity, the capacity
    hash rq:policies:capacity; queue_slot.holds, a key list: queue i's hold ledger,
    rq:policies:slots:<q>)
  ARGV[1]  one msgpack map (lib/codec.lua):
    job_prefix      string          rq:job:
    names           list            queue i's name
    order           list            the fetch policies' names, in the order their gates run
    token           string          the claim token, <host>:<pid>:<tid>:<n>: names every hold
                                    this fetch takes
    ttl             seconds         how long a hold lives unless refreshed
    tombstone       string          rq:policies:superseded: (a popped job whose tombstone exists is
                                    dropped, not handed out; one whose tombstone is a rewrite
                                    guard is checked by lib/rewrite_guard.lua)
    burst           boolean         a burst worker: count the skipped queues that still have jobs
                                    (it waits for those instead of quitting); 0 is reported otherwise
    claim_ttl       seconds         how long the claim's record lives (a replay comes within it)

  Replay-safe: a fetch that takes a job records, in the same script, what it took under its
  claim token (one SET with a short EX). A replay of the same call (redis-py resending it after
  a lost reply) finds the record and answers the job the first attempt took, with its holds,
  never popping a second one (a second pop would strand that job on the intermediate list with
  its loner marker gone).

  Returns {i, job id, h1, h2, ...} for the job taken from queue i, where hn = 1 when the n-th
  policy of `order` took a hold in its queue ledger, or the ledger key when it took one in
  another ledger (a per-key hold); or {0, waiting, f1, f2, ..., [until]} when nothing was taken:
  waiting = how many skipped queues still have jobs (a burst worker waits for them instead of
  quitting), f1.. = the index of every skipped queue (an idle worker ignores pushes to those
  until something is released), and, only when a gate skipped a queue until a time, `until` =
  the earliest such server time as a string ('%.6f' epoch s; the indices are integers, so the
  two cannot be confused): an idle worker need not look again before it.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/rewrite_guard.lua"
-- @include "lib/promote.lua"

local a = decode_args(ARGV[1])
local claim_key = KEYS[a.k.claim]
-- The claim record: the reply, each item as '<length>:<bytes>' (a hold flag may be a key name).
local recorded = rcall('GET', claim_key)
if recorded then
  local reply, pos = {}, 1
  while pos <= #recorded do
    local colon = string.find(recorded, ':', pos, true)
    local n = tonumber(string.sub(recorded, pos, colon - 1))
    local item = string.sub(recorded, colon + 1, colon + n)
    reply[#reply + 1] = (#reply ~= 1 and tonumber(item)) or item
    pos = colon + n + 1
  end
  return reply
end
local P = {}
-- @policies

-- The hooks that exist, in a fixed order, so every run writes in the same order.
local gates, takes, taken, sources = {}, {}, {}, {}
-- per-job parts: their index in `order`, name, and the job hash fields they read (one HMGET)
local per_job, fields = {}, {}
for n, name in ipairs(a.order) do
  local part = P[name] or {}
  gates[n] = part.gate
  takes[n] = part.take
  if part.source then
    sources[#sources + 1] = part.source
  end
  if part.admit_job then
    per_job[#per_job + 1] = {n = n, name = name, part = part, at = #fields + 1}
    for _, f in ipairs(part.fields) do
      fields[#fields + 1] = f
    end
  end
end
local names = {}
for name, part in pairs(P) do
  if part.taken then
    names[#names + 1] = name
  end
end
table.sort(names)
for _, name in ipairs(names) do
  taken[#taken + 1] = P[name].taken
end

local queues, inters = a.kl.queues[1], a.kl.intermediate[1]
local ctx = {names = a.names, token = a.token, ttl = a.ttl, now = server_now(), kp = a.keyed}
function ctx.key(name)
  return KEYS[a.k[name]]
end
function ctx.key_at(name, i)
  return KEYS[a.kl[name][1] + i - 1]
end

-- Keys whose parked jobs may run now (a hold expired, a rate or a back-off allows, a limit was
-- raised): each part gives back what its key allows and says when to look next.
local due_key = a.k.keydue and KEYS[a.k.keydue]
if due_key then
  local due = rcall('ZRANGEBYSCORE', due_key, '-inf', string.format('%.6f', ctx.now), 'LIMIT', 0, 4)
  for _, member in ipairs(due) do
    local name, channel = string.match(member, '^([^:]+):(.*)$')
    local part = name and P[name]
    local next_at = part and part.due and part.due(ctx, channel)
    if next_at then
      rcall('ZADD', due_key, next_at, member)
    else
      rcall('ZREM', due_key, member)
    end
  end
end

-- Due jobs of the queues' scheduled registries go onto their queues first (lib/promote.lua), so
-- this very pop can take one: no scheduler process, the server's clock.
local pr = a.promote
local function registry_at(i) return KEYS[a.kl.scheduled[1] + i - 1] end
local function lock_at(i) return KEYS[a.kl.scheduler_lock[1] + i - 1] end
if pr then
  pr.queues_set = KEYS[a.k.queues_set]
  promote_due(a.names, function(i) return KEYS[queues + i - 1] end, registry_at, lock_at, a.job_prefix, pr, ctx.now)
end

-- The per-job parts' verdict on job `jid` (values: its fields, read with one HMGET): nil when
-- every part allows it (their values, for take_job, in `allowed`), else the first refusal.
local function admit_job(job_key, jid, allowed)
  if #per_job == 0 then
    return nil
  end
  local values = rcall('HMGET', job_key, unpack(fields))
  local refusal, refuser
  for _, item in ipairs(per_job) do
    local value = values[item.at]
    if value then
      local extra = #item.part.fields > 1 and values[item.at + 1] or nil -- a second field, if it reads two
      refusal = item.part.admit_job(ctx, jid, value, extra)
      if refusal then
        refuser = {item, value, extra}
        break
      end
      allowed[#allowed + 1] = {item, value, extra}
    end
  end
  if refusal then
    -- the job is parked: what the parts held for it (a unit reserved when it was given back) goes,
    -- the refusing part's own included
    allowed[#allowed + 1] = refuser
    for _, pair in ipairs(allowed) do
      if pair[1].part.refused then
        pair[1].part.refused(ctx, jid, pair[2], pair[3])
      end
    end
  end
  return refusal
end

-- Park job `jid` (just moved to the right end of intermediate list `inter_key`) on its key.
local function park(i, inter_key, job_key, jid, refusal)
  rcall('LMOVE', inter_key, refusal.parked, 'RIGHT', refusal.head and 'LEFT' or 'RIGHT')
  rcall('HSET', job_key, 'status', 'deferred')
  rcall('ZADD', a.keyed.deferred .. a.names[i], ctx.now, jid)
  rcall('ZADD', due_key, 'LT', refusal.due, refusal.member)
end
local parks = 0

local function record(reply)
  local out = {}
  for n, item in ipairs(reply) do
    item = tostring(item)
    out[n] = #item .. ':' .. item
  end
  return table.concat(out)
end

local waiting = 0
local full = {}
local skip_until
for i = 1, #a.names do
  local queue_key = KEYS[queues + i - 1]
  local inter_key = KEYS[inters + i - 1]
  ctx.q = {}
  local verdict = true
  for n = 1, #a.order do
    if gates[n] then
      verdict = gates[n](ctx, i)
      if verdict ~= true then
        break
      end
    end
  end
  if verdict ~= true then
    if type(verdict) == 'number' and (not skip_until or verdict < skip_until) then
      skip_until = verdict
    end
    full[#full + 1] = i
    if a.burst and rcall('LLEN', queue_key) > 0 then
      waiting = waiting + 1
    end
  else
    local tries = 0
    while tries < 100 and parks < 100 do
      tries = tries + 1
      local jid = rcall('LMOVE', queue_key, inter_key, 'LEFT', 'RIGHT')
      for s = 1, (jid and 0 or #sources) do
        jid = sources[s](ctx, i)
        if jid then
          rcall('RPUSH', inter_key, jid)
          break
        end
      end
      if not jid then
        break
      end
      local job_key = a.job_prefix .. jid
      local present = rcall('EXISTS', job_key) == 1
      -- A pending job a later enqueue superseded, brought back by a scheduler whose clock runs
      -- ahead of the server's (lib/pending.lua; the scheduler's write-back carries none of our
      -- fields, so every job is checked): dropped like an id whose hash is gone. A pending job
      -- rewritten in place carries a rewrite guard instead (lib/rewrite_guard.lua).
      local tomb = present and rcall('GET', a.tombstone .. jid)
      if tomb then
        if string.sub(tomb, 1, 8) == 'rewrite ' then
          if rewrite_guard(job_key, jid, a.tombstone .. jid, tomb, ctx.now) then
            present = false
          end
        else
          rcall('DEL', job_key)
          present = false
        end
      end
      local allowed = {}
      local refusal = present and admit_job(job_key, jid, allowed)
      if refusal then
        park(i, inter_key, job_key, jid, refusal)
        parks = parks + 1
        tries = tries - 1 -- a parked job is progress, bounded by `parks`
      elseif present then
        for _, hook in ipairs(taken) do
          hook(job_key, jid)
        end
        local reply = {i, jid}
        for n = 1, #a.order do
          reply[n + 2] = takes[n] and takes[n](ctx, i, job_key, jid) or 0
        end
        for _, pair in ipairs(allowed) do
          local got = pair[1].part.take_job(ctx, jid, pair[2], pair[3])
          if got ~= 0 then
            reply[pair[1].n + 2] = got
          end
        end
        rcall('SET', claim_key, record(reply), 'EX', a.claim_ttl)
        return reply
      else
        rcall('LREM', inter_key, 1, jid)
      end
    end
    if parks >= 100 then
      -- The per-call bound on parking stopped this pop: nothing taken, look again at once.
      if not skip_until or ctx.now < skip_until then
        skip_until = ctx.now
      end
      if a.burst then
        waiting = waiting + 1
      end
      break
    end
  end
end
if due_key then
  -- An idle worker looks again when a key with parked jobs could free by itself.
  local head = rcall('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  local at = tonumber(head[2])
  if at and (not skip_until or at < skip_until) then
    skip_until = math.max(at, ctx.now)
  end
  if at and a.burst then
    waiting = waiting + 1 -- parked jobs are work not yet done: a burst worker waits for them
  end
end
if pr then
  -- An idle worker looks again when a scheduled job of its queues comes due (or a live
  -- scheduler's lock turns stale): it waits for that time rather than polling.
  for i = 1, #a.names do
    local at = promote_next(registry_at(i), lock_at(i), pr, ctx.now)
    if at and (not skip_until or at < skip_until) then
      skip_until = at
    end
  end
end
if skip_until then
  full[#full + 1] = string.format('%.6f', skip_until)
end
return {0, waiting, unpack(full)}
