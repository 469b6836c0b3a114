--[[
  Is the take of a job a PolicyWorker's fetch took still that worker's, now that the worker has
  written the job's execution (rq's prepare_execution, the pipeline this rides)? A take whose claim
  lapsed (a worker stopped or starved for its whole hold ttl between its fetch and here) may have
  been handed back to its queue (lua/hand_back.lua), and another worker may run the job: this one
  must not start it then. Once the execution exists no hand-back takes the job (it skips a job with
  a live execution), so the answer holds until the job starts. Reads only: safe to run twice.

  KEYS
    1  rq:policies:taken:<queue>   HASH job id -> '<claim token> <enqueued_at>' (lua/fetch.lua)
    2  rq:policies:claim:<token>   the fetch's claim record
  ARGV
    1  the job id
    2  the claim token

  Returns 1 when the take is still this worker's, else 0. A take found gone with its claim record
  still there was not handed back (a hand-back needs the record gone): the takes' hash expired
  (no take on the queue for an hour), and the job is still this worker's.
]]
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if entry then
  return string.sub(entry, 1, #ARGV[2] + 1) == ARGV[2] .. ' ' and 1 or 0
end
return redis.call('EXISTS', KEYS[2])
