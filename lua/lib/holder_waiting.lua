-- Shared: is the job whose id a policy key holds still waiting, and able to run some day?
-- A job queued or scheduled waits, and so do rq 3's ready_to_enqueue (a released dependent between
-- its deferred registry and its queue: rq's ReadyJobRegistry pushes it, at once or, when that
-- drain failed, at its next cleanup) and rate_limited (waiting for a slot of its RateLimit).
-- A deferred job waits only while each of its parents can still release it: a parent that failed,
-- was stopped or cancelled (or whose hash is gone) never does, unless the job allows dependency
-- failures, so a deferred child of a failed parent (rq leaves it deferred for good) holds nothing.
-- A marker whose holder is gone (hash expired or deleted), created but never enqueued, running,
-- finished, failed, stopped or cancelled no longer holds its identity either: the caller treats it
-- as free. This is what makes a marker self-healing without a reaper. Every status of rq 2.12 and
-- 3.x is classified in rq_policies/compat.py (STATUS_ROLE); tests/test_rq_contract.py holds this
-- function to it.
-- @include "lib/keys.lua"
local function holder_waiting(job_prefix, jid)
  if not jid then return false end
  local job = redis.call('HMGET', key_of(job_prefix, jid), 'status', 'dependency_ids', 'allow_dependency_failures')
  local status = job[1]
  if status == 'queued' or status == 'scheduled' or status == 'ready_to_enqueue'
      or status == 'rate_limited' then
    return true
  end
  if status ~= 'deferred' then return false end
  if not job[2] or job[3] == '1' then return true end
  for _, parent in ipairs(cjson.decode(job[2])) do
    local parent_status = redis.call('HGET', key_of(job_prefix, parent), 'status')
    if not parent_status or parent_status == 'failed' or parent_status == 'stopped'
        or parent_status == 'canceled' then
      return false
    end
  end
  return true
end
