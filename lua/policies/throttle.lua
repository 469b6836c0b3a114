--[[
  Policy part: throttle (at most one job per identity per epoch-aligned window of `width`
  seconds, on the server's clock), leading edge and, with p.trailing, the trailing edge.

  Keys: throttle.prefix (rq:policies:throttle:<q>:<digest>:, the window number is appended),
  throttle.trailing (rq:policies:trailing:<q>:<digest>, the pending trailing job), registry
  (rq:scheduled:<q>). Arguments p: width (seconds), trailing (boolean).

  check, leading edge: the window's key naming another job drops this one (n = the window's end);
  naming this very job is a replay.
  check, trailing edge: a held window does not drop the job; it plans the job as the window's
  trailing job, scheduled for the window's end (or the time asked for, if later). A pending
  trailing job of the identity whose run time has not come (rq's scheduler may be moving a due
  one, so a due one runs) is replaced in place: {replace = pending}. The trailing job counts as
  the next window's run: it also takes the next window's key, so an extra in the next window
  queues behind it instead of running right after it. A resend of a call already merged into the
  pending trailing job (its id's merge record, lib/pending.lua) is a replay.
  replace: the pending trailing job takes this call's payload and run time in place
  (rewrite_pending: same id, so the handle the app kept stays valid); the pointer and the next
  window keep naming it.
  commit: the winner takes the window's key until the window ends.
  force: the job takes the current window; a pending trailing job is dropped, and with it the
  next window it had taken.
]]
-- @include "lib/window.lua"
-- @include "lib/set_until.lua"
-- @include "lib/pending.lua"
P.throttle = {}

function P.throttle.check(ctx, p)
  local index, ends = window_at(ctx.now, p.width)
  local key = window_key(ctx.key('throttle.prefix'), index)
  local owner = rcall('GET', key)
  ctx.window = {key = key, index = index, ends = ends}
  ctx.n = ends
  if owner == ctx.jid then
    return {replay = true, n = ends}
  end
  if not p.trailing then
    if owner then return {who = owner, n = ends} end
    return nil
  end
  local registry = ctx.key('registry')
  local merged = merged_into(ctx, 'throttle')
  if merged then
    return {replay = true, replaced = merged, n = tonumber(rcall('ZSCORE', registry, merged)) or ends}
  end
  local pending = rcall('GET', ctx.key('throttle.trailing'))
  if pending and replaceable(registry, ctx.job_prefix, pending, ctx.now) then
    ctx.supersedes = pending
  end
  if owner then
    local run_at = ends
    if ctx.mode == 'S' and ctx.score > run_at then run_at = ctx.score end
    ctx.window.held = true
    ctx.mode, ctx.score, ctx.dest, ctx.scheduled = 'S', run_at, registry, true
    ctx.code, ctx.n = 2, run_at
    if ctx.supersedes and not ctx.probe then return {replace = ctx.supersedes} end
  end
  return nil
end

function P.throttle.replace(ctx, p, holder, fields)
  local w = ctx.window
  rewrite_pending(ctx, holder, fields, ctx.payload, ctx.key('registry'), ctx.score, 'throttle')
  set_until(ctx.key('throttle.trailing'), holder, ctx.score, ctx.now)
  set_until(window_key(ctx.key('throttle.prefix'), w.index + 1), holder, w.ends + p.width, ctx.now)
end

function P.throttle.commit(ctx, p)
  local w = ctx.window
  if not w.held then
    set_until(w.key, ctx.jid, w.ends, ctx.now)
    return
  end
  set_until(ctx.key('throttle.trailing'), ctx.jid, ctx.score, ctx.now)
  set_until(window_key(ctx.key('throttle.prefix'), w.index + 1), ctx.jid, w.ends + p.width, ctx.now)
end

function P.throttle.force(ctx, p)
  local pointer = ctx.key('throttle.trailing')
  local dropped = nil
  if pointer then  -- a trailing throttle: its pending trailing job goes
    local trailing = rcall('GET', pointer)
    if drop_pending(ctx.key('registry'), ctx.job_prefix, trailing, ctx.now, ctx.tomb, ctx.tomb_ttl, 'throttle', ctx.jid) == 1 then
      dropped = trailing
      ctx.dropped[#ctx.dropped + 1] = {'trailing', trailing}
    end
    rcall('DEL', pointer)
  end
  local prefix = ctx.key('throttle.prefix')
  local index, ends = window_at(ctx.now, p.width)
  set_until(window_key(prefix, index), ctx.jid, ends, ctx.now)
  -- The dropped trailing job had taken the next window as its run; that run is gone now.
  local next_key = window_key(prefix, index + 1)
  if dropped and rcall('GET', next_key) == dropped then
    rcall('DEL', next_key)
  end
end

function P.throttle.reset(ctx, p)
  local prefix = ctx.key('throttle.prefix')
  if p.width > 0 then
    local index = window_at(ctx.now, p.width)
    ctx.removed = ctx.removed + rcall('DEL', window_key(prefix, index), window_key(prefix, index + 1))
  end
  local pointer = ctx.key('throttle.trailing')
  ctx.removed = ctx.removed + drop_pending(ctx.key('registry'), ctx.job_prefix, rcall('GET', pointer), ctx.now, ctx.tomb, ctx.tomb_ttl)
  ctx.removed = ctx.removed + rcall('DEL', pointer)
end
