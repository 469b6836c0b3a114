--[[
  Take the next job for a PolicyWorker, in one atomic step: pop it, run every policy's fetch
  hooks, and hand it over with the holds its fetch policies took. There is never a job without
  its hold nor a hold without its job.

  Queues are tried in the worker's order. Before a queue is popped, each fetch policy's gate
  decides (a part, lua/policies/<name>.lua, included by `-- @policies`, may define):
    gate(ctx, i)               -> true: the queue may be taken from; false: skip it (it is full
                                  until something is released); a number: skip it until that
                                  server time (epoch s)
    take(ctx, i, job_key, jid) -> the fetch policy's commit for the job taken from queue i: 1
                                  when it took a hold (named ctx.token, ctx.ttl seconds), else 0
    taken(job_key, jid)        -> any policy (an admission one, such as loner): the job was
                                  taken off its queue; free what it held while it waited (or
                                  mark what it holds until it ends: Loner until='finished')
  ctx.q is scratch space a gate leaves for its own take, emptied for every queue. The job id
  moves to the queue's intermediate list (LMOVE), as rq's own single-queue fetch does, so a
  worker that dies between this pop and the job's start leaves the job where rq's maintenance
  finds it, for single- and multi-queue workers alike. An id whose job hash is gone is dropped
  from the intermediate list and the pop goes on (at most 100 ids per queue, so a list full of
  dangling ids cannot stall the server), as rq's dequeue does.

  KEYS  by name (rq_policies/ops.py, built by rq_policies.fetch.fetch_call):
    queues          key list        queue i's list, rq:queue:<q>
    intermediate    key list        queue i's intermediate list, rq:queue:<q>:intermediate
    claim           key             rq:policies:claim:<token>: this claim's record (see below)
    and each fetch policy's keys, named '<policy>.<what>' (queue_slot.capacity, the capacity
    hash rq:policies:capacity; queue_slot.holds, a key list: queue i's hold ledger,
    rq:policies:slots:<q>)
  ARGV[1]  one msgpack map (lib/codec.lua):
    job_prefix      string          rq:job:
    names           list            queue i's name
    order           list            the fetch policies' names, in the order their gates run
    token           string          the claim token, <host>:<pid>:<tid>:<n>: names every hold
                                    this fetch takes
    ttl             seconds         how long a hold lives unless refreshed
    tombstone       string          rq:policies:superseded: (a popped job whose tombstone exists is
                                    dropped, not handed out)
    burst           boolean         a burst worker: count the skipped queues that still have jobs
                                    (it waits for those instead of quitting); 0 is reported otherwise
    claim_ttl       seconds         how long the claim's record lives (a replay comes within it)

  Replay-safe: a fetch that takes a job records, in the same script, what it took under its
  claim token (one SET with a short EX). A replay of the same call (redis-py resending it after
  a lost reply) finds the record and answers the job the first attempt took, with its holds,
  never popping a second one (a second pop would strand that job on the intermediate list with
  its loner marker gone).

  Returns {i, job id, h1, h2, ...} for the job taken from queue i, where hn = 1 when the n-th
  policy of `order` took a hold; or {0, waiting, f1, f2, ..., [until]} when nothing was taken:
  waiting = how many skipped queues still have jobs (a burst worker waits for them instead of
  quitting), f1.. = the index of every skipped queue (an idle worker ignores pushes to those
  until something is released), and, only when a gate skipped a queue until a time, `until` =
  the earliest such server time as a string ('%.6f' epoch s; the indices are integers, so the
  two cannot be confused): an idle worker need not look again before it.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"

local a = decode_args(ARGV[1])
local claim_key = KEYS[a.k.claim]
local recorded = rcall('GET', claim_key)
if recorded then
  local i, flags, jid = string.match(recorded, '^(%d+):(%d*):(.*)$')
  local reply = {tonumber(i), jid}
  for n = 1, #flags do
    reply[n + 2] = tonumber(string.sub(flags, n, n))
  end
  return reply
end
local P = {}
-- @policies

-- The hooks that exist, in a fixed order, so every run writes in the same order.
local gates, takes, taken = {}, {}, {}
for n, name in ipairs(a.order) do
  local part = P[name] or {}
  gates[n] = part.gate
  takes[n] = part.take
end
local names = {}
for name, part in pairs(P) do
  if part.taken then
    names[#names + 1] = name
  end
end
table.sort(names)
for _, name in ipairs(names) do
  taken[#taken + 1] = P[name].taken
end

local queues, inters = a.kl.queues[1], a.kl.intermediate[1]
local ctx = {names = a.names, token = a.token, ttl = a.ttl, now = server_now()}
function ctx.key(name)
  return KEYS[a.k[name]]
end
function ctx.key_at(name, i)
  return KEYS[a.kl[name][1] + i - 1]
end

local waiting = 0
local full = {}
local skip_until
for i = 1, #a.names do
  local queue_key = KEYS[queues + i - 1]
  local inter_key = KEYS[inters + i - 1]
  ctx.q = {}
  local verdict = true
  for n = 1, #a.order do
    if gates[n] then
      verdict = gates[n](ctx, i)
      if verdict ~= true then
        break
      end
    end
  end
  if verdict ~= true then
    if type(verdict) == 'number' and (not skip_until or verdict < skip_until) then
      skip_until = verdict
    end
    full[#full + 1] = i
    if a.burst and rcall('LLEN', queue_key) > 0 then
      waiting = waiting + 1
    end
  else
    local tries = 0
    while tries < 100 do
      tries = tries + 1
      local jid = rcall('LMOVE', queue_key, inter_key, 'LEFT', 'RIGHT')
      if not jid then
        break
      end
      local job_key = a.job_prefix .. jid
      local present = rcall('EXISTS', job_key) == 1
      -- A pending job a later enqueue superseded, brought back by a scheduler whose clock runs
      -- ahead of the server's (lib/pending.lua; the scheduler's write-back carries none of our
      -- fields, so every job is checked): dropped like an id whose hash is gone.
      if present and rcall('EXISTS', a.tombstone .. jid) == 1 then
        rcall('DEL', job_key)
        present = false
      end
      if present then
        for _, hook in ipairs(taken) do
          hook(job_key, jid)
        end
        local reply = {i, jid}
        local flags = {}
        for n = 1, #a.order do
          reply[n + 2] = takes[n] and takes[n](ctx, i, job_key, jid) or 0
          flags[n] = tostring(reply[n + 2])
        end
        rcall('SET', claim_key, i .. ':' .. table.concat(flags) .. ':' .. jid, 'EX', a.claim_ttl)
        return reply
      end
      rcall('LREM', inter_key, 1, jid)
    end
  end
end
if skip_until then
  full[#full + 1] = string.format('%.6f', skip_until)
end
return {0, waiting, unpack(full)}
