-- Shared: is the job whose id a policy key holds running now, on a worker that is still alive?
-- A job is started while a worker runs it; its hash names that worker (worker_name, written by
-- rq when the job starts), and the worker's key (rq:worker:<name>) lives only as long as its
-- heartbeats keep it (job_monitoring_interval + 60 s after the last one, rq's own TTL). A started
-- job whose worker key is gone (the worker was SIGKILLed, its machine lost) therefore stops
-- counting within that bound, even before rq's maintenance marks it failed: no reaper needed.
local function holder_running(job_prefix, worker_prefix, jid)
  local job = redis.call('HMGET', job_prefix .. jid, 'status', 'worker_name')
  if job[1] ~= 'started' or not job[2] or job[2] == '' then return false end
  return redis.call('EXISTS', worker_prefix .. job[2]) == 1
end
