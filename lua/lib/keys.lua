-- Shared: every key a script builds rather than receives whole in KEYS, from a prefix that arrived
-- in KEYS or ARGV. Each prefix is built in rq_policies/engine/keys.py (ours: a keys.Space, whose
-- call builds the same key in Python; tests/engine/test_keys_lua.py checks that the two agree for
-- every family) or is one of rq's own (rq:job:, rq:queue:, rq:deferred:, rq:worker:):
--   key_of(prefix, a)     <prefix><a>      a job's hash, a queue, a registry, a worker, a tombstone,
--                                          a liveness key, a wake channel, a per-key key (a = its key
--                                          id), Fair's active queue keys and a paused key's queues
--   key_of(prefix, a, b)  <prefix><a>:<b>  a parked list (keyparked:<policy>:<key id>), Fair's line
--                                          and its counter (fair:wait:<queue>:<key id>, fair:seq:...),
--                                          a job's dependents (rq:job:<id>:dependents)
--   key_num(prefix, n)    <prefix><n>      n an integer: a throttle window, a per-minute drop counter
local function key_of(prefix, a, b)
  if b then
    return prefix .. a .. ':' .. b
  end
  return prefix .. a
end

-- rq's key of a job's dependencies, as rq spells it: its job prefix, a colon, the id
-- (rq:job::<id>:dependencies; Job.dependencies_key).
local function rq_dependencies_key(job_prefix, jid)
  return key_of(job_prefix, ':' .. jid, 'dependencies')
end

local function key_num(prefix, n)
  return prefix .. string.format('%d', n)
end
