-- Shared (per-key policies): the server time until which the key `key_id` (its key id,
-- '<scope>:<key>') is blocked by a BackOff(key=True) (rq:policies:keyblock:<scope>:<key>, a STRING
-- '%.6f' expiring with the block), or nil when it is not blocked at `now`.
-- @include "lib/keys.lua"
local function key_blocked(kp, key_id, now)
  local until_ = tonumber(redis.call('GET', key_of(kp.block, key_id)))
  if until_ and until_ > now then
    return until_
  end
  return nil
end
