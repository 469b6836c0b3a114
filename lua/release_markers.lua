--[[
  Free the loner identities these jobs hold, because they stopped waiting (deleted,
  cancelled, removed from their queue, or their queue emptied). Each job hash names its own
  marker (field policies_loner); the marker is deleted only while it still names that job, so a
  late release never frees an identity that a newer job holds.

  With `ended` (the worker's end-of-run pipeline, PolicyWorker.cleanup_execution, where this runs
  as the last command): a run ended; the marker goes only when the job no longer waits or runs
  (finished, failed, stopped, cancelled, or gone), so a job retried or repeated keeps its
  identity (Loner until='finished').

  KEYS  none: each marker is named by its job's hash (written there by the admission, which had
        the key in KEYS)
  ARGV[1]  msgpack map: job_prefix (rq:job:), jobs (the job ids), ended (true: see above)

  Returns how many markers were deleted.
]]
local rcall = redis.call
-- @include "lib/codec.lua"
-- @include "lib/keys.lua"
local a = decode_args(ARGV[1])
local removed = 0
-- waiting or running (rq_policies/compat.py STATUS_ROLE: rq 3 adds ready_to_enqueue, rate_limited)
local holding = {queued = true, scheduled = true, deferred = true, started = true,
                 ready_to_enqueue = true, rate_limited = true}
for _, jid in ipairs(a.jobs) do
  local job = rcall('HMGET', key_of(a.job_prefix, jid), 'policies_loner', 'status')
  local marker = job[1]
  if marker and not (a.ended and holding[job[2]]) and rcall('GET', marker) == jid then
    removed = removed + rcall('DEL', marker)
  end
end
return removed
