--[[
  A LimitedCapacityWorker job that finished its unit of work successfully: give back its hold
  and, when work remains and the class still has room, enqueue its successor, in one atomic step.
  The room is counted as in lcw_enqueue.lua after this job's own hold is gone, so a lowered
  max_running_jobs shrinks the pool as jobs finish instead of being outrun by re-enqueues.

  KEYS[1]  running ledger       rq:policies:lcw-running:<class>
  KEYS[2]  queued set           rq:policies:lcw-queued:<class>
  KEYS[3]  gauges               rq:policies:lcw:<class>
  KEYS[4]  class index          rq:policies:lcw
  KEYS[5]  queue list           rq:queue:<q>
  KEYS[6]  queues set           rq:queues
  KEYS[7]  successor's hash     rq:job:<successor id>

  ARGV[1]  class                import path of the class
  ARGV[2]  max running jobs     integer >= 0
  ARGV[3]  remaining work       integer >= 0
  ARGV[4]  job key prefix       rq:job:
  ARGV[5]  queue name
  ARGV[6]  wake channel         rq:policies:wake:<q>
  ARGV[7]  job ttl              seconds the successor's hash lives, -1 for none
  ARGV[8]  gauges ttl           seconds the gauges and the index outlive the last write
  ARGV[9]  hold token           this job's hold in the running ledger
  ARGV[10] successor id
  ARGV[11] the successor's hash  field/value pairs as one length-prefixed blob (includes/unpack_fields.lua)

  Returns {released, successor id or ''}: released = 1 when this job's hold was still live.
]]
local rcall = redis.call
local class = ARGV[1]
local max = tonumber(ARGV[2])
local remaining = tonumber(ARGV[3])
local job_prefix = ARGV[4]
local queue_name = ARGV[5]
local ttl = tonumber(ARGV[7])
local state_ttl = tonumber(ARGV[8])
local holder = ARGV[9]
local successor = ARGV[10]

-- @include "includes/server_time.lua"
-- @include "includes/save_job.lua"
-- @include "includes/unpack_fields.lua"
-- @include "lib/ledger_count.lua"
-- @include "includes/lcw_room.lua"
-- @include "lib/ledger_release.lua"

local now = server_now()
local released = ledger_release(KEYS[1], holder)
local room = lcw_room(KEYS[1], KEYS[2], job_prefix, max, now)
lcw_report(KEYS[3], KEYS[4], class, queue_name, max, remaining, now, state_ttl)
if remaining > 0 and room > 0 then
  save_job(KEYS[7], KEYS[5], KEYS[6], KEYS[5], successor, 'R', 0, ttl, unpack_fields(ARGV[11]))
  rcall('ZADD', KEYS[2], now, successor)
  rcall('PUBLISH', ARGV[6], successor)
  return {released, successor}
end
return {released, ''}
