-- Shared: is the job whose id a policy key holds still waiting (queued, scheduled or deferred)?
-- A marker whose holder is gone (hash expired or deleted), running, finished, failed or cancelled
-- no longer holds its identity: the caller treats it as free. This is what makes a marker
-- self-healing without a reaper when a job left by a path rq-policies does not hook.
local function holder_waiting(job_prefix, jid)
  if not jid then return false end
  local status = redis.call('HGET', job_prefix .. jid, 'status')
  return status == 'queued' or status == 'scheduled' or status == 'deferred'
end
