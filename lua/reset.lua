--[[
  Clear one identity's state on one queue, for every admission policy (PolicyQueue.reset, the Go
  throttler's Reset, and `rq-policies reset`), in one atomic step. Each policy part's
  reset(ctx, p) removes what it wrote for the identity: a loner marker, the current and next
  throttle windows and the pending trailing job, the pending debounced job. Pending jobs are
  deleted (out of the scheduled registry, hash removed); a job already queued or running is
  left alone, only the key that held its identity goes.

  KEYS  by name (rq_policies/ops.py): registry (rq:scheduled:<q>), each policy's keys
        ('<policy>.<what>'), and the key list `scanned`: keys found by SCAN that are deleted
        as they are (throttle windows whose width the caller did not know); answer
        (rq:policies:answer:<request id>, lib/answer.lua)
  ARGV[1]  msgpack map: job_prefix (rq:job:), order (policy names), p (name -> arguments),
           tombstone and tombstone_ttl (what a dropped pending job leaves, lib/pending.lua),
           answer_ttl (seconds the answer is kept)

  Returns how many keys were removed (policy keys and the hashes of dropped pending jobs); a
  replay (the same request id) answers what the first run did and removes nothing more.
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/answer.lua"

local a = decode_args(ARGV[1])
local kept = kept_answer(a)
if kept then
  return tonumber(kept)
end
local P = {}
-- @policies

local ctx = {now = server_now(), job_prefix = a.job_prefix, removed = 0, tomb = a.tombstone,
             tomb_ttl = a.tombstone_ttl}
function ctx.key(name)
  return KEYS[a.k[name]]
end

for _, name in ipairs(a.order) do
  local part = P[name]
  if part and part.reset then part.reset(ctx, a.p[name]) end
end
local scanned = a.kl.scanned
for i = scanned[1], scanned[1] + scanned[2] - 1 do
  ctx.removed = ctx.removed + rcall('DEL', KEYS[i])
end
return keep_answer(a, ctx.removed)
