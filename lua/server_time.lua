--[[
  The server's clock, as TIME gives it, read on the node that serves KEYS[1]: what a Redis Cluster pipeline carries
  instead of TIME, which has no key (redis-py's cluster pipeline refuses it, or sends it to any node). Sent as
  EVAL_RO by rq_policies.ops.time_in, so a reader that balances its reads over replicas reads a replica's clock,
  as it reads the rest there.

  KEYS  routing only (never read or written):
    route    a key in the prefix's slot (rq_policies.keys.PREFIX)
  ARGV  none

  Returns {seconds, microseconds}, integers, as TIME answers.
]]
local t = redis.call('TIME')
return {tonumber(t[1]), tonumber(t[2])}
