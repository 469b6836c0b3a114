--[[
  Debounce one enqueue, in one atomic step (Debounce(wait, max_wait)): the job is scheduled for
  now + wait in rq's scheduled-job registry; if a job of the same identity is still pending there,
  it is replaced (its hash deleted, its registry entry removed) and the quiet period starts again,
  but never later than max_wait after the enqueue that started the pending period. Times are the
  server's; scores are whole seconds, as rq's own scheduler writes and reads them (a job runs at
  the first scheduler tick at or after its score).

  A pending job whose run time has been reached is never replaced (rq's scheduler may be moving
  it): it runs, and this enqueue starts a new pending period. An enqueue that reuses the pending
  job's id replaces it in place.

  KEYS[1]  debounce hash          rq:policies:debounce:<q>:<digest>  fields: job (pending job id),
                                  first (epoch seconds of the enqueue that started the period)
  KEYS[2]  job hash               rq:job:<id>
  KEYS[3]  scheduled registry     rq:scheduled:<q>
  KEYS[4]  queues set             rq:queues

  ARGV[1]  job id
  ARGV[2]  wait                   seconds, a whole number >= 1
  ARGV[3]  max wait               seconds, a whole number >= wait, or 0 for no cap
  ARGV[4]  not before             epoch seconds the caller asked for (enqueue_at/in), or 0
  ARGV[5]  ttl                    seconds the job hash lives; -1 for no expiry
  ARGV[6]  queue key              rq:queue:<q>, added to rq:queues
  ARGV[7]  job key prefix         rq:job:
  ARGV[8..] job hash field/value pairs (a scheduled job's)

  Returns {job id, run at (epoch seconds), server now, superseded id or ''}.
]]
local rcall = redis.call
local jid = ARGV[1]
local wait = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local not_before = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local queue_key = ARGV[6]
local job_prefix = ARGV[7]

-- @include "includes/server_time.lua"
-- @include "includes/slot.lua"
-- @include "includes/save_job.lua"

local now = server_now()
local state = rcall('HMGET', KEYS[1], 'job', 'first')
local pending, first = state[1], tonumber(state[2])

-- An enqueue that reuses the pending job's id replaces it in place like any other (a retried call
-- whose reply was lost changes nothing but the run time), so it is not special-cased.
local superseded = ''
if drop_pending(KEYS[3], job_prefix, pending, now) == 1 then
  superseded = pending
else
  first = now
end
if not first then first = now end

local run_at = now + wait
if max_wait > 0 and first + max_wait < run_at then
  run_at = first + max_wait
end
run_at = math.ceil(run_at)
if not_before > run_at then run_at = not_before end

save_job(KEYS[2], KEYS[3], KEYS[4], queue_key, jid, 'S', run_at, ttl, {unpack(ARGV, 8)})
rcall('HSET', KEYS[1], 'job', jid, 'first', string.format('%.6f', first))
-- The pointer means nothing once the job's time has come (it can no longer be replaced).
local ms = math.ceil((run_at - now) * 1000)
if ms < 1 then ms = 1 end
rcall('PEXPIRE', KEYS[1], ms)
return {jid, run_at, format_now(now), superseded}
