--[[
  Policy part: loner (one waiting job per identity per queue). Included by the framework scripts
  through `-- @policies`; defines functions only.

  Keys: loner.marker (rq:policies:loner:<q>:<digest>), holding the id of the job that waits.
  check: a marker naming another job that still waits drops this one (a marker whose job no
  longer waits is free: no reaper); a marker naming this very job is a replay; the job this one
  supersedes (a pending trailing job it replaces) does not count as a holder.
  commit / force: the job takes the marker (force: unless another waiting job holds it; both then
  wait, which is what "regardless" asks for).
  taken(job_key, jid): at fetch, the job was taken off its queue: free its identity. The job hash
  names its marker (field policies_loner); it is deleted only while it still names this job.
]]
-- @include "lib/holder_waiting.lua"
-- @include "lib/take_marker.lua"
P.loner = {}

function P.loner.check(ctx, p)
  local holder = rcall('GET', ctx.key('loner.marker'))
  if not holder or holder == ctx.supersedes or not holder_waiting(ctx.job_prefix, holder) then
    return nil
  end
  if holder == ctx.jid then
    return {replay = true}
  end
  return {who = holder}
end

function P.loner.commit(ctx, p)
  if ctx.mode ~= 'N' then
    take_marker(ctx.key('loner.marker'), ctx.jid, ctx.ttl)
  end
end

function P.loner.force(ctx, p)
  local marker = ctx.key('loner.marker')
  local holder = rcall('GET', marker)
  if not (holder and holder ~= ctx.jid and holder_waiting(ctx.job_prefix, holder)) then
    take_marker(marker, ctx.jid, ctx.ttl)
  end
end

function P.loner.taken(job_key, jid)
  local marker = rcall('HGET', job_key, 'policies_loner')
  if marker and rcall('GET', marker) == jid then
    rcall('DEL', marker)
  end
end

function P.loner.reset(ctx, p)
  ctx.removed = ctx.removed + rcall('DEL', ctx.key('loner.marker'))
end
