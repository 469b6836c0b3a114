--[[
  LimitedCapacityWorker.perform_with_capacity: enqueue min(free room, remaining work) jobs of one
  class, where the room counts both running holds and jobs already waiting, all in one atomic
  step so that concurrent callers (two cron ticks, a cron tick and a finishing job) never
  enqueue past max_running_jobs between them.

  The caller builds up to min(max, remaining) candidate ids; the first `room` of them are
  written as ordinary rq jobs (one shared field list, see lib/save_job.lua) and pushed to the
  queue's tail, and their ids join the class's queued set. A candidate whose job hash exists was
  written by an earlier attempt of this very call (a client retrying after a lost reply resends
  the same fresh ids): it is reported again, never pushed twice, and it is already counted in
  the room as queued.

  KEYS  by name (rq_policies/ops.py, built by LimitedCapacityWorker._call):
    running      ZSET   rq:policies:lcw-running:<class> (a hold ledger, score = expiry epoch s)
    queued       ZSET   rq:policies:lcw-queued:<class> (score = enqueue epoch s)
    gauges       HASH   rq:policies:lcw:<class>
    index        ZSET   rq:policies:lcw
    queue        LIST   rq:queue:<q>
    queues       SET    rq:queues
    jobs         key list: candidate i's hash, rq:job:<id i>
  ARGV[1]  one msgpack map (lib/codec.lua):
    class       import path of the class
    max         max running jobs, integer >= 0
    remaining   remaining work, integer >= 0
    job_prefix  rq:job:
    queue_name  the queue's name
    wake        rq:policies:wake:<q>
    ttl         seconds the job hashes live, -1 for none
    state_ttl   seconds the gauges and the index outlive the last write
    ids         the candidate ids, in the order of KEYS `jobs`
    fields      the job hash shared by every candidate, a flat field/value list

  Returns the list of ids enqueued (possibly empty).
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/save_job.lua"
-- @include "lib/ledger_count.lua"
-- @include "lib/lcw_room.lua"
-- @include "lib/lcw_report.lua"

local a = decode_args(ARGV[1])
local function key(name) return KEYS[a.k[name]] end
local first_job = a.kl.jobs[1]

local now = server_now()
local room = lcw_room(key('running'), key('queued'), a.job_prefix, a.max, now)
lcw_report(key('gauges'), key('index'), a.class, a.queue_name, a.max, a.remaining, now, a.state_ttl)

local enqueued = {}
local fresh = {}
for i, jid in ipairs(a.ids) do
  if rcall('EXISTS', KEYS[first_job + i - 1]) == 1 then
    enqueued[#enqueued + 1] = jid
  else
    fresh[#fresh + 1] = i
  end
end
local take = math.min(room, a.remaining - #enqueued, #fresh)
for j = 1, take do
  local i = fresh[j]
  local jid = a.ids[i]
  -- the wake-up goes with the first push only: one idle worker per refill is enough to start
  save_job(KEYS[first_job + i - 1], key('queue'), key('queues'), key('queue'), jid, 'R', 0, a.ttl, a.fields,
           j == 1 and a.wake or nil)
  rcall('ZADD', key('queued'), now, jid)
  enqueued[#enqueued + 1] = jid
end
return enqueued
