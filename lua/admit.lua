--[[
  Admit one job through every admission policy it is enqueued under, and write it, in one
  atomic step. Every policy's check runs before anything is written: a drop writes nothing but
  its counter, so "nothing is written before the decision" is this script's property, not each
  policy's. Then each policy commits its own state (a marker, a window key, a pending pointer;
  a commit may first drop the pending job this one supersedes), and the job is written exactly
  as rq's enqueue writes it (lib/save_job.lua).

  A policy's part (lua/policies/<name>.lua, included by `-- @policies`) may define:
    check(ctx, p)  -> nil to pass, {who = id, n = number} to drop, {replay = true, n = number}
                      when this very call was already admitted (a retried call whose reply was
                      lost: answered as admitted, nothing written again; with `replaced = id`,
                      answered as the rewrite of job `id` it was, code 3); it may also plan the
                      write (ctx.mode, ctx.score, ctx.dest, ctx.scheduled) and name the pending
                      job this one would supersede (ctx.supersedes); {replace = holder}: the
                      remaining checks run, then the policy's replace rewrites the holder
                      (in a probe, ctx.probe, a check that would replace passes instead)
    replace(ctx, p, holder, fields) -> a check that answered {replace = holder}: rewrite the
                      holder's payload in place with this call's job fields instead of writing
                      a job (Loner(on_conflict='replace'); Debounce and a trailing Throttle, whose
                      holder is the pending job, also its run time); no policy commits then
    commit(ctx, p) -> writes the policy's own state, before the job is written; it may plan the
                      write too (ctx.mode 'D': the hash only, for a part that keeps the job
                      waiting in a store of its own)
    written(ctx, p) -> after the job is written (admitted or forced): a part that keeps the job
                      waiting in a store of its own files it there (its status, rq's registry)
    force(ctx, p)  -> PolicyQueue.force: takes the policy's state whatever it holds
  `p` is the policy's own arguments (a.p[name]); ctx.key(name) is the key passed as `name`.

  KEYS  by name (rq_policies/ops.py): job (rq:job:<id>), dest (the queue list, the scheduled
        registry, or the queue key, unused, for mode D/N), queues (rq:queues), drops
        (rq:policies:drops), drops_minute (the prefix of the per-minute drop counters,
        rq:policies:drops-minute:, to which lib/count_drop.lua appends the server's epoch
        minute), and each policy's keys, named '<policy>.<what>'
  ARGV[1]  one msgpack map (lib/codec.lua):
    jid         the job id ('' in a probe without an explicit id)
    mode        R | L (push to tail / head), S (scheduled at score), D (hash only: deferred),
                N (claim the policies' state only, write no job: Throttle.admit)
    score       epoch seconds the job is scheduled for (mode S), else 0
    ttl         seconds the job hash (and what names it) lives; -1 for no expiry
    queue_key   rq:queue:<q>, added to rq:queues
    job_prefix  rq:job:
    wake        rq:policies:wake:<q>, SPUBLISHed on a push so idle PolicyWorkers wake
    fields      the job hash as a flat field/value list
    order       policy names, in the order their checks run (empty for a job without a policy:
                PolicyQueue's plain enqueue, written as rq writes it, once)
    p           policy name -> that policy's arguments
    drops       policy name -> its field in the drop counters (<policy>:<q>)
    force       true: PolicyQueue.force (no check; every policy's force, then the write)
    probe       true: run the checks only (the fast path for an expected drop); write nothing
                but a drop's counter
    tombstone   rq:policies:superseded: and tombstone_ttl (seconds): the tombstone a superseded
                pending job leaves, and the records of an in-place rewrite (lib/pending.lua)
    payload     the job hash fields derived from the call by the declared policies (a per-key
                policy's key): an in-place rewrite replaces them with the payload (absent: none)
    created     the job's created_at as written in its hash: a job hash already holding this
                very value is this call's own write (a retried call whose reply was lost), so the
                script answers as the first attempt did and writes nothing
    dropped_ttl seconds the drop record lives (lib/drop_record.lua), with KEYS `dropped`
                (rq:policies:dropped:<id>) passed only when the caller chose the job id
    record_ttl  seconds the replay record lives, with KEYS `record` (rq:policies:pushed:<id>)
                passed only for a job whose result_ttl is shorter (rq deletes it soon after it
                runs): the record keeps `created`, so a replay that arrives after rq deleted the
                job writes nothing (it brought the hash back, and the job ran twice)

  A part may also set `clock = false`: it never reads ctx.now, so a call whose every policy says
  so skips the TIME call (ctx.now and the reply's server now are then 0).

  Returns the verdict as named fields, a flat name/value list as HGETALL answers it (decoded in one
  place, rq_policies.admission.Verdict.read); a field at its default is left out:
    code       1 admitted (job = ours; n = the policy's number, e.g. the window's end), 2 admitted
               as a pending trailing job (n = its run time), 3 the holder's payload was replaced in
               place by `policy` (job = the holder; n = its run time for a pending job, else 0),
               0 dropped by `policy` (job = the job that holds the identity; n = e.g. the window's
               end), -1 a probe that found nothing to drop. Always present.
    policy     the policy that dropped, replaced or answered a replay ('')
    job        the job id as above ('')
    n          the deciding policy's number, epoch seconds (0)
    now        the server's clock as the script read it, '%.6f' (absent: 0, no policy read it)
    superseded the pending job this one replaced and deleted ('')
    dropped    a list of (policy, job id) pairs, flat, of pending jobs a force dropped (none)
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/keys.lua"
-- @include "lib/save_job.lua"
-- @include "lib/count_drop.lua"
-- @include "lib/drop_record.lua"

local a = decode_args(ARGV[1])
-- Each part is defined when the call first asks for it (`-- @policies lazy`: load_part(name)
-- defines P[name]), so a call pays for the parts it declares only.
local P, loaded = {}, {}
-- @policies lazy
setmetatable(P, {__index = function(t, name)
  if not loaded[name] then
    loaded[name] = true
    load_part(name)
  end
  return rawget(t, name)
end})

-- The server's clock, read only when some declared policy keeps time (a part that does not sets
-- `clock = false`, as loner does): TIME is one of the few commands a loner admission runs.
local now = 0
for _, name in ipairs(a.order) do
  if P[name].clock ~= false then
    now = server_now()
    break
  end
end
local ctx = {
  jid = a.jid, mode = a.mode, score = a.score or 0, ttl = a.ttl, job_prefix = a.job_prefix,
  now = now, dest = a.k.dest and KEYS[a.k.dest], scheduled = false, code = 1, n = 0,
  superseded = '', dropped = {}, tomb = a.tombstone, tomb_ttl = a.tombstone_ttl, probe = a.probe,
  payload = a.payload, created = a.created,
}
function ctx.key(name)
  return KEYS[a.k[name]]
end

local order = a.order
local nowstr = format_now(now)

-- The reply: the verdict's named fields (see the header), those at their default left out.
local function verdict(code, policy, job, n, superseded, dropped)
  local r = {'code', code}
  if policy and policy ~= '' then r[3] = 'policy'; r[4] = policy end
  if job and job ~= '' then r[#r + 1] = 'job'; r[#r + 1] = job end
  if n and n ~= 0 then r[#r + 1] = 'n'; r[#r + 1] = n end
  if now ~= 0 then r[#r + 1] = 'now'; r[#r + 1] = nowstr end
  if superseded and superseded ~= '' then r[#r + 1] = 'superseded'; r[#r + 1] = superseded end
  if dropped and #dropped > 0 then
    local flat = {}
    for _, item in ipairs(dropped) do
      flat[#flat + 1] = item[1]
      flat[#flat + 1] = item[2]
    end
    r[#r + 1] = 'dropped'; r[#r + 1] = flat
  end
  return r
end

-- A replay of a call that already wrote its job (any policy, forced or not): the job hash holds
-- this very call's creation time, which no other call shares; or, for a job rq deletes as soon as
-- it runs (KEYS `record` passed), the hash is gone and the record beside it holds that time.
if a.created then
  local prior = rcall('HGET', KEYS[a.k.job], 'created_at')
  if prior == a.created or (not prior and a.k.record and rcall('GET', KEYS[a.k.record]) == a.created) then
    local code = 1
    if prior and a.mode ~= 'S' and rcall('HGET', KEYS[a.k.job], 'status') == 'scheduled' then code = 2 end
    return verdict(code, '', ctx.jid, 0, '')
  end
end

if a.force then
  for _, name in ipairs(order) do
    local part = P[name]
    if part.force then part.force(ctx, a.p[name]) end
  end
else
  local replacer, holder
  for _, name in ipairs(order) do
    local found = P[name].check(ctx, a.p[name])
    if found and found.replace then
      replacer, holder = name, found.replace
    elseif found then
      if found.replay then
        if a.probe then return verdict(-1, name, ctx.jid, found.n or 0, '') end
        if found.replaced then return verdict(3, name, found.replaced, found.n or 0, '') end
        return verdict(1, name, ctx.jid, found.n or 0, '')
      end
      count_drop(KEYS[a.k.drops], KEYS[a.k.drops_minute], a.drops[name], now)
      if a.k.dropped then
        record_drop(KEYS[a.k.dropped], name, found.who, found.n or 0, a.queue_key, a.dropped_ttl)
      end
      return verdict(0, name, found.who, found.n or 0, '')
    end
  end
  if a.probe then return verdict(-1, '', '', ctx.n, '') end
  if replacer then
    P[replacer].replace(ctx, a.p[replacer], holder, a.fields)
    return verdict(3, replacer, holder, ctx.n, '')
  end
  for _, name in ipairs(order) do
    local part = P[name]
    if part.commit then part.commit(ctx, a.p[name]) end
  end
end
-- An id the caller chose (KEYS `dropped` is passed only then) may be one a pending job had before a
-- later enqueue superseded it: this job is a new one, so that id's tombstone must not make the
-- fetch drop it.
if a.k.dropped then
  rcall('DEL', key_of(a.tombstone, ctx.jid))
end

if ctx.mode ~= 'N' then
  save_job(KEYS[a.k.job], ctx.dest, KEYS[a.k.queues], a.queue_key, ctx.jid, ctx.mode, ctx.score, ctx.ttl,
           a.fields, a.wake)
  if a.k.record then
    rcall('SET', KEYS[a.k.record], a.created, 'EX', a.record_ttl)
  end
  if ctx.scheduled then
    -- Built as a queued job; one that waits for its run time is a scheduled one, exactly as rq's
    -- schedule_job writes it (no enqueued_at until the scheduler moves it).
    rcall('HSET', KEYS[a.k.job], 'status', 'scheduled')
    rcall('HDEL', KEYS[a.k.job], 'enqueued_at')
  end
  for _, name in ipairs(order) do
    local part = P[name]
    if part.written then part.written(ctx, a.p[name]) end
  end
end
return verdict(ctx.code, '', ctx.jid, ctx.n, ctx.superseded, ctx.dropped)
