-- Shared: record the gauges the metrics collector exports, and the class in the index (both expire a
-- day after the class was last seen).
local function lcw_report(state, index, class, queue_name, max, remaining, now, state_ttl)
  redis.call('HSET', state, 'queue', queue_name, 'max', max, 'remaining', remaining, 'updated', now)
  redis.call('EXPIRE', state, state_ttl)
  redis.call('ZADD', index, now, class)
  redis.call('ZREMRANGEBYSCORE', index, '-inf', now - state_ttl)
  redis.call('EXPIRE', index, state_ttl)
end
