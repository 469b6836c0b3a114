--[[
  Keep what a running work horse holds, from its worker's hold guard (rq_policies.worker,
  _HorseGuard), every third of hold_ttl while the horse lives, whatever becomes of its worker
  (alive, SIGSTOPped, SIGKILLed alone or with its process group): the holds its fetch took (a
  queue's cap, a key's Concurrency), and, for a job admitted with Loner(until='finished'), the
  liveness key lib/holder_running.lua reads, so its identity is held while the horse runs.

  mode 'keep' (every keep): a hold still live is extended; a hold found gone is NOT written back,
  only reported: the worker releases a job's holds once its horse has ended, and a keep the guard
  sent a moment before that must not bring a released hold back. The liveness key is written
  when the job is a started until='finished' loner job (first: unconditionally, on the guard's
  first keep of this horse; later: only while it exists, a gone one is reported).
  mode 'recount' (the guard saw the horse still alive after a keep reported something gone, so
  nothing was released: it lapsed, in a stall or a stop of the whole tree longer than its ttl):
  every hold is written again and counted in the lapses hash (lib/ledger_refresh.lua, as
  refresh_holds.lua does), and the liveness key too (field alive_field); the ledger may then be
  over its cap until enough jobs end, and fetches are refused meanwhile.

  Safe to run twice with the same arguments: a replayed keep extends only what exists (and
  writes the liveness key again on a first keep); a replayed recount finds what the first run
  wrote back, live, and counts nothing more.

  KEYS  by name (rq_policies/ops.py, built by rq_policies.worker.keep_call):
    holds      key list             hold i's ledger (rq:policies:slots:<q>, a key's ledger)
    lapses     key                  rq:policies:lapses, HASH of lapse counters
    job        key                  the job's hash (rq:job:<id>)
    alive      key                  the job's liveness key (rq:policies:alive:<id>)
  ARGV[1]  one msgpack map (lib/codec.lua):
    mode       'keep' or 'recount'
    tokens     list                 hold i's token, the member in its ledger
    ttls       list                 hold i's new lifetime, seconds from now (server clock)
    fields     list                 hold i's field in the lapses hash (queue:<q>, key:<scope>:<key>)
    alive_ttl  seconds              the liveness key's lifetime
    alive_field                     its field in the lapses hash (loner:<q>)
    first      true                 the guard has not written the liveness key for this horse yet

  Returns {gone, alive}: gone, the (1-based) positions of the holds found gone (keep) or found
  lapsed and written again (recount); alive: 0 when the job is not a started until='finished'
  loner job (no liveness key), 1 when its key was live (or written on a first keep), 2 when it
  was found gone (keep: not written; recount: written again and counted).
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/outlive.lua"
-- @include "lib/ledger_refresh.lua"

local a = decode_args(ARGV[1])
local recount = a.mode == 'recount'
local now = server_now()
local gone = {}
local first, n = a.kl.holds[1], a.kl.holds[2]
for i = 1, n do
  local ledger = KEYS[first + i - 1]
  if recount then
    if not ledger_refresh(ledger, a.tokens[i], a.ttls[i], now) then
      gone[#gone + 1] = i
      rcall('HINCRBY', KEYS[a.k.lapses], a.fields[i], 1)
    end
  else
    local score = tonumber(rcall('ZSCORE', ledger, a.tokens[i]))
    if score and score > now then
      rcall('ZADD', ledger, now + a.ttls[i], a.tokens[i])
      outlive(ledger, a.ttls[i])
    else
      gone[#gone + 1] = i
    end
  end
end

local alive = 0
local job = rcall('HMGET', KEYS[a.k.job], 'status', 'policies_loner_until')
if job[1] == 'started' and job[2] == 'finished' then
  local key = KEYS[a.k.alive]
  local ttl = math.ceil(a.alive_ttl)
  if rcall('EXISTS', key) == 1 or (a.first and not recount) then
    rcall('SET', key, '1', 'EX', ttl)
    alive = 1
  elseif recount then
    rcall('SET', key, '1', 'EX', ttl)
    rcall('HINCRBY', KEYS[a.k.lapses], a.alive_field, 1)
    alive = 2
  else
    alive = 2
  end
end
return {gone, alive}
