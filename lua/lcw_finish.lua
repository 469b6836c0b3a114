--[[
  A LimitedCapacityWorker job that finished its unit of work successfully: give back its hold
  and, when work remains and the class still has room, enqueue its successor, in one atomic step.
  The room is counted as in lcw_enqueue.lua after this job's own hold is gone, so a lowered
  max_running_jobs shrinks the pool as jobs finish instead of being outrun by re-enqueues.

  A replay (redis-py sending the same call again after a lost reply) must answer as the first
  attempt did and write nothing. Neither the successor's hash (a result_ttl=0 successor may have
  run and been deleted before the replay arrives) nor the room (another job may have left since)
  tells a replay from a first attempt, so the first attempt records its answer under the fresh
  successor id the call carries (`record`, for record_ttl seconds: far longer than a client takes
  to resend), and a call that finds the record answers it.

  KEYS  by name (rq_policies/ops.py): running, queued, gauges, index, queue, queues (as in
        lcw_enqueue.lua), successor (rq:job:<successor id>), record
        (rq:policies:lcw-finish:<successor id>)
  ARGV[1]  one msgpack map (lib/codec.lua): class, max, remaining, job_prefix, queue_name, wake,
           ttl, state_ttl, fields (as in lcw_enqueue.lua), token (this job's hold in the running
           ledger), successor (the successor's id), record_ttl (seconds the record lives)

  Returns {released, successor id or ''}: released = 1 when this job's hold was still live.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/save_job.lua"
-- @include "lib/ledger_count.lua"
-- @include "lib/lcw_room.lua"
-- @include "lib/lcw_report.lua"
-- @include "lib/ledger_release.lua"

local a = decode_args(ARGV[1])
local function key(name) return KEYS[a.k[name]] end

local recorded = rcall('GET', key('record'))
if recorded then
  local released, successor = string.match(recorded, '^(%d):(.*)$')
  return {tonumber(released), successor}
end
local now = server_now()
local released = ledger_release(key('running'), a.token)
local room = lcw_room(key('running'), key('queued'), a.job_prefix, a.max, now)
lcw_report(key('gauges'), key('index'), a.class, a.queue_name, a.max, a.remaining, now, a.state_ttl)
local successor = ''
if a.remaining > 0 and room > 0 then
  save_job(key('successor'), key('queue'), key('queues'), key('queue'), a.successor, 'R', 0, a.ttl, a.fields, a.wake)
  rcall('ZADD', key('queued'), now, a.successor)
  successor = a.successor
end
rcall('SET', key('record'), released .. ':' .. successor, 'EX', a.record_ttl)
return {released, successor}
