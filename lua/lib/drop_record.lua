-- Shared: the record `rq-policies explain` reads of an enqueue a policy dropped (a dropped enqueue
-- writes no job, so nothing else would say why that id never ran): under `key`
-- (rq:policies:dropped:<job id>), for `ttl` seconds, the policy, the job that held the identity, the
-- policy's number (a throttle slot's end) and the queue key; when it happened is the ttl's start.
-- Written only for an id the caller chose: an id rq drew is never seen by anyone, and the common
-- path writes nothing more. It holds no clock reading, so a replay writes the very same value.
local function record_drop(key, policy, holder, n, queue_key, ttl)
  redis.call('SET', key, cjson.encode({policy = policy, holder = holder or '', n = n, queue = queue_key}), 'EX', ttl)
end
