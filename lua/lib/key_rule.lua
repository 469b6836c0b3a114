-- Shared (per-key policies): the setting a scope's stated rule gives one key, read by the very
-- script that decides (Concurrency.set_rule, Rate.set_rule: rq_policies.engine.keyed.Tiers).
-- A rule is stored once per policy and scope in rq:policies:keyrules (ctx.kp.rules, HASH
-- '<policy>:<scope>' -> msgpack array {default, prefix 1, setting 1, prefix 2, setting 2, ...},
-- the settings as the policy stores a run-time setting: '<limit>' for Concurrency,
-- '<limit> <per> <burst>' for Rate). The key's setting is the one of the longest prefix the key
-- (the part of the key id after '<scope>:') starts with, else the default; the caller puts a
-- per-key setting (Concurrency.set, Rate.set) on top and uses the job's declared setting only
-- when the scope has no rule. Returns the setting and the prefix that gave it ('' for the
-- default), or nil when the scope has no rule. One HGET; the rule holds at most 64 prefixes.
-- @include "lib/codec.lua"
local function key_rule(kp, policy, key_id)
  local scope, key = string.match(key_id, '^([^:]*):(.*)$')
  if not scope then
    return nil
  end
  local raw = redis.call('HGET', kp.rules, policy .. ':' .. scope)
  if not raw then
    return nil
  end
  local rule = decode_args(raw)
  local best, tier, longest = rule[1], '', -1
  for i = 2, #rule - 1, 2 do
    local prefix = rule[i]
    if #prefix > longest and string.sub(key, 1, #prefix) == prefix then
      best, tier, longest = rule[i + 1], prefix, #prefix
    end
  end
  return best, tier
end
