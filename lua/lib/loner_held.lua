-- Shared: does the job a loner marker names still hold its identity? 'waiting' (queued, scheduled,
-- or deferred with parents that can still release it: lib/holder_waiting.lua; a policy may replace
-- its payload), 'running' (never replaced), or nil (free: the marker is stale, no reaper needed).
-- With until='finished' (p.finished: this call's declaration) a holder taken by a PolicyWorker
-- (field policies_loner_taken) counts as running even before rq marks it started, and a running
-- holder counts when either side asks for until='finished': this call, or the holder itself (its
-- hash says so), so mixed declarations of one function agree on who holds.
-- p: finished, worker_prefix (<prefix>:worker:), alive_prefix (<prefix>:policies:alive:).
-- @include "lib/keys.lua"
-- @include "lib/holder_waiting.lua"
-- @include "lib/holder_running.lua"
local function loner_held(job_prefix, p, holder)
  if holder_waiting(job_prefix, holder) then
    if p.finished and redis.call('HEXISTS', key_of(job_prefix, holder), 'policies_loner_taken') == 1 then
      return 'running'
    end
    return 'waiting'
  end
  if (p.finished or redis.call('HGET', key_of(job_prefix, holder), 'policies_loner_until') == 'finished')
      and holder_running(job_prefix, p.worker_prefix, holder, p.alive_prefix) then
    return 'running'
  end
  return nil
end
