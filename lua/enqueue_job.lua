--[[
  Admit a job through its Loner policy and write it, in one atomic step.

  The marker test, the job hash and the queue push (or scheduled-registry add) happen together, so
  any number of producers enqueuing one payload at once make exactly one job. A marker whose
  holder is no longer waiting is treated as free and replaced. A job without a Loner passes
  straight through (ARGV[7] = 0), which keeps one script per door.

  KEYS[1]  job hash               rq:job:<id>
  KEYS[2]  destination            rq:queue:<q> (mode R/L), rq:scheduled:<q> (mode S), unused (mode D)
  KEYS[3]  queues set             rq:queues
  KEYS[4]  loner marker           rq:policies:loner:<q>:<digest>
  KEYS[5]  drop counters          rq:policies:drops

  ARGV[1]  job id
  ARGV[2]  mode                   R | L | S | D (see includes/save_job.lua)
  ARGV[3]  score                  epoch seconds the job is scheduled for (mode S), else 0
  ARGV[4]  ttl                    seconds the job hash lives (and its marker with it); -1 for no expiry
  ARGV[5]  queue key              rq:queue:<q>, added to rq:queues
  ARGV[6]  job key prefix         rq:job:
  ARGV[7]  loner                  1 to apply the Loner check, 0 to admit unconditionally
  ARGV[8]  drop counter field     loner:<q>
  ARGV[9]  wake channel           rq:policies:wake:<q>; published on a push so idle PolicyWorkers wake
  ARGV[10] job hash              field/value pairs as one length-prefixed blob (includes/unpack_fields.lua),
                                 with the policies_loner field when ARGV[7] = 1

  Returns {1, job id} when admitted, {0, holder id} when dropped.
]]
local rcall = redis.call
local jid = ARGV[1]
local mode = ARGV[2]
local score = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local queue_key = ARGV[5]
local job_prefix = ARGV[6]
local loner = ARGV[7] == '1'

-- @include "includes/waiting.lua"
-- @include "includes/save_job.lua"
-- @include "includes/unpack_fields.lua"

if loner then
  local holder = rcall('GET', KEYS[4])
  if holder and holder ~= jid and holder_waiting(job_prefix, holder) then
    rcall('HINCRBY', KEYS[5], ARGV[8], 1)
    return {0, holder}
  end
  -- Free, stale, or our own (a replayed call): take it.
  take_marker(KEYS[4], jid, ttl)
end

save_job(KEYS[1], KEYS[2], KEYS[3], queue_key, jid, mode, score, ttl, unpack_fields(ARGV[10]))
if mode == 'R' or mode == 'L' then
  rcall('PUBLISH', ARGV[9], jid)
end
return {1, jid}
