--[[
  Hand back to its queue a job a PolicyWorker's fetch took and never started (lua/fetch.lua's
  take: the id moved onto the queue's intermediate list, its take noted in
  rq:policies:taken:<queue>): the worker was killed, stopped or starved between the fetch and the
  job's start. rq's own cleanup would fail such a job, unrun, once a maintenance pass has seen it
  there for a minute (about 406 s with rq's defaults); the job never ran, so it goes back to the
  head of its queue instead, as it was, and an idle worker is woken for it.

  Which ids, and why this never hands back a job that runs or is about to:
    * only an id whose take is noted (a PolicyWorker took it: an id on the intermediate list with
      no take, a stock rq worker's or one whose take was lost, is left to rq's cleanup);
    * the take is the one the caller read (ARGV `expect`: unchanged since; a confirmed start
      removed it, a later fetch of the id noted its own);
    * the take lapsed: its claim record is gone (it lives the taker's hold ttl from the fetch,
      as the fetch's holds do, so they lapsed with it), unless the caller is the taker itself
      giving its own take back (`own`: a stop between its fetch and the start);
    * the job waits as the fetch left it: status queued, and the enqueued_at the take recorded
      (an id enqueued again since, by a retry or a requeue, is another take's);
    * it is on the intermediate list, and no execution of it is live (rq:executions:<id>, which
      rq's prepare_execution writes in the worker before it forks the work horse): the taker asks
      (lua/claim_start.lua) once it has written the execution, and a taker that finds its take
      handed back deletes that execution and does not start the job. A take whose job has a live
      execution stays: its worker is about to start the job, or died in that moment, and then the
      take is handed back once the execution expires (its heartbeat ttl plus a minute).
  A take whose job is gone is removed with the id (as rq's dequeue drops a dangling id); one that
  no longer applies (the job started, ended, was enqueued again or left the list) is removed. The
  work horse's start (rq's prepare_job_execution) removes its own take.

  KEYS  by name (rq_policies/engine/ops.py, built by rq_policies.engine.fetch.hand_back_call):
    key lists `taken` (rq:policies:taken:<q>), `queues` (rq:queue:<q>), `intermediate`
    (rq:queue:<q>:intermediate), one per queue; and per item, by index: its job hash
    (rq:job:<id>), its executions registry (rq:executions:<id>), its claim record
    (rq:policies:claim:<token>); answer (rq:policies:answer:<request id>, lib/answer.lua)
  ARGV[1]  one msgpack map (lib/codec.lua):
    items   a list of {queue index, job id, expect (the take as read), enqueued_at (as the take
            recorded), own (true: the caller is the taker), job, executions, claim (indices in
            KEYS)}
    wake    the queues' wake-up channels' prefix (rq:policies:wake:), names (queue i's name)
    answer_ttl  seconds the answer is kept

  Returns the ids handed back. Safe to run twice: a replay (the same request id) answers the first
  run's ids and changes nothing (the first run removed the takes it acted on anyway).
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/answer.lua"

local a = decode_args(ARGV[1])
local kept = kept_answer(a)
if kept then
  local ids = {}
  for jid in string.gmatch(kept, '%S+') do
    ids[#ids + 1] = jid
  end
  return ids
end
local taken, queues, inter = a.kl.taken[1], a.kl.queues[1], a.kl.intermediate[1]
local now
local handed = {}
for _, item in ipairs(a.items) do
  local i, jid, expect, enqueued_at, own = item[1], item[2], item[3], item[4], item[5]
  local job_key, executions, claim = KEYS[item[6]], KEYS[item[7]], KEYS[item[8]]
  local taken_key, queue_key, inter_key = KEYS[taken + i - 1], KEYS[queues + i - 1], KEYS[inter + i - 1]
  if rcall('HGET', taken_key, jid) == expect and (own or rcall('EXISTS', claim) == 0) then
    local job = rcall('HMGET', job_key, 'status', 'enqueued_at')
    if not job[1] then
      rcall('HDEL', taken_key, jid)
      rcall('LREM', inter_key, 1, jid)
    elseif job[1] ~= 'queued' or (job[2] or '') ~= enqueued_at or not rcall('LPOS', inter_key, jid) then
      rcall('HDEL', taken_key, jid)
    else
      if not now then
        local t = rcall('TIME')
        now = t[1] .. '.' .. string.sub('00000' .. t[2], -6)
      end
      if rcall('ZCOUNT', executions, '(' .. now, '+inf') == 0 then
        rcall('HDEL', taken_key, jid)
        rcall('LREM', inter_key, 1, jid)
        rcall('LPUSH', queue_key, jid)
        if own then
          rcall('DEL', claim)
        end
        rcall('SPUBLISH', a.wake .. a.names[i], jid)
        handed[#handed + 1] = jid
      end
    end
  end
end
keep_answer(a, table.concat(handed, ' '))
return handed
