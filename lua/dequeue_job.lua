--[[
  Take the next job for a PolicyWorker: pop, clear its loner marker and, on a capped queue, take
  a QueueSlot hold, all in one atomic step. There is never a job without a hold nor a hold
  without a job.

  Queues are tried in the worker's order. A capped queue first loses its expired holds (under
  the server's clock), then is skipped while its live holds reach the cap. The job id moves to
  the queue's intermediate list (LMOVE), as rq's own single-queue fetch does, so a worker that
  dies between this pop and the job's start leaves the job where rq's maintenance finds it, for
  single- and multi-queue workers alike. An id whose job hash is gone is dropped from the
  intermediate list and the pop goes on, as rq's dequeue does.

  KEYS[1]          capacity hash        rq:policies:capacity (field = queue name)
  KEYS[3i-1]       queue i's list       rq:queue:<q>
  KEYS[3i]         its intermediate     rq:queue:<q>:intermediate
  KEYS[3i+1]       its hold ledger      rq:policies:slots:<q>

  ARGV[1]          job key prefix       rq:job:
  ARGV[2]          claim token          <host>:<pid>:<tid>:<n>, names this hold
  ARGV[3]          hold ttl             seconds a hold lives unless refreshed
  ARGV[3+i]        queue i's name

  Returns {i, job id, held} for the job taken from queue i (held = 1 when a hold was taken), or
  {0, waiting, f1, f2, ...} when nothing was taken: waiting = how many full queues still have jobs
  (a burst worker waits for them instead of quitting), f1.. = the index of every capped queue with
  no free slot (an idle worker ignores pushes to those until a slot frees).
]]
local rcall = redis.call
local job_prefix = ARGV[1]
local token = ARGV[2]
local ttl = tonumber(ARGV[3])
local nqueues = #ARGV - 3

-- @include "includes/server_time.lua"
-- @include "lib/outlive.lua"

local now = server_now()
local waiting = 0
local full = {}
for i = 1, nqueues do
  local queue_key = KEYS[3 * i - 1]
  local inter_key = KEYS[3 * i]
  local ledger = KEYS[3 * i + 1]
  local cap = tonumber(rcall('HGET', KEYS[1], ARGV[3 + i]))
  local room = true
  if cap then
    rcall('ZREMRANGEBYSCORE', ledger, '-inf', now)
    if rcall('ZCARD', ledger) >= cap then
      room = false
      full[#full + 1] = i
      if rcall('LLEN', queue_key) > 0 then
        waiting = waiting + 1
      end
    end
  end
  -- Bounded, so a list full of dangling ids cannot stall the server.
  local tries = 0
  while room and tries < 100 do
    tries = tries + 1
    local jid = rcall('LMOVE', queue_key, inter_key, 'LEFT', 'RIGHT')
    if not jid then
      break
    end
    local job_key = job_prefix .. jid
    if rcall('EXISTS', job_key) == 1 then
      local marker = rcall('HGET', job_key, 'policies_loner')
      if marker and rcall('GET', marker) == jid then
        rcall('DEL', marker)
      end
      local held = 0
      if cap then
        rcall('ZADD', ledger, now + ttl, token)
        outlive(ledger, ttl)
        held = 1
      end
      return {i, jid, held}
    end
    rcall('LREM', inter_key, 1, jid)
  end
end
return {0, waiting, unpack(full)}
