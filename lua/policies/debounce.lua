--[[
  Policy part: debounce (run the job `wait` seconds after the last enqueue of its identity, with
  the last payload, never later than `max_wait` after the enqueue that started the pending
  period). Times are the server's; run times are whole seconds, as rq's scheduler reads them.

  Keys: debounce.state (rq:policies:debounce:<q>:<digest>, a hash: job = the pending job id,
  first = epoch seconds of the enqueue that started the period), registry (rq:scheduled:<q>).
  Arguments p: wait, max_wait (seconds; 0 for no cap).

  check: never drops; plans the job as scheduled at the debounce time (or the time asked for, if
  later). A pending job whose run time has not come (and whose hash is there) is replaced in place:
  the check answers {replace = pending}. One whose time has come is left alone (rq's scheduler
  may be moving it: it runs, and this enqueue starts a new period). A resend of a call already
  merged into the pending job (its id's merge record, lib/pending.lua) is a replay: {replay,
  replaced = that job}.
  replace: the pending job takes this call's payload and run time in place (rewrite_pending: same
  id, so the handle the app kept stays valid); the state keeps naming it, until its new run time.
  commit: a new pending period: the state names this job until its run time.
  force: a pending debounced job is dropped.
]]
-- @include "lib/pending.lua"
P.debounce = {}

function P.debounce.check(ctx, p)
  local registry = ctx.key('registry')
  local merged = merged_into(ctx, 'debounce')
  if merged then
    return {replay = true, replaced = merged, n = tonumber(rcall('ZSCORE', registry, merged)) or 0}
  end
  local state = rcall('HMGET', ctx.key('debounce.state'), 'job', 'first')
  local pending, first = state[1], tonumber(state[2])
  if pending and replaceable(registry, ctx.job_prefix, pending, ctx.now) then
    ctx.supersedes = pending
  else
    first = ctx.now
  end
  if not first then first = ctx.now end
  local run_at = ctx.now + p.wait
  if p.max_wait > 0 and first + p.max_wait < run_at then
    run_at = first + p.max_wait
  end
  run_at = math.ceil(run_at)
  if ctx.score > run_at then run_at = ctx.score end
  ctx.debounce_first = first
  ctx.mode, ctx.score, ctx.dest, ctx.n = 'S', run_at, registry, run_at
  if ctx.supersedes and not ctx.probe then
    return {replace = ctx.supersedes}
  end
  return nil
end

function P.debounce.replace(ctx, p, holder, fields)
  rewrite_pending(ctx, holder, fields, ctx.payload, ctx.key('registry'), ctx.score, 'debounce')
  local key = ctx.key('debounce.state')
  local ms = math.ceil((ctx.score - ctx.now) * 1000)
  if ms < 1 then ms = 1 end
  rcall('PEXPIRE', key, ms)
end

function P.debounce.commit(ctx, p)
  local key = ctx.key('debounce.state')
  rcall('HSET', key, 'job', ctx.jid, 'first', string.format('%.6f', ctx.debounce_first))
  -- The pointer means nothing once the job's time has come (it can no longer be replaced).
  local ms = math.ceil((ctx.score - ctx.now) * 1000)
  if ms < 1 then ms = 1 end
  rcall('PEXPIRE', key, ms)
end

function P.debounce.force(ctx, p)
  local key = ctx.key('debounce.state')
  local pending = rcall('HGET', key, 'job')
  if drop_pending(ctx.key('registry'), ctx.job_prefix, pending, ctx.now, ctx.tomb, ctx.tomb_ttl, 'debounce', ctx.jid) == 1 then
    ctx.dropped[#ctx.dropped + 1] = {'debounced', pending}
  end
  rcall('DEL', key)
end

function P.debounce.reset(ctx, p)
  local key = ctx.key('debounce.state')
  ctx.removed = ctx.removed + drop_pending(ctx.key('registry'), ctx.job_prefix, rcall('HGET', key, 'job'), ctx.now, ctx.tomb, ctx.tomb_ttl)
  ctx.removed = ctx.removed + rcall('DEL', key)
end
