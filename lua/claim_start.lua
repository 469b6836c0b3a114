--[[
  Is the take of a job a PolicyWorker's fetch took still that worker's, now that the worker has
  written the job's execution (rq's prepare_execution, the pipeline this rides)? A take whose claim
  lapsed (a worker stopped or starved for its whole hold ttl between its fetch and here) may have
  been handed back to its queue (lua/hand_back.lua), and another worker may run the job: this one
  must not start it then. Once the execution exists no hand-back takes the job (it skips a job with
  a live execution), so the answer holds until the job starts. Reads only: safe to run twice.

  KEYS
    1  rq:policies:taken:<queue>   HASH job id -> '<claim token> <enqueued_at>' (lua/fetch.lua)
  ARGV
    1  the job id
    2  the claim token

  Returns 1 when the take is still this worker's, else 0.
]]
local entry = redis.call('HGET', KEYS[1], ARGV[1])
if entry and string.sub(entry, 1, #ARGV[2] + 1) == ARGV[2] .. ' ' then
  return 1
end
return 0
