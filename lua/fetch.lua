--[[
  Take the next job for a PolicyWorker, in one atomic step: pop it, run every policy's fetch
  hooks, and hand it over with the holds its fetch policies took. There is never a job without
  its hold nor a hold without its job.

  The phases, in this order (rq_policies.fetch.PHASES names them; a call with ARGV[12] = '1'
  reports the phases and hooks it ran, in order, as `trace`, which tests/test_fetch_phases.py
  checks):
    probe     one EXISTS over the claim record (KEYS[1]) and the probe range (from KEYS at ARGV[14] to
              the end: the tombstones' marker, the fetch policies' state keys (each
              FetchPolicy's `fetch_state`: the keys whose absence means its gate passes every
              queue, its take does nothing and no key has parked jobs) and a copy of the queues'
              scheduled registries), one unpack of KEYS. 0, the common case, skips the next four
              phases' reads: such a fetch runs EXISTS, LMOVE, HGETALL and SET (the record), and no
              part. Otherwise a second EXISTS counts the state keys, and only when the first
              count holds more, a third (the record twice, the marker once) tells the record,
              the marker and the registries apart; the tombstone of a popped job is read only
              while the marker says some tombstone exists.
    replay    the claim record exists: answer what the first attempt took, run nothing else
    state     some state key exists (the probe's second EXISTS): the gates, takes and the due
              phase run
    due       keys whose parked jobs may run now: each part's `due` gives back what its key
              allows (the due index, rq:policies:keydue, up to 4 keys a call)
    promote   a registry's head is due: its due jobs go onto their queues (lib/promote.lua), so
              this very pop can take one: no scheduler process, the server's clock
    then for each queue in the worker's order:
    gate      (state only) each fetch policy's gate, in registry order, may skip the queue
    pop       LMOVE onto the intermediate list (an empty list: each part's `source`, state only); one HGETALL of the job hash (handed to the worker
              in the reply: it reads the job no more) gives every part's job fields (JOB_FIELDS,
              from the parts' `fields` declarations; once the call has parked a job, an HMGET of
              those fields only, and the HGETALL for the job taken); the
              superseded tombstone is checked (a dangling or superseded id is dropped, the pop
              goes on)
    admit_job each per-job fetch policy the job carries (its first field set), registry order;
              a refusal parks the job (and runs every such part's `refused`) and the pop goes on
    taken     each part (by name) whose fields the job carries and that defines `taken` (loner)
    take      (state only) each fetch policy's take, registry order: the holds of the gates
    take_job  each per-job policy that allowed the job: its hold
    record    the claim record (SET EX ARGV[3]): a replay of this call answers the same job; and
              the take (HSET rq:policies:taken:<q> <job id> '<token> <enqueued_at>', the hash
              expiring max(3600, 2 x ARGV[2]) s after the queue's last take), which the work horse
              removes when the job starts. While the claim record
              lives (the worker's hold ttl), the take is live; a take whose record is gone (the
              worker died or stopped between this fetch and the job's start) is handed back to
              its queue by another PolicyWorker (lua/hand_back.lua), not left for rq's cleanup to
              fail unrun
    and when nothing was taken:
    idle      the earliest time anything could change (a gate's until, the due index's head, a
              scheduled job's due time) and which queues were skipped
  The server's clock (TIME) is read once, when something first needs it (a part, promotion, a
  park), never on a fetch the probe found nothing for.

  A part (lua/policies/<name>.lua) is defined only when the call first needs it (`-- @policies
  lazy`), and none is while the queues have no fetch policy state and the job carries no policy
  field: such a fetch costs about an LMOVE and the claim record. Hooks (each optional):
    gate(ctx, i)               -> true: the queue may be taken from; false: skip it (it is full
                                  until something is released); a number: skip it until that
                                  server time (epoch s)
    take(ctx, i, job_key, jid) -> the fetch policy's commit for the job taken from queue i: 1
                                  when it took a hold (named ctx.token, ctx.ttl seconds), else 0
    taken(job_key, jid, values) -> any policy (an admission one, such as loner): the job was
                                  taken off its queue (values: its `fields` as read); free what it
                                  held while it waited (or mark what it holds until it ends:
                                  Loner until='finished')
  A per-job policy (declared on the job's function, the job hash carries its setting: Concurrency,
  Rate) defines instead (and so may a part that is no fetch policy, the fetch side of an admission
  policy: loner_next, Loner's keep_last; its admit_job runs after the fetch policies'):
    fields                     -> (a declaration, `P.<name> = {fields = {...}}` on one line, which
                                  scripts.py reads into JOB_FIELDS) the job hash fields its hooks
                                  read; the first says the job is under the policy. A part with a
                                  `taken` hook declares its fields too.
    admit_job(ctx, jid, value, extra) -> (value, extra: its fields' values; ctx.i: the queue's
                                  index; ctx.sourced: the id a part's `source` handed over, if
                                  any) nil: allowed; or a
                                  refusal {parked = list key, member = its
                                  member of the due index, due = server time the key could
                                  free, head = park at the head of the list}, or {filed = true}:
                                  the part filed the job in a store of its own (Fair's line of a
                                  job met on the list: handed back, requeued); either way the
                                  job leaves the intermediate list, deferred
    take_job(ctx, jid, value, extra) -> like take: 0, 1, or the ledger key the claim's hold went to
    refused(ctx, jid, value, extra) -> the job is parked (refused by this part or another): free
                                  what this part holds for it (checks run first, takes after: a
                                  refusal by one consumes nothing of another)
    source(ctx, i)             -> (state only; any fetch policy) a job id of queue i the part keeps
                                  waiting in a store of its own (its status and registry already
                                  left as the pop expects: Fair's turn of a key), or nil; asked
                                  when queue i's list has nothing left to pop, so a queue's plain
                                  jobs come first. The id is popped as if it came off the list.
    due(ctx, key_id)           -> the part's member '<part>:<key id>' of the due index came due:
                                  give parked jobs back while the key allows (or form a job of
                                  them: Batch); returns the next time to look, or nil (no parked
                                  job left)
    merge(ctx, values)         -> (a per-job part) the value of its first field for one job formed
                                  from jobs whose first field held `values` (a list, in order;
                                  Batch's batch job): Concurrency and Rate sum the costs. A part
                                  without it: the formed job carries the first job's value. A due
                                  hook that forms a job asks through ctx.merged(name, values); the
                                  per-job parts are ctx.job_parts (JOB_PARTS: {name, index of its
                                  first field in JOB_FIELDS, count}) and their fields ctx.job_fields
  A refused job is *parked*: its id moves off the intermediate list to the key's parked list, its
  status becomes deferred and it joins rq's deferred registry of its queue (stock rq reads it
  sanely, and its maintenance leaves it alone), and the pop goes on with the jobs behind it: no
  head-of-line blocking. At most 100 jobs are parked per call (each parked job costs O(1) once
  per refusal); a call that stopped there takes nothing and reports its queue skipped until now,
  so the worker looks again at once. The due index (keydue, ZSET member -> the earliest time a
  key with parked jobs could free) is read with one ZRANGEBYSCORE LIMIT (O(log n), whatever the
  number of keys or parked jobs); up to 4 due keys are served per call. An idle look also reports
  the index's head as its `until`, so an idle worker looks again when a key could free by itself
  (a killed holder's hold expiring emits no event).
  ctx.q is scratch space a gate leaves for its own take, emptied for every queue. The job id
  moves to the queue's intermediate list (LMOVE), as rq's own single-queue fetch does, so a
  worker that dies between this pop and the job's start leaves the job where rq's maintenance
  finds it, for single- and multi-queue workers alike. An id whose job hash is gone is dropped
  from the intermediate list and the pop goes on (at most 100 ids per queue, so a list full of
  dangling ids cannot stall the server), as rq's dequeue does.

  KEYS (built by rq_policies.fetch.fetch_call), n = ARGV[4] queues:
    1                 rq:policies:claim:<token>: this claim's record (see below)
    1 + i             queue i's list, rq:queue:<q>
    1 + n + i         queue i's intermediate list, rq:queue:<q>:intermediate
    1 + 2n + i        queue i's takes, rq:policies:taken:<q> (see `record` below)
    1 + 3n + i        queue i's scheduled registry, rq:scheduled:<q> (when ARGV[6] = '1')
    then the rest by name, as the blob's k / kl say: queues_set (rq:queues), scheduler_lock (a key
    list: rq:scheduler-lock:<q>), each fetch policy's keys,
    named '<policy>.<what>' (queue_slot.capacity, the capacity hash rq:policies:capacity;
    queue_slot.holds, a key list: queue i's hold ledger, rq:policies:slots:<q>; keydue, the due
    index rq:policies:keydue ...), and last the probe range: the tombstones' marker, the state
    keys (key list `state`) and (promoting) a copy of the scheduled registries (key list `probe`)
  ARGV, flat (a fetch that needs no part decodes nothing):
    1 token      the claim token, <host>:<pid>:<tid>:<n>: names every hold this fetch takes
    2 ttl        seconds a hold lives unless refreshed
    3 claim_ttl  seconds the claim's record lives (a replay comes within it), and with it the take:
                 the worker's hold ttl
    4 n          how many queues
    5 burst      '1': a burst worker: count the skipped queues that still have jobs (it waits for
                 those instead of quitting); 0 is reported otherwise
    6 promote    '1': promote due scheduled jobs first
    7 job_prefix rq:job:
    8 tombstone  rq:policies:superseded: (a popped job whose tombstone exists is dropped, not
                 handed out; one whose tombstone is a rewrite guard is checked by
                 lib/rewrite_guard.lua)
    9, 10        the state keys: first index in KEYS and count (-1: some fetch policy declares
                 none, so its gate always runs)
    11 blob      one msgpack map (lib/codec.lua), decoded only when a gate, a per-job part or
                 promotion runs: names (queue i's name), order (the fetch policies' names, the order
                 their gates run), k (the named keys: name -> index in KEYS), kl (the key lists:
                 name -> the index of the first, as many as the list's count: N for a per-queue
                 list)
    12 trace     '1': report the phases run (tests)
    14 probe     the index in KEYS of the tombstones' marker (the tombstone prefix itself, the
                 tombstone of no job: lib/pending.lua keeps it alive while any tombstone lives),
                 where the probe range starts: the marker, the state keys, then (ARGV[6] = '1') a
                 copy of the scheduled registries, the last KEYS
    13 blob      the rest, decoded only when read: keyed (the per-key prefixes), promote (its
                 settings)

  Replay-safe: a fetch that takes a job records, in the same script, what it took under its
  claim token (one SET with a short EX). A replay of the same call (redis-py resending it after
  a lost reply) finds the record and answers the job the first attempt took, with its holds,
  never popping a second one (a second pop would strand that job on the intermediate list with
  its loner marker gone).

  Returns a named map, as a flat list of name, value (rq_policies.fetch.read_reply decodes it):
    job taken:     queue = i (1-based), job = the job id, holds = {policy, flag, ...} for each
                   policy that took a hold: flag 1 for one in its queue ledger, or the ledger key
                   of one taken elsewhere (a per-key hold), hash = the job hash as HGETALL reads
                   it (field, value, ...: the worker builds the job from it); on a replay,
                   replayed = 1 and no hash (the worker reads the job)
    nothing taken: waiting = how many skipped queues still have jobs (a burst worker waits for
                   them instead of quitting), full = {i, ...} every skipped queue (an idle worker
                   ignores pushes to those until something is released), and, when anything
                   could change by itself at a known time, until = that server time ('%.6f'
                   epoch s): an idle worker need not look again before it
    and trace = {phase, ...} when ARGV[12] = '1'.
    Either answer also says, only when it happened (rq_policies.engine.events reports it to a
    surface that watches: tracing), what else this fetch did:
      parked   = {i, jid, member, ...}: job jid of queue i parked on its key (member: the due
                 index's '<policy>:<scope>:<key>')
      skipped  = {i, policy, until, ...}: queue i skipped by policy's gate (a cap at its cap, a
                 rate), until = the server time it named ('%.6f'), or '' (until a release)
      promoted = {i, count, ...}: count due scheduled jobs of queue i promoted onto it
      unparked = {jid, queue name, member, ...}: a parked job given back to its queue (the due
                 phase: its key could take it again)
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/keys.lua"
-- @include "lib/rewrite_guard.lua"
-- Before the parts: rq_utcformat, for Batch's part and lib/promote.lua.
-- @include "lib/iso_time.lua"

local N = tonumber(ARGV[4])
local claim_key = KEYS[1]
local trace = ARGV[12] == '1' and {} or nil

-- probe: one EXISTS over the claim record and KEYS[ARGV[14]..]: the tombstones' marker (alive
-- while any tombstone is: lib/pending.lua), the state keys and the scheduled registries (a
-- copy of each, so the range is one unpack of KEYS, no table built). 0, the common case (no
-- replay, no tombstone, no policy state, nothing scheduled), skips the replay, state, due and
-- promote phases' own reads. Otherwise one EXISTS counts the state keys (stateful: the state
-- phase), and only when that does not account for the whole count, one more (the record twice,
-- the marker once) tells the claim record, the marker and the registries apart.
local state_first, state_count = tonumber(ARGV[9]), tonumber(ARGV[10])
local promote = ARGV[6] == '1'
local marker_at = tonumber(ARGV[14])
-- found: how many of the scheduled registries exist (1: unknown)
local claimed, tombs, found, stateful = true, true, 1, true
if state_count >= 0 then
  claimed, tombs, stateful = false, false, false
  found = rcall('EXISTS', claim_key, unpack(KEYS, marker_at))
  if found > 0 and state_count > 0 then
    local present = rcall('EXISTS', unpack(KEYS, state_first, state_first + state_count - 1))
    stateful, found = present > 0, found - present
  end
  if found > 0 then
    local more = rcall('EXISTS', claim_key, claim_key, KEYS[marker_at])
    claimed, tombs = more >= 2, more % 2 == 1
    found = found - more + (claimed and 1 or 0)
  end
end

-- replay
if claimed then
  local recorded = rcall('GET', claim_key)
  if recorded then
    -- The record: the queue's index, the job id, then policy, flag for each hold ('<length>:<bytes>'
    -- each, lib/rewrite_guard.lua's unpack_strings: a flag may be a key name).
    local items = unpack_strings(recorded)
    local holds = {}
    for n = 3, #items do
      holds[n - 2] = items[n]
    end
    local reply = {'queue', tonumber(items[1]), 'job', items[2], 'holds', holds, 'replayed', 1}
    if trace then
      reply[#reply + 1] = 'trace'
      reply[#reply + 1] = {'replay'}
    end
    return reply
  end
end

-- clock: the server's clock, read once, when something first needs it
local now, now_s
local function clock()
  if not now then
    local t = rcall('TIME')
    now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    now_s = t[1] .. '.' .. string.sub('00000' .. t[2], -6)
  end
  return now
end

-- What else this fetch did (header: parked, skipped, promoted, unparked), each nil until it
-- happens; tell(reply) adds those that did to the reply.
local news = {}
local function noted(name, ...)
  local list = news[name]
  if not list then
    list = {}
    news[name] = list
  end
  for _, v in ipairs({...}) do
    list[#list + 1] = v
  end
end
local function tell(reply)
  for _, name in ipairs({'parked', 'skipped', 'promoted', 'unparked'}) do
    if news[name] then
      reply[#reply + 1] = name
      reply[#reply + 1] = news[name]
    end
  end
  return reply
end

-- The take of job `jid` from queue i (its hash as HGETALL read it), noted until the worker starts
-- it: the claim token (whose record's life is the take's) and the job's enqueued_at (an id
-- enqueued again since is another take's). See `record` in the header.
local function note_taken(i, jid, hash)
  local enqueued_at = ''
  for n = 1, #hash, 2 do
    if hash[n] == 'enqueued_at' then
      enqueued_at = hash[n + 1]
      break
    end
  end
  local taken = KEYS[1 + 2 * N + i]
  rcall('HSET', taken, jid, ARGV[1] .. ' ' .. enqueued_at)
  -- the queue's takes outlive every live one (each lives about its worker's hold ttl, then it is
  -- started or handed back), and go with a queue no worker fetches from any more
  rcall('EXPIRE', taken, math.max(3600, 2 * tonumber(ARGV[2])))
end

-- state: some fetch policy has state (a cap, a rate, a key with parked jobs) somewhere (the probe
-- said)
if trace and stateful then trace[#trace + 1] = 'state' end

-- The blob, the parts and ctx: made on first need (setup()), never on a fetch that needs none.
-- @policies fields

-- The plain pop: the probe found nothing (no replay, no tombstone, no policy state, nothing
-- scheduled), so no gate, due key or promotion has anything to do: pop each queue in order
-- with nothing else defined, and take the first job that carries no part's field. One that
-- carries any (a Loner's, a Concurrency's) is handed, popped and read, to the pop below
-- (pre_i, pre_jid, pre_hash), which runs its parts.
local pre_i, pre_jid, pre_hash
if found == 0 and not (claimed or tombs or stateful) then
  for i = 1, N do
    local queue_key, inter_key = KEYS[1 + i], KEYS[1 + N + i]
    for _ = 1, 100 do
      local jid = rcall('LMOVE', queue_key, inter_key, 'LEFT', 'RIGHT')
      if not jid then
        break
      end
      if trace then trace[#trace + 1] = 'pop' end
      local hash = rcall('HGETALL', key_of(ARGV[7], jid))
      if #hash == 0 then
        rcall('LREM', inter_key, 1, jid) -- its job hash is gone: dropped, as rq's dequeue does
      else
        for n = 1, #hash, 2 do
          local at = JOB_FIELD_AT[hash[n]]
          if at and at > 1 then
            pre_i, pre_jid, pre_hash = i, jid, hash
            break
          end
        end
        if pre_i then
          break
        end
        local is = tostring(i)
        local record = #is .. ':' .. is .. #jid .. ':' .. jid -- as took() writes it, no hold
        rcall('SET', claim_key, record, 'EX', ARGV[3])
        note_taken(i, jid, hash)
        local reply = {'queue', i, 'job', jid, 'holds', {}, 'hash', hash}
        if trace then
          trace[#trace + 1] = 'record'
          reply[9], reply[10] = 'trace', trace
        end
        return reply
      end
    end
    if pre_i then
      break
    end
  end
  if not pre_i then
    if trace then
      trace[#trace + 1] = 'idle'
      return {'waiting', 0, 'full', {}, 'trace', trace}
    end
    return {'waiting', 0, 'full', {}}
  end
end

-- has_hook(name, hook): does part `name` define hook `hook`? (defined by `-- @policies fields`
-- above: without loading the part.) load_part(name) defines P[name] (`-- @policies lazy`).
local P, loaded
-- @policies lazy
local a, ctx
local function part(name)
  if not P then
    P, loaded = {}, {}
  end
  if not loaded[name] then
    loaded[name] = true
    load_part(name)
  end
  return P[name]
end
-- The blob (ARGV[11]) and ctx, for the parts that take ctx (gates, takes, per-job parts, due).
-- The blob's second half (ARGV[13]: the per-key prefixes, promotion's settings) is decoded only
-- when read.
local function setup()
  if a then return end
  a = setmetatable(decode_args(ARGV[11]), {__index = function(t, name)
    local more = decode_args(ARGV[13])
    setmetatable(t, nil)
    for k, v in pairs(more) do
      rawset(t, k, v)
    end
    return rawget(t, name)
  end})
  ctx = setmetatable({names = a.names, token = ARGV[1], ttl = tonumber(ARGV[2]), now = clock()}, {
    __index = function(t, name)
      if name == 'kp' then
        t.kp = a.keyed
        return t.kp
      end
    end})
  function ctx.key(name)
    return KEYS[a.k[name]]
  end
  function ctx.key_at(name, i)
    return KEYS[a.kl[name] + i - 1]
  end
  -- For a due hook that forms one job from others (see merge in the header).
  ctx.job_parts, ctx.job_fields = JOB_PARTS, JOB_FIELDS
  function ctx.merged(name, values)
    local p = has_hook(name, 'merge') and part(name)
    return p and p.merge(ctx, values) or nil
  end
end

-- due
local due_key
if stateful then
  setup()
  due_key = a.k.keydue and KEYS[a.k.keydue]
  if due_key then
    local due = rcall('ZRANGEBYSCORE', due_key, '-inf', now_s, 'LIMIT', 0, 4)
    for _, member in ipairs(due) do
      local name, key_id = string.match(member, '^([^:]+):(.*)$')
      local p = name and part(name)
      ctx.moved = {} -- lib/key_unpark.lua adds each job it gives back
      local next_at = p and p.due and p.due(ctx, key_id)
      for _, item in ipairs(ctx.moved) do
        noted('unparked', item[1], item[2], member)
      end
      ctx.moved = nil
      if trace then trace[#trace + 1] = 'due:' .. member end
      if next_at then
        rcall('ZADD', due_key, next_at, member)
      else
        rcall('ZREM', due_key, member)
      end
    end
  end
end

-- promote
local promote_lib
local function promotion()
  if not promote_lib then
    setup()
-- @include "lib/promote.lua"
    promote_lib = {due = promote_due, next = promote_next}
    a.promote.queues_set = KEYS[a.k.queues_set]
  end
  return promote_lib
end
local function registry_at(i) return KEYS[1 + 3 * N + i] end
local function lock_at(i) return KEYS[a.kl.scheduler_lock + i - 1] end
local function queue_at(i) return KEYS[1 + i] end
if promote and found > 0 then
  for i = 1, N do
    local head = rcall('ZRANGE', registry_at(i), 0, 0, 'WITHSCORES')
    if head[2] and tonumber(head[2]) <= clock() then
      if trace then trace[#trace + 1] = 'promote' end
      local _, by_queue = promotion().due(a.names, queue_at, registry_at, lock_at, ARGV[7], a.promote, clock())
      for q = 1, N do
        if by_queue[q] then
          noted('promoted', q, by_queue[q])
        end
      end
      break
    end
  end
end

local job_prefix, tombstone = ARGV[7], ARGV[8]

-- The job's JOB_FIELDS (by index; nil: absent) out of its hash (HGETALL's flat list), and whether
-- it carries any part's field (JOB_FIELDS beyond the first, status): a job that carries none runs
-- no per-job part, and no taken hook.
local function job_fields(hash)
  local job, carries = {}, false
  for n = 1, #hash, 2 do
    local at = JOB_FIELD_AT[hash[n]]
    if at then
      job[at] = hash[n + 1]
      carries = carries or at > 1
    end
  end
  return job, carries
end

local job_at, job_count, job_order -- JOB_PARTS by name: the first field's index, the count; the order
-- The per-job parts' verdict on job `jid` (job: its JOB_FIELDS as read): nil when every part allows
-- it (their values, for take_job, in `allowed`), else the first refusal. The fetch policies' parts
-- ask first, in registry order (a.order), then any other part with an admit_job (an admission
-- policy's fetch side: loner_next), in part order.
local function admit_job(jid, job, allowed)
  local refusal, refuser
  if not job_at then
    job_at, job_count, job_order = {}, {}, {}
    local ordered = {}
    for _, name in ipairs(a.order) do
      ordered[name] = true
      job_order[#job_order + 1] = name
    end
    for _, item in ipairs(JOB_PARTS) do
      job_at[item[1]], job_count[item[1]] = item[2], item[3]
      if not ordered[item[1]] and has_hook(item[1], 'admit_job') then
        job_order[#job_order + 1] = item[1]
      end
    end
  end
  local at, count = job_at, job_count
  for _, name in ipairs(job_order) do
    local value = at[name] and job[at[name]]
    local p = value and has_hook(name, 'admit_job') and part(name)
    if p then
      local extra = count[name] > 1 and job[at[name] + 1] or nil -- a second field, if it reads two
      if trace then trace[#trace + 1] = 'admit_job:' .. name end
      refusal = p.admit_job(ctx, jid, value, extra)
      if refusal then
        refuser = {name, value, extra}
        break
      end
      allowed[#allowed + 1] = {name, value, extra}
    end
  end
  if refusal then
    -- the job is parked: what the parts held for it (a unit reserved when it was given back) goes,
    -- the refusing part's own included
    allowed[#allowed + 1] = refuser
    for _, item in ipairs(allowed) do
      local p = part(item[1])
      if p.refused then
        p.refused(ctx, jid, item[2], item[3])
      end
    end
  end
  return refusal
end

-- Park job `jid` (just moved to the right end of intermediate list `inter_key`) on its key; or,
-- when the refusing part filed it in a store of its own (`filed`: Fair's line), take it off the list.
local function park(i, inter_key, job_key, jid, refusal)
  rcall('HSET', job_key, 'status', 'deferred')
  rcall('ZADD', key_of(a.keyed.deferred, a.names[i]), clock(), jid)
  if refusal.filed then
    rcall('LREM', inter_key, -1, jid)
    return
  end
  rcall('LMOVE', inter_key, refusal.parked, 'RIGHT', refusal.head and 'LEFT' or 'RIGHT')
  due_key = due_key or KEYS[a.k.keydue] -- the idle answer reports the index's head
  rcall('ZADD', due_key, 'LT', refusal.due, refusal.member)
  noted('parked', i, jid, refusal.member)
end
local parks = 0

-- Take job `jid` (its fields `job`, its per-job parts' values `allowed`) from queue i: run the
-- taken hooks, the takes and take_jobs, record the claim and answer it.
local function took(i, job_key, jid, job, carries, allowed, hash)
  if carries then
    for _, item in ipairs(JOB_PARTS) do
      local name, at = item[1], item[2]
      if job[at] and has_hook(name, 'taken') then
        if trace then trace[#trace + 1] = 'taken:' .. name end
        local values = {}
        for n = 1, item[3] do
          values[n] = job[at + n - 1]
        end
        part(name).taken(job_key, jid, values)
      end
    end
  end
  local got = {}
  if stateful then
    for _, name in ipairs(a.order) do
      local p = has_hook(name, 'take') and part(name)
      if p then
        if trace then trace[#trace + 1] = 'take:' .. name end
        got[name] = p.take(ctx, i, job_key, jid)
      end
    end
  end
  for _, item in ipairs(allowed) do
    if trace then trace[#trace + 1] = 'take_job:' .. item[1] end
    local take_job = part(item[1]).take_job -- optional: an admit_job alone takes nothing (Fair)
    local flag = take_job and take_job(ctx, jid, item[2], item[3]) or 0
    if flag ~= 0 then
      got[item[1]] = flag
    end
  end
  local holds, record = {}, #tostring(i) .. ':' .. i .. #jid .. ':' .. jid
  if next(got) then
    record = {record}
    for _, name in ipairs(a.order) do
      local flag = got[name]
      if flag and flag ~= 0 then
        flag = tostring(flag)
        holds[#holds + 1] = name
        holds[#holds + 1] = flag
        record[#record + 1] = #name .. ':' .. name
        record[#record + 1] = #flag .. ':' .. flag
      end
    end
    record = table.concat(record)
  end
  rcall('SET', claim_key, record, 'EX', ARGV[3])
  note_taken(i, jid, hash)
  if trace then trace[#trace + 1] = 'record' end
  local reply = tell({'queue', i, 'job', jid, 'holds', holds, 'hash', hash})
  if trace then
    reply[#reply + 1] = 'trace'
    reply[#reply + 1] = trace
  end
  return reply
end

local burst = ARGV[5] == '1'
local waiting = 0
local full = {}
local skip_until
for i = pre_i or 1, N do
  local queue_key, inter_key = KEYS[1 + i], KEYS[1 + N + i]
  local verdict, gater = true, nil
  if stateful then
    ctx.q = {}
    for _, name in ipairs(a.order) do
      local p = has_hook(name, 'gate') and part(name)
      if p then
        if trace then trace[#trace + 1] = 'gate:' .. name end
        verdict = p.gate(ctx, i)
        if verdict ~= true then
          gater = name
          break
        end
      end
    end
  end
  if verdict ~= true then
    if type(verdict) == 'number' and (not skip_until or verdict < skip_until) then
      skip_until = verdict
    end
    full[#full + 1] = i
    noted('skipped', i, gater, type(verdict) == 'number' and string.format('%.6f', verdict) or '')
    if burst and rcall('LLEN', queue_key) > 0 then
      waiting = waiting + 1
    end
  else
    local tries = 0
    while tries < 100 and parks < 100 do
      tries = tries + 1
      local jid, hash = pre_jid, pre_hash -- popped (and traced) by the plain pop
      pre_jid, pre_hash = nil, nil
      jid = jid or rcall('LMOVE', queue_key, inter_key, 'LEFT', 'RIGHT')
      if not jid and stateful then
        -- source: the queue's list is empty; a part that keeps jobs of queue i waiting in a store
        -- of its own (Fair's turns) may hand one over, popped as if it came off the list
        for _, name in ipairs(a.order) do
          local p = has_hook(name, 'source') and part(name)
          if p then
            if trace then trace[#trace + 1] = 'source:' .. name end
            jid = p.source(ctx, i)
            if jid then
              rcall('RPUSH', inter_key, jid)
              ctx.sourced = jid -- its part's admit_job knows it came from its own store
              break
            end
          end
        end
      end
      if not jid then
        break
      end
      if trace and not hash then trace[#trace + 1] = 'pop' end
      local job_key = key_of(job_prefix, jid)
      -- The whole hash (handed to the worker) once this call has parked nothing; after a park, the
      -- jobs behind are likely parked too: their policy fields only, the hash of the one taken.
      local job, present, carries
      if parks == 0 then
        hash = hash or rcall('HGETALL', job_key)
        job, carries = job_fields(hash)
        present = #hash > 0
      else
        job = rcall('HMGET', job_key, unpack(JOB_FIELDS))
        present = job[1] or rcall('EXISTS', job_key) == 1
        carries = true
      end
      -- A pending job a later enqueue superseded, brought back by a scheduler whose clock runs
      -- ahead of the server's (lib/pending.lua; the scheduler's write-back carries none of our
      -- fields, so every job is checked): dropped like an id whose hash is gone. A pending job
      -- rewritten in place carries a rewrite guard instead (lib/rewrite_guard.lua).
      local tomb = present and tombs and rcall('GET', key_of(tombstone, jid))
      if tomb then
        if string.sub(tomb, 1, 8) == 'rewrite ' then
          if rewrite_guard(job_key, jid, key_of(tombstone, jid), tomb, clock()) then
            present = false
            found = found + 1 -- back in its scheduled registry: the idle answer reports its time
          else
            hash = rcall('HGETALL', job_key) -- the guard may have restored fields
            job, carries = job_fields(hash)
            present = #hash > 0
          end
        else
          rcall('DEL', job_key)
          present = false
        end
      end
      if present then
        local allowed, refusal = {}, nil
        for _, item in ipairs(carries and JOB_PARTS or allowed) do
          if job[item[2]] and has_hook(item[1], 'admit_job') then
            setup() -- a job under a per-job policy: its checks run
            ctx.i = i
            refusal = admit_job(jid, job, allowed)
            break
          end
        end
        if refusal then
          park(i, inter_key, job_key, jid, refusal)
          parks = parks + 1
          tries = tries - 1 -- a parked job is progress, bounded by `parks`
        else
          return took(i, job_key, jid, job, carries, allowed, hash or rcall('HGETALL', job_key))
        end
      else
        rcall('LREM', inter_key, 1, jid)
      end
    end
    if parks >= 100 then
      -- The per-call bound on parking stopped this pop: nothing taken, look again at once.
      if not skip_until or clock() < skip_until then
        skip_until = clock()
      end
      if burst then
        waiting = waiting + 1
      end
      break
    end
  end
end

-- idle
if trace then trace[#trace + 1] = 'idle' end
if due_key then
  -- An idle worker looks again when a key with parked jobs could free by itself.
  local head = rcall('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  local at = tonumber(head[2])
  if at and (not skip_until or at < skip_until) then
    skip_until = math.max(at, clock())
  end
  if at and burst then
    waiting = waiting + 1 -- parked jobs are work not yet done: a burst worker waits for them
  end
end
if promote and found > 0 then
  -- An idle worker looks again when a scheduled job of its queues comes due (or a live
  -- scheduler's lock turns stale): it waits for that time rather than polling.
  for i = 1, N do
    if rcall('EXISTS', registry_at(i)) == 1 then
      local at = promotion().next(registry_at(i), lock_at(i), a.promote, clock())
      if at and (not skip_until or at < skip_until) then
        skip_until = at
      end
    end
  end
end
local reply = {'waiting', waiting, 'full', full}
if skip_until then
  reply[5] = 'until'
  reply[6] = string.format('%.6f', skip_until)
end
tell(reply)
if trace then
  reply[#reply + 1] = 'trace'
  reply[#reply + 1] = trace
end
return reply
