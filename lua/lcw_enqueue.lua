--[[
  LimitedCapacityWorker.perform_with_capacity: enqueue min(free room, remaining work) jobs of one
  class, where the room counts both running holds and jobs already waiting, all in one atomic
  step so that concurrent callers (two cron ticks, a cron tick and a finishing job) never
  enqueue past max_running_jobs between them.

  The caller builds up to min(max, remaining) candidate ids; the first `room` of them are
  written as ordinary rq jobs (one shared field list, see includes/save_job.lua) and pushed to
  the queue's tail, and their ids join the class's queued set.

  KEYS[1]    running ledger       rq:policies:lcw-running:<class>  (ZSET, score = expiry epoch s)
  KEYS[2]    queued set           rq:policies:lcw-queued:<class>   (ZSET, score = enqueue epoch s)
  KEYS[3]    gauges               rq:policies:lcw:<class>          (HASH)
  KEYS[4]    class index          rq:policies:lcw                  (ZSET)
  KEYS[5]    queue list           rq:queue:<q>
  KEYS[6]    queues set           rq:queues
  KEYS[6+i]  candidate i's hash   rq:job:<id i>

  ARGV[1]    class                import path of the class
  ARGV[2]    max running jobs     integer >= 0
  ARGV[3]    remaining work       integer >= 0
  ARGV[4]    job key prefix       rq:job:
  ARGV[5]    queue name
  ARGV[6]    wake channel         rq:policies:wake:<q>
  ARGV[7]    job ttl              seconds the job hash lives, -1 for none
  ARGV[8]    gauges ttl           seconds the gauges and the index outlive the last write
  ARGV[9]    n                    number of candidates
  ARGV[9+i]  candidate i's id
  ARGV[10+n] job hash             field/value pairs shared by every candidate, as one length-prefixed
                                  blob (includes/unpack_fields.lua)

  Returns the list of ids enqueued (possibly empty); a replayed call returns the ids its first
  attempt enqueued.
]]
local rcall = redis.call
local class = ARGV[1]
local max = tonumber(ARGV[2])
local remaining = tonumber(ARGV[3])
local job_prefix = ARGV[4]
local queue_name = ARGV[5]
local ttl = tonumber(ARGV[7])
local state_ttl = tonumber(ARGV[8])
local n = tonumber(ARGV[9])

-- @include "includes/server_time.lua"
-- @include "includes/save_job.lua"
-- @include "includes/unpack_fields.lua"
-- @include "lib/ledger_count.lua"
-- @include "includes/lcw_room.lua"

local fields = unpack_fields(ARGV[10 + n])

local now = server_now()
local room = lcw_room(KEYS[1], KEYS[2], job_prefix, max, now)
lcw_report(KEYS[3], KEYS[4], class, queue_name, max, remaining, now, state_ttl)

-- A candidate whose job hash exists was written by an earlier attempt of this very call (a client
-- retrying after a lost reply resends the same fresh ids): it is reported again, never pushed twice,
-- and it is already counted in `room` as queued.
local enqueued = {}
local fresh = {}
for i = 1, n do
  if rcall('EXISTS', KEYS[6 + i]) == 1 then
    enqueued[#enqueued + 1] = ARGV[9 + i]
  else
    fresh[#fresh + 1] = i
  end
end
local take = math.min(room, remaining - #enqueued, #fresh)
local first = nil
for j = 1, take do
  local i = fresh[j]
  local jid = ARGV[9 + i]
  save_job(KEYS[6 + i], KEYS[5], KEYS[6], KEYS[5], jid, 'R', 0, ttl, fields)
  rcall('ZADD', KEYS[2], now, jid)
  enqueued[#enqueued + 1] = jid
  first = first or jid
end
if first then
  rcall('PUBLISH', ARGV[6], first)
end
return enqueued
