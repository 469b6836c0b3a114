-- Shared: make a ledger key live at least `ttl` more seconds (never shorten it), so the key
-- expires by itself once its last hold could have, and no reaper is ever needed.
local function outlive(key, ttl)
  local want = math.ceil(ttl) + 1
  if redis.call('TTL', key) < want then
    redis.call('EXPIRE', key, want)
  end
end
