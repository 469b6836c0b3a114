--[[
  Policy part: queue_slot (a cluster-wide cap on the jobs of a queue running at once). Included
  by the framework scripts through `-- @policies`; defines functions only. Only the fetch script
  (fetch.lua) calls it.

  Keys: queue_slot.capacity (rq:policies:capacity, field = queue name -> cap), queue_slot.holds
  (a key list: queue i's hold ledger, rq:policies:slots:<q>). The hold is named ctx.token and
  lives ctx.ttl seconds.

  gate(ctx, i): an uncapped queue is taken; a capped one is skipped (false) while its live holds
  (server clock) reach the cap. Every queue's cap is read with one HMGET on the first gate of a
  look. The ledger is counted with one ZCARD, which counts its expired holds too: below the cap
  that is enough, and only a count at the cap is read again as live holds (ZCOUNT), so a full
  queue costs two reads and writes nothing.
  take(ctx, i, job_key, jid): on a capped queue, the claim's hold joins the ledger; returns 1 when
  a hold was taken, else 0. The expired holds are purged (ZREMRANGEBYSCORE) only when the gate's
  count reached the cap, and on about one take in PURGE_EVERY (by the server clock's
  microseconds) once it reached PURGE_AT: a fetch from a queue below its cap mostly pays no purge,
  and a killed holder's expired hold lingers (never counted against the cap) until the count
  could matter. Only crashed holders leave expired holds, so few ever wait.
]]
-- @include "lib/outlive.lua"
-- @include "lib/ledger_live.lua"
-- @include "lib/ledger_add.lua"
P.queue_slot = {}

-- The ledger's count from which its expired holds are purged on one take in PURGE_EVERY even
-- below the cap.
local PURGE_AT, PURGE_EVERY = 100, 16

function P.queue_slot.gate(ctx, i)
  local caps = ctx.queue_slot_caps
  if not caps then
    caps = rcall('HMGET', ctx.key('queue_slot.capacity'), unpack(ctx.names))
    ctx.queue_slot_caps = caps
  end
  local cap = tonumber(caps[i])
  ctx.q.queue_slot = cap
  if cap then
    local ledger = ctx.key_at('queue_slot.holds', i)
    local count = rcall('ZCARD', ledger)
    ctx.q.queue_slot_purge = count >= cap
      or count >= PURGE_AT and math.floor(ctx.now * 1000000) % PURGE_EVERY == 0
    if count >= cap and ledger_live(ledger, ctx.now) >= cap then
      return false
    end
  end
  return true
end

function P.queue_slot.take(ctx, i, job_key, jid)
  if not ctx.q.queue_slot then
    return 0
  end
  local ledger = ctx.key_at('queue_slot.holds', i)
  if ctx.q.queue_slot_purge then
    rcall('ZREMRANGEBYSCORE', ledger, '-inf', ctx.now)
  end
  ledger_add(ledger, ctx.token, ctx.ttl, ctx.now)
  return 1
end
