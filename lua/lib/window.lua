-- Shared: the epoch-aligned throttle window the server clock is in. Window number i covers
-- [i * width, (i + 1) * width) seconds since the Unix epoch, so every producer means the same
-- window whatever its own clock says. A window key is the identity's prefix (built by keys.py,
-- passed in KEYS) plus the window number, which comes from the server clock and so cannot
-- arrive in KEYS.
-- @include "lib/keys.lua"
local function window_at(now, width)
  local index = math.floor(now / width)
  return index, (index + 1) * width
end

local function window_key(prefix, index)
  return key_num(prefix, index)
end
