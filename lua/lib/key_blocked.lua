-- Shared (per-key policies): the server time until which key `channel` ('<scope>:<key>') is
-- blocked by a BackOff(key=True) (rq:policies:keyblock:<scope>:<key>, a STRING '%.6f' expiring
-- with the block), or nil when it is not blocked at `now`.
local function key_blocked(kp, channel, now)
  local until_ = tonumber(redis.call('GET', kp.block .. channel))
  if until_ and until_ > now then
    return until_
  end
  return nil
end
