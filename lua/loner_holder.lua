--[[
  Who holds a loner identity right now (resque-loner's enqueued?). Read-only: a stale marker
  (its holder no longer waiting) answers "nobody" and is left for the next enqueue to replace.

  KEYS[1]  loner marker           rq:policies:loner:<q>:<digest>
  ARGV[1]  job key prefix         rq:job:

  Returns the holder's job id, or nil.
]]
local rcall = redis.call
-- @include "includes/waiting.lua"
local holder = rcall('GET', KEYS[1])
if holder and holder_waiting(ARGV[1], holder) then
  return holder
end
return false
