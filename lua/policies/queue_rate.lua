--[[
  Policy part: queue_rate (a cluster-wide rate of job starts per queue, GCRA on the server's
  clock, of one window or several, and BackOff's block). Included by the framework scripts
  through `-- @policies`; defines functions only. Only the fetch script (fetch.lua) calls it.

  Keys:
    queue_rate.settings   HASH    rq:policies:rate, field = queue name -> '<limit> <per> <burst>'
                                  (integers: starts, seconds, starts; with several windows each
                                  a comma-separated list, one entry per window: lib/rate_windows.lua)
    queue_rate.backoff    ZSET    rq:policies:backoff, member = queue name, score = epoch s (server
                                  clock) until which the queue is blocked
    queue_rate.tat        key list  queue i's theoretical arrival time, rq:policies:tat:<q>: a
                                  STRING '<tat> <interval>' (epoch s '%.6f', the emission
                                  interval it was reached at, s; with several windows
                                  '<tat> <interval> <per>' per window), expiring once the last
                                  tat is past
  No arguments of its own; the clock is ctx.now (server time, epoch s).

  gate(ctx, i): every queue's rate and block are read on the first gate of a look (one HMGET, one
  ZRANGEBYSCORE). A queue blocked by a BackOff ending later than now is skipped until then (returns
  that server time); an unlimited queue is taken (true); a limited one is taken when every window's
  GCRA allows a start now (emission interval T = per / limit, tolerance (burst - 1) * T: at most
  `burst` at once after a quiet spell), else skipped until the time they all allow one (a number).
  The gate writes nothing: a start refused by another gate (or by another window), or a queue found
  empty, costs no rate. A rate changed since the arrival time was stored reads it under the new
  interval (the starts owed keep their count), so the change applies from the next fetch on.
  take(ctx, i, job_key, jid): the start the gate allowed is recorded (each window's arrival time
  moves on by its T; the key expires when the last is reached). Returns 0: a rate takes no hold, so
  a start is never refunded, whatever becomes of the job.
]]
-- @include "lib/rate_windows.lua"
P.queue_rate = {}

-- Every queue's rate and block are read once per look, on its first gate (one HMGET, one
-- ZRANGEBYSCORE of the queues blocked now, normally none), so a look over many queues stays cheap.
local function rate_look(ctx)
  local look = ctx.queue_rate_look
  if not look then
    local blocked = {}
    local found = rcall('ZRANGEBYSCORE', ctx.key('queue_rate.backoff'), '(' .. string.format('%.6f', ctx.now),
      '+inf', 'WITHSCORES')
    for n = 1, #found - 1, 2 do
      blocked[found[n]] = tonumber(found[n + 1])
    end
    look = {blocked = blocked, settings = rcall('HMGET', ctx.key('queue_rate.settings'), unpack(ctx.names))}
    ctx.queue_rate_look = look
  end
  return look
end

function P.queue_rate.gate(ctx, i)
  local look = rate_look(ctx)
  local blocked = look.blocked[ctx.names[i]]
  if blocked and blocked > ctx.now then
    return blocked
  end
  local raw = look.settings[i]
  if not raw then
    return true
  end
  local limits, pers, bursts = string.match(raw, '^([%d,]+) ([%d,]+) ([%d,]+)$')
  local windows = limits and rate_windows(limits, pers, bursts)
  if not windows then
    return true -- not written by QueueRate.set (which validates): ignored rather than blocking forever
  end
  local tats = rate_tats(rcall('GET', ctx.key_at('queue_rate.tat', i)), windows, ctx.now)
  local allowed_at = rate_allowed_at(windows, tats)
  if allowed_at > ctx.now then
    return allowed_at
  end
  rate_take(windows, tats, 1)
  ctx.q.queue_rate = {windows, tats}
  return true
end

function P.queue_rate.take(ctx, i, job_key, jid)
  local taken = ctx.q.queue_rate
  if taken then
    rate_store(ctx.key_at('queue_rate.tat', i), taken[1], taken[2], ctx.now)
  end
  return 0
end
