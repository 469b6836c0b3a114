--[[
  Policy part: debounce (run the job `wait` seconds after the last enqueue of its identity, with
  the last payload, never later than `max_wait` after the enqueue that started the pending
  period). Times are the server's; run times are whole seconds, as rq's scheduler reads them.

  Keys: debounce.state (rq:policies:debounce:<q>:<digest>, a hash: job = the pending job id,
  first = epoch seconds of the enqueue that started the period), registry (rq:scheduled:<q>).
  Arguments p: wait, max_wait (seconds; 0 for no cap).

  check: never drops; plans the job as scheduled at the debounce time (or the time asked for, if
  later) and names the pending job it supersedes, unless that one's run time has come (rq's
  scheduler may be moving it: it runs, and this enqueue starts a new period). An enqueue reusing
  the pending job's id replaces it in place, like any other.
  commit: the superseded job is dropped (out of the registry, hash deleted) and the state names
  this job until its run time.
  force: a pending debounced job is dropped.
]]
-- @include "lib/pending.lua"
P.debounce = {}

function P.debounce.check(ctx, p)
  local registry = ctx.key('registry')
  local state = rcall('HMGET', ctx.key('debounce.state'), 'job', 'first')
  local pending, first = state[1], tonumber(state[2])
  if pending and pending_at(registry, pending, ctx.now) then
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
  return nil
end

function P.debounce.commit(ctx, p)
  local key = ctx.key('debounce.state')
  if ctx.supersedes then
    drop_pending(ctx.key('registry'), ctx.job_prefix, ctx.supersedes, ctx.now, ctx.tomb, ctx.tomb_ttl, 'debounce', ctx.jid)
    ctx.superseded = ctx.supersedes
  end
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
