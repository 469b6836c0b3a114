--[[
  Pause or resume one key of Fair (lua/policies/fair.lua): a paused key's waiting jobs stay in
  their lines (status deferred) and none starts until the key is resumed; other keys are not
  touched. A pause takes effect at once (every fetch asks the paused hash before it takes a key's
  job); a resume makes the key active again on every queue where it still has waiting jobs, at
  that queue's lowest virtual time (a paused key earns no credit while paused).

  KEYS  by name (rq_policies/ops.py, built by rq_policies.fair._pause_call):
    paused     rq:policies:fair:paused                 HASH '<scope>:<key>' -> 1
    pausedin   rq:policies:fair:pausedin:<scope>:<key>  SET of queues the key left when paused
    answer     rq:policies:answer:<request id>          this call's answer (lib/answer.lua)
  ARGV[1]  one msgpack map (lib/codec.lua):
    key_id     '<scope>:<key>' (the key id)
    pause      true: pause; false: resume
    waits      rq:policies:fair:wait: (the prefix of the lines, '<queue>:<scope>:<key>' appended)
    actives    rq:policies:fair:active: (the prefix of the active sets, '<queue>' appended)
    wake       rq:policies:wake: (the prefix of the queues' wake-up channels, SPUBLISHed on a resume)
    answer_ttl seconds the answer is kept

  Safe to run twice: a replay (the same request id) answers what the first run did and writes
  nothing. Returns 1 when the key's state changed, else 0.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/answer.lua"

local a = decode_args(ARGV[1])
local kept = kept_answer(a)
if kept then
  return tonumber(kept)
end
local paused, pausedin = KEYS[a.k.paused], KEYS[a.k.pausedin]
if a.pause then
  return keep_answer(a, rcall('HSET', paused, a.key_id, 1))
end
local changed = rcall('HDEL', paused, a.key_id)
for _, queue in ipairs(rcall('SMEMBERS', pausedin)) do
  if rcall('EXISTS', a.waits .. queue .. ':' .. a.key_id) == 1 then
    local active = a.actives .. queue
    local first = rcall('ZRANGE', active, 0, 0, 'WITHSCORES')
    rcall('ZADD', active, 'NX', tonumber(first[2]) or 0, a.key_id)
    rcall('SPUBLISH', a.wake .. queue, 'released')
  end
end
rcall('DEL', pausedin)
return keep_answer(a, changed)
