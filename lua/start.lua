--[[
  Start a job a PolicyWorker's fetch took, if the take is still that worker's: the question
  lua/claim_start.lua answers and the start it guards, in one step, riding the pipeline on which rq
  writes the job's execution and the worker's busy state (rq's prepare_execution). A take whose
  claim lapsed (the worker stopped or starved for its whole hold ttl between its fetch and here) may
  have been handed back to its queue (lua/hand_back.lua), and another worker may run the job: then
  nothing is written and this worker does not start it. Once the execution exists no hand-back takes
  the job (it skips a job with a live execution).

  The start is what rq's own prepare_job_execution writes, field for field (Job.prepare_for_execution
  and Job.heartbeat: last_heartbeat, status, started_at, worker_name; on rq 3 a PERSIST of the job's
  hash), and the id comes off the queue's intermediate list; the take goes with it. rq's reader sees an
  ordinary started job.

  Safe to run twice: a replay finds the take gone and the fetch's claim record (kept until the job has
  run) still there, or, the record lapsed meanwhile (a long outage), the job started by this worker, and
  writes the start again (the worker's replay carries its new start time).

  KEYS
    1  rq:policies:taken:<queue>   HASH job id -> '<claim token> <enqueued_at>' (lua/fetch.lua)
    2  rq:policies:claim:<token>   the fetch's claim record
    3  rq:job:<id>                 the job's hash
    4  rq:queue:<queue>:intermediate
  ARGV
    1  the job id
    2  the claim token
    3  the start time, as rq formats it (started_at and last_heartbeat)
    4  the worker's name
    5  '1' to PERSIST the job's hash (rq 3), '0' not (rq 2.12)

  A job whose stop another job's admission asked before this start (its field policies_cancelled_by,
  rq_policies.engine.keys.STOP_ASKED_FIELD; Loner(on_conflict='cancel') writes it, and PUBLISHes
  rq's stop-job command only for a job already started, which rq ignores before that) is started all
  the same, so that the worker ends it as rq ends a stopped job (its holds given back on that end),
  and the answer names the asking job instead of 1: the worker does not run it.

  Returns 1 when the take was this worker's and the job is started, the id of the job that asked its
  stop when it must not run (started, to be ended stopped), else 0.
]]
local entry = redis.call('HGET', KEYS[1], ARGV[1])
local ours
if entry then
  ours = string.sub(entry, 1, #ARGV[2] + 1) == ARGV[2] .. ' '
else
  -- No take: this start ran already (a replay), or the takes' hash expired (no take on the queue for an
  -- hour), or the job was handed back. The claim record, or the job started by this worker, says it is ours.
  ours = redis.call('EXISTS', KEYS[2]) == 1
  if not ours then
    local started = redis.call('HMGET', KEYS[3], 'status', 'worker_name')
    ours = started[1] == 'started' and started[2] == ARGV[4]
  end
end
if not ours then
  return 0
end
redis.call('HSET', KEYS[3], 'last_heartbeat', ARGV[3], 'status', 'started', 'started_at', ARGV[3],
  'worker_name', ARGV[4])
if ARGV[5] == '1' then
  redis.call('PERSIST', KEYS[3])
end
redis.call('LREM', KEYS[4], 1, ARGV[1])
if entry then
  redis.call('HDEL', KEYS[1], ARGV[1])
end
local stop_asked = redis.call('HGET', KEYS[3], 'policies_cancelled_by')
if stop_asked and stop_asked ~= '' then
  return stop_asked
end
return 1
