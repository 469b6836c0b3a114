--[[
  Drop an extra whose throttle slot is already held, without its job ever being built (the fast
  path of a leading-edge enqueue that is expected to lose).

  The producer tries this only when it has recently seen the slot taken; it is a complete decision
  on its own: a held slot stays held until it ends (only force and reset change it), so "held by
  another job" is a drop at this instant, and the counter is bumped in the same step. A free slot,
  or one held by this very job id (a replay), decides nothing: the producer goes on to
  throttle_slot.lua, which checks again and writes.

  KEYS[1]  slot key prefix        rq:policies:throttle:<q>:<digest>: (the slot number is appended)
  KEYS[2]  drop counters          rq:policies:drops

  ARGV[1]  job id                 the caller's explicit job id, or '' when rq will make one
  ARGV[2]  slot width             seconds, a whole number >= 1
  ARGV[3]  throttle drop field    throttle:<q>

  Returns {1, owner, slot end, server now} when dropped (counted), {0, '', slot end, server now}
  when the producer must take the full path.
]]
local rcall = redis.call
local jid = ARGV[1]
local width = tonumber(ARGV[2])

-- @include "includes/server_time.lua"
-- @include "includes/slot.lua"

local now = server_now()
local index, ends = slot_at(now, width)
local owner = rcall('GET', slot_key(KEYS[1], index))
if owner and owner ~= jid then
  rcall('HINCRBY', KEYS[2], ARGV[3], 1)
  return {1, owner, ends, format_now(now)}
end
return {0, '', ends, format_now(now)}
