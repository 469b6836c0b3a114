--[[
  Policy part: queue_slot (a cluster-wide cap on the jobs of a queue running at once). Included
  by the framework scripts through `-- @policies`; defines functions only. Only the fetch script
  (fetch.lua) calls it.

  Keys: queue_slot.capacity (rq:policies:capacity, field = queue name -> cap), queue_slot.holds
  (a key list: queue i's hold ledger, rq:policies:slots:<q>). The hold is named ctx.token and
  lives ctx.ttl seconds.

  gate(ctx, i): an uncapped queue is taken; a capped one is skipped (false) while its live holds
  (server clock) reach the cap. Every queue's cap is read with one HMGET on the first gate of a
  look, and a full queue costs one ZCOUNT, so a look over many full queues stays cheap.
  take(ctx, i, job_key, jid): on a capped queue, the ledger loses its expired holds and the
  claim's hold joins it; returns 1 when a hold was taken, else 0.
]]
-- @include "lib/outlive.lua"
-- @include "lib/ledger_count.lua"
-- @include "lib/ledger_live.lua"
-- @include "lib/ledger_add.lua"
P.queue_slot = {}

function P.queue_slot.gate(ctx, i)
  local caps = ctx.queue_slot_caps
  if not caps then
    caps = rcall('HMGET', ctx.key('queue_slot.capacity'), unpack(ctx.names))
    ctx.queue_slot_caps = caps
  end
  local cap = tonumber(caps[i])
  ctx.q.queue_slot = cap
  if cap and ledger_live(ctx.key_at('queue_slot.holds', i), ctx.now) >= cap then
    return false
  end
  return true
end

function P.queue_slot.take(ctx, i, job_key, jid)
  if not ctx.q.queue_slot then
    return 0
  end
  local ledger = ctx.key_at('queue_slot.holds', i)
  rcall('ZREMRANGEBYSCORE', ledger, '-inf', ctx.now)
  ledger_add(ledger, ctx.token, ctx.ttl, ctx.now)
  return 1
end
