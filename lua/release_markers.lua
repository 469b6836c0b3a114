--[[
  Free the loner identities these jobs hold, because they stopped waiting (deleted,
  cancelled, removed from their queue, or their queue emptied). Each job hash names its own
  marker (field policies_loner); the marker is deleted only while it still names that job, so a
  late release never frees an identity that a newer job holds.

  With `ended` (the worker's end-of-run pipeline, PolicyWorker.cleanup_execution, where this runs
  as the last command): a run ended; the marker goes only when the job no longer waits or runs
  (finished, failed, stopped, cancelled, or gone), so a job retried or repeated keeps its
  identity (Loner until='finished').

  Loner(on_conflict='keep_last'): the marker may name the job waiting behind this one (its field
  policies_loner_next = '<this id> <queue>:<digest>', lua/policies/loner_next.lua). When this job
  ended for good, that waiting job's key is made due now in the due index (KEYS `keydue`) and its
  queue's idle PolicyWorkers are woken (ARGV `wake`): the next fetch gives it back to its queue
  (a fetch that pops it before then finds this job no longer holding and takes it). A waiting job
  released without running (deleted, cancelled) gives the identity back to the job it waited
  behind while that one still waits or runs, so the next enqueue waits behind it again.

  Replay-safe: a replay finds the marker already gone (or given back), and making a key due now
  or waking workers twice does nothing more.

  KEYS  the job hashes (a Redis Cluster routes a script by its keys; the script reads them by
        prefix and id), and with `ended` the due index rq:policies:keydue (named `keydue`)
  ARGV[1]  msgpack map: job_prefix (rq:job:), jobs (the job ids), ended (true: see above), wake
           (rq:policies:wake:, with ended)

  Returns how many markers were deleted.
]]
local rcall = redis.call
-- @include "lib/codec.lua"
-- @include "lib/keys.lua"
-- @include "lib/server_time.lua"
local a = decode_args(ARGV[1])
local removed = 0
-- waiting or running (rq_policies/compat.py STATUS_ROLE: rq 3 adds ready_to_enqueue, rate_limited)
local holding = {queued = true, scheduled = true, deferred = true, started = true,
                 ready_to_enqueue = true, rate_limited = true}
for _, jid in ipairs(a.jobs) do
  local job = rcall('HMGET', key_of(a.job_prefix, jid), 'policies_loner', 'status', 'policies_loner_next')
  local marker = job[1]
  if marker and not (a.ended and holding[job[2]]) then
    local holder = rcall('GET', marker)
    if holder == jid then
      removed = removed + rcall('DEL', marker)
      local behind = string.match(job[3] or '', '^(%S+) ')
      if not a.ended and behind and holding[rcall('HGET', key_of(a.job_prefix, behind), 'status')] then
        rcall('SET', marker, behind) -- the job it waited behind holds again (loner_held judges it)
      end
    elseif holder and a.ended and a.k and a.k.keydue then
      local next = rcall('HMGET', key_of(a.job_prefix, holder), 'policies_loner_next', 'origin')
      local behind, key_id = string.match(next[1] or '', '^(%S+) (.+)$')
      if behind == jid then
        rcall('ZADD', KEYS[a.k.keydue], server_now(), 'loner_next:' .. key_id)
        if next[2] then
          rcall('SPUBLISH', key_of(a.wake, next[2]), 'released')
        end
      end
    end
  end
end
return removed
