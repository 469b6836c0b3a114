-- Shared: is the job whose id a policy key holds running now, in a process that is still alive?
-- A job is started while a worker runs it; its hash names that worker (worker_name, written by
-- rq when the job starts), and the worker's key (rq:worker:<name>) lives only as long as its
-- heartbeats keep it (job_monitoring_interval + 60 s after the last one, rq's own TTL). A
-- PolicyWorker's work horse can outlive its worker (the worker SIGKILLed alone or by its process
-- group: rq gives the horse a group of its own), so a started job also counts while its liveness
-- key (alive_prefix .. jid, rq:policies:alive:<id>) exists: the worker's hold guard keeps it every
-- third of hold_ttl for as long as the horse lives (lua/keep_horse.lua). A started job with
-- neither (everything SIGKILLed, its machine lost) stops counting within the longer of the two
-- ttls, even before rq's maintenance marks it failed: no reaper needed.
-- @include "lib/keys.lua"
local function holder_running(job_prefix, worker_prefix, jid, alive_prefix)
  local job = redis.call('HMGET', key_of(job_prefix, jid), 'status', 'worker_name')
  if job[1] ~= 'started' then return false end
  if job[2] and job[2] ~= '' and redis.call('EXISTS', key_of(worker_prefix, job[2])) == 1 then
    return true
  end
  return redis.call('EXISTS', key_of(alive_prefix, jid)) == 1
end
