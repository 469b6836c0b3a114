--[[
  Drop a duplicate whose loner identity is held, without its job ever being built (the fast path
  of an enqueue this process expects to lose, having just seen the identity held).

  A complete decision on its own: "held by another waiting job" is a drop at this instant, and the
  drop counter is bumped in the same step. A free identity, a stale marker (its holder no longer
  waits) or one held by this very job id (a replay) decides nothing: the producer goes on to
  enqueue_job.lua, which checks again and writes.

  KEYS[1]  loner marker           rq:policies:loner:<q>:<digest>
  KEYS[2]  drop counters          rq:policies:drops

  ARGV[1]  job id                 the caller's explicit job id, or '' when rq will make one
  ARGV[2]  job key prefix         rq:job:
  ARGV[3]  drop counter field     loner:<q>

  Returns {1, holder id} when dropped (counted), {0, ''} when the producer must take the full path.
]]
local rcall = redis.call
local jid = ARGV[1]

-- @include "includes/waiting.lua"

local holder = rcall('GET', KEYS[1])
if holder and holder ~= jid and holder_waiting(ARGV[2], holder) then
  rcall('HINCRBY', KEYS[2], ARGV[3], 1)
  return {1, holder}
end
return {0, ''}
