--[[
  Policy part: loner_next, the fetch side of Loner(until='finished', on_conflict='keep_last'):
  the job admitted while its identity's holder runs waits behind that holder, and never starts
  beside it. Not a policy of its own (no class registers the name): a part the fetch runs for a
  job carrying its field, as it runs a per-job policy's. Included by the framework scripts
  through `-- @policies`; defines functions only.

  The field policies_loner_next = '<holder id> <queue>:<digest>' is written by loner's written()
  (lua/policies/loner.lua) on the job admitted behind a running holder; '<queue>:<digest>' is the
  key id of its parked list, rq:policies:keyparked:loner_next:<queue>:<digest> (ctx.kp.parked),
  and of its member 'loner_next:<queue>:<digest>' of the due index (rq:policies:keydue): the
  per-key policies' parking (lua/fetch.lua's header, lib/key_unpark.lua).

  The holder blocks while it holds its identity as Loner until='finished' counts it
  (lib/loner_held.lua: waiting, e.g. a retry; taken by a PolicyWorker; started on a live worker
  or in a live horse), so a holder whose worker died stops blocking within the same liveness
  bound as the marker itself (no reaper). At most one job waits per identity (the marker names
  it; a later enqueue replaces its payload in place), so a parked list holds one live id.

  Hooks:
    admit_job(ctx, jid, raw) -> nil when the holder no longer holds (the job starts); else a
      refusal: the job is parked on its key, due again in POLL seconds (the holder's end makes
      it due at once: lua/release_markers.lua)
    due(ctx, key_id) -> the key came due: give the parked job back to its queue (lib/key_unpark.lua:
      status queued, at the front, its queue's idle PolicyWorkers woken) once its holder no longer
      holds; returns the next time to look, or nil (nothing parked)
  ctx.kp: the per-key prefixes (rq_policies.engine.keyed.keyed_args: job, worker, alive, parked...).
]]
-- @include "lib/keys.lua"
-- @include "lib/loner_held.lua"
-- @include "lib/key_unpark.lua"
P.loner_next = {fields = {'policies_loner_next'}}

-- Seconds a parked job waits before its holder is looked at again when no end made it due: the
-- holder's worker died (its liveness bound ends within 90 s by default) or its end went unseen.
local LONER_NEXT_POLL = 5

local function ln_parse(raw)
  return string.match(raw or '', '^(%S+) (.+)$')
end

local function ln_blocks(ctx, holder)
  return loner_held(ctx.kp.job, {finished = true, worker_prefix = ctx.kp.worker, alive_prefix = ctx.kp.alive},
    holder) ~= nil
end

function P.loner_next.admit_job(ctx, jid, raw)
  local holder, key_id = ln_parse(raw)
  if not holder or holder == jid or not ln_blocks(ctx, holder) then
    return nil
  end
  return {parked = key_of(ctx.kp.parked, 'loner_next', key_id), member = 'loner_next:' .. key_id,
          due = ctx.now + LONER_NEXT_POLL, head = false}
end

function P.loner_next.due(ctx, key_id)
  local parked, raw, stop, due = key_due_start(ctx, 'loner_next', key_id)
  if stop then
    return due
  end
  local holder = ln_parse(raw)
  if holder and ln_blocks(ctx, holder) then
    return ctx.now + LONER_NEXT_POLL
  end
  key_unpark(ctx, parked, 1, 'policies_loner_next', function() end)
  return redis.call('LLEN', parked) > 0 and ctx.now or nil
end
