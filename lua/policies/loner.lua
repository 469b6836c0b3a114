--[[
  Policy part: loner (one job per identity per queue: while it waits, or with until='finished'
  from the enqueue until the job ends). Included by the framework scripts through `-- @policies`;
  defines functions only.

  Keys: loner.marker (rq:policies:loner:<q>:<digest>), holding the id of the job that holds it.
  Arguments p (each absent for the default): finished (true: until='finished'), conflict ('drop',
  'raise', 'replace', 'keep_last' or 'cancel'), next_key ('<queue>:<digest>', keep_last and
  cancel), stop_channel (rq's worker command channel before the worker's name, rq:pubsub:) and
  stop_command ('stop-job'), cancel only,
  worker_prefix (<prefix>:worker:) and alive_prefix
  (<prefix>:policies:alive:), both always given (rq's key prefix is the caller's to know), ttl_ms
  (Loner(ttl=N): the marker lives at most N seconds from the enqueue, whatever the holder does;
  the job hash then carries policies_loner_ttl, so taken() keeps that expiry).

  A marker's holder holds the identity while it waits (queued, scheduled, or deferred with
  parents that can still release it: lib/holder_waiting.lua); with until='finished' also while
  it runs on a live worker or in a live horse (lib/holder_running.lua; also when the holder itself was admitted with
  until='finished', whatever this call declares). A marker whose holder does neither is free:
  no reaper, no marker blocks forever. A holder taken by a PolicyWorker under until='finished'
  (field policies_loner_taken) counts as running even before rq marks it started.

  check: a marker naming another job that holds drops this one (a 'raise' is a drop too: the
  caller raises); with conflict 'replace' or 'keep_last' and a holder still waiting (not taken),
  the check answers {replace = holder} instead, and in a probe passes (the full path replaces).
  With conflict 'keep_last' (until='finished' only) and a holder running, the check passes and
  notes the holder (ctx.loner_next): this job is admitted, takes the marker, and written() names
  the running holder and the identity in its field policies_loner_next ('<holder> <next_key>',
  p.next_key = '<queue>:<digest>'), which the fetch reads (lua/policies/loner_next.lua: the job
  is parked while that holder still holds, and given back when it ends). A
  naming this very job is a replay; the job this one supersedes (a pending trailing job it
  replaces) does not count as a holder.
  replace(ctx, p, holder, fields): rewrite the waiting holder's payload in place (data,
  description, meta of this call's job fields, and the call-derived fields of the declared
  policies, ctx.payload: a per-key policy's key; same id, same place in its queue) and name this
  call's job in the holder's policies_replaced_by. Writes the same values when replayed.
  With conflict 'cancel': as 'keep_last', and written() also stops the running holder: names
  this job in the holder's policies_cancelled_by and, when the holder is started on a worker
  (status started, worker_name), PUBLISHes rq's stop-job command for the holder's id on that
  worker's channel (rq.command.send_stop_job_command's JSON, p.stop_channel .. worker_name). A
  channel is not a key (a script may publish on any; on a Redis Cluster the message reaches every
  node's subscribers). The worker acts only while it runs that very job, so a stop sent again
  never hits another job. A holder taken but not yet started gets no stop (rq would ignore it):
  its start (lua/start.lua) reads the field and the worker ends it stopped without running it.
  written(ctx, p): keep_last or cancel behind a running holder: the field above (a replay of the
  call is answered by admit.lua before any check, so it writes nothing twice, and sends no
  second stop).
  commit / force: the job takes the marker (force: unless another holder holds it; both then
  run, which is what "regardless" asks for).
  taken(job_key, jid, job): at fetch, the job was taken off its queue (job: its `fields` as the
  fetch read them, else read here). until='started' (no field
  policies_loner_until): free its identity. until='finished': mark it taken and make the marker
  live as long as the job hash, which rq persists when the job starts (unless it has a cap,
  policies_loner_ttl: it keeps expiring then). The job hash names its
  marker (field policies_loner); it is deleted only while it still names this job.
]]
-- @include "lib/keys.lua"
-- @include "lib/loner_held.lua"
-- @include "lib/take_marker.lua"
-- clock = false: never reads ctx.now (a loner-only admission skips TIME); fields: what taken() reads
P.loner = {clock = false, fields = {'policies_loner', 'policies_loner_until', 'policies_loner_ttl'}}

function P.loner.check(ctx, p)
  local holder = rcall('GET', ctx.key('loner.marker'))
  if not holder or holder == ctx.supersedes then
    return nil
  end
  local held = loner_held(ctx.job_prefix, p, holder)
  if not held then
    return nil
  end
  if holder == ctx.jid then
    return {replay = true}
  end
  if (p.conflict == 'replace' or p.conflict == 'keep_last' or p.conflict == 'cancel') and held == 'waiting' then
    if ctx.probe then return nil end
    return {replace = holder}
  end
  if p.conflict == 'keep_last' or p.conflict == 'cancel' then
    -- the holder runs: this job is admitted as the one waiting behind it (written() names it), and
    -- takes the marker, so the next enqueue replaces this one's payload
    ctx.loner_next = holder
    return nil
  end
  return {who = holder}
end

local LONER_PAYLOAD = {'data', 'description', 'meta'}

function P.loner.replace(ctx, p, holder, fields)
  local key = key_of(ctx.job_prefix, holder)
  local new = {}
  for i = 1, #fields - 1, 2 do
    new[fields[i]] = fields[i + 1]
  end
  local set = {'policies_replaced_by', ctx.jid}
  local names = {unpack(LONER_PAYLOAD)}
  for _, name in ipairs(ctx.payload or {}) do names[#names + 1] = name end  -- a per-key policy's key
  for _, name in ipairs(names) do
    if new[name] then
      set[#set + 1] = name
      set[#set + 1] = new[name]
    else
      rcall('HDEL', key, name)
    end
  end
  rcall('HSET', key, unpack(set))
end

function P.loner.commit(ctx, p)
  if ctx.mode ~= 'N' then
    take_marker(ctx.key('loner.marker'), ctx.jid, ctx.ttl, p.ttl_ms, ctx.mode == 'D')
  end
end

function P.loner.written(ctx, p)
  if ctx.loner_next then
    -- keep_last: the fetch parks this job while the running holder holds (lua/policies/loner_next.lua)
    rcall('HSET', key_of(ctx.job_prefix, ctx.jid), 'policies_loner_next', ctx.loner_next .. ' ' .. p.next_key)
    if p.stop_channel then
      -- cancel: stop the running holder through rq's stop-job command, on its worker's channel
      local holder_key = key_of(ctx.job_prefix, ctx.loner_next)
      local run = rcall('HMGET', holder_key, 'status', 'worker_name')
      rcall('HSET', holder_key, 'policies_cancelled_by', ctx.jid)
      if run[1] == 'started' and run[2] and run[2] ~= '' then
        rcall('PUBLISH', key_of(p.stop_channel, run[2]), cjson.encode({command = p.stop_command, job_id = ctx.loner_next}))
      end
    end
  end
end

function P.loner.force(ctx, p)
  local marker = ctx.key('loner.marker')
  local holder = rcall('GET', marker)
  if not (holder and holder ~= ctx.jid and loner_held(ctx.job_prefix, p, holder)) then
    take_marker(marker, ctx.jid, ctx.ttl, p.ttl_ms, ctx.mode == 'D')
  end
end

function P.loner.taken(job_key, jid, job)
  job = job or rcall('HMGET', job_key, 'policies_loner', 'policies_loner_until', 'policies_loner_ttl')
  local marker = job[1]
  if not marker or rcall('GET', marker) ~= jid then
    return
  end
  if job[2] == 'finished' then
    rcall('HSET', job_key, 'policies_loner_taken', '1')
    if not job[3] then  -- Loner(ttl=N): the marker keeps its cap
      rcall('PERSIST', marker)
    end
  else
    rcall('DEL', marker)
  end
end

function P.loner.reset(ctx, p)
  ctx.removed = ctx.removed + rcall('DEL', ctx.key('loner.marker'))
end
