--[[
  Push a job id once per call: the push PolicyQueue makes for rq (a job without a policy, a
  retry, a released dependent, a scheduled job's registry entry), safe to run twice.

  rq sends that push inside a MULTI/EXEC with the job's hash, and redis-py resends the whole
  transaction after a lost reply: a plain RPUSH then lands the id in the list twice and the job
  runs twice. Each call carries a fresh token; the first attempt records it in the job's own hash
  (field policies_push) and a call that finds its token there is a replay and pushes nothing. The
  field keeps the last four tokens (newest first, a fixed width), so a replay that arrives after a
  legitimate later push of the same id (a retry, rq's scheduler moving it) is still recognised,
  and the field never grows. A later push of the same id carries a new token and pushes.

  A job that rq deletes soon after it runs (result_ttl shorter than `record_ttl`: result_ttl=0 is
  the common one) may be gone when the resend arrives, and the resent transaction has just written
  its hash again, without the field. For such a job the tokens are also kept in `record`
  (rq:policies:pushed:<id>, record_ttl seconds, far longer than a client takes to resend): a call
  that finds its token there deletes the hash its resend brought back and pushes nothing. An id
  whose hash is gone is pushed as rq would push it, and no hash is made for it.

  KEYS  by name (rq_policies/ops.py): job (rq:job:<id>), dest (the queue's list, or its
        scheduled registry for mode S), record (rq:policies:pushed:<id>)
  ARGV[1]  one msgpack map (lib/codec.lua): jid, token (12 characters), mode (R: push to the
           tail, L: to the head, S: add to the scheduled registry at score), score (mode S), wake (the
           queue's wake-up channel, SPUBLISHed on a list push; nil: none), record_ttl

  Returns 1 when it pushed, 0 for a replay.
]]
local rcall = redis.call
-- @include "lib/codec.lua"
local a = decode_args(ARGV[1])
local job = KEYS[a.k.job]
local got = rcall('HMGET', job, 'policies_push', 'result_ttl', 'status')
local seen = got[1]
if seen and string.find(seen, a.token, 1, true) then
  return 0
end
local result_ttl = tonumber(got[2])
local short = result_ttl and result_ttl >= 0 and result_ttl < a.record_ttl
local record = KEYS[a.k.record]
if short and not seen then  -- a first push, or a hash its resend wrote again (the job ran and was deleted since)
  local recorded = rcall('GET', record)
  if recorded and string.find(recorded, a.token, 1, true) then
    rcall('DEL', job)
    return 0
  end
end
if got[3] then  -- the hash exists (rq writes every job's status)
  local tokens = string.sub(a.token .. ' ' .. (seen or ''), 1, 52)
  rcall('HSET', job, 'policies_push', tokens)
  if short then
    rcall('SET', record, tokens, 'EX', a.record_ttl)
  end
end
local dest = KEYS[a.k.dest]
if a.mode == 'S' then
  rcall('ZADD', dest, a.score, a.jid)
  if a.wake then
    rcall('SPUBLISH', a.wake, 'scheduled ' .. a.score) -- idle PolicyWorkers wake at its due time
  end
  return 1
end
rcall(a.mode == 'L' and 'LPUSH' or 'RPUSH', dest, a.jid)
if a.wake then
  rcall('SPUBLISH', a.wake, a.jid)
end
return 1
