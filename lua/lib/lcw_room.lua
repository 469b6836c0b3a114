-- Shared: the free room of a LimitedCapacityWorker class.
-- Needs lib/ledger_count.lua (the running ledger is a hold ledger).
-- Room = max_running_jobs - live holds in the running ledger - jobs still waiting to start.
-- Expired holds (a killed job) are purged under the server's clock, and a queued entry whose job
-- hash is gone or has ended (deleted, cancelled, failed before it started) is pruned (a job still
-- waits in rq 3's ready_to_enqueue and rate_limited too: rq_policies/compat.py STATUS_ROLE), so the
-- count heals by itself. A job whose status is `started` but which has not reached its start
-- script yet still counts: it is about to move into the ledger.
-- @include "lib/keys.lua"
local function lcw_room(running, queued, job_prefix, max, now)
  local live = ledger_count(running, now)
  local waiting = redis.call('ZRANGE', queued, 0, -1)
  for _, jid in ipairs(waiting) do
    local status = redis.call('HGET', key_of(job_prefix, jid), 'status')
    if status ~= 'queued' and status ~= 'scheduled' and status ~= 'deferred' and status ~= 'started'
        and status ~= 'ready_to_enqueue' and status ~= 'rate_limited' then
      redis.call('ZREM', queued, jid)
    end
  end
  return max - live - redis.call('ZCARD', queued)
end
