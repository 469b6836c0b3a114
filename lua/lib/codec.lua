-- Shared: decode the one structured argument every script receives (ARGV[1], msgpack built by
-- rq_policies/ops.py with raw strings, so pickled job data passes byte for byte). Redis and Valkey
-- decode it in C (cmsgpack); where that library is missing (fakeredis, for users' unit tests), a
-- small decoder of the same subset takes over: maps, arrays, raw strings, integers, doubles,
-- booleans and nil. A nil in a map leaves the field out, as cmsgpack does.
local function decode_msgpack(data)
  local byte, sub = string.byte, string.sub
  local pos = 1
  local function uint(n)
    local v = 0
    for i = 0, n - 1 do v = v * 256 + byte(data, pos + i) end
    pos = pos + n
    return v
  end
  local function int(n)
    local v = uint(n)
    local half = 2 ^ (8 * n - 1)
    if v >= half then v = v - 2 * half end
    return v
  end
  -- An IEEE 754 float of n bytes (4 or 8): 1 sign bit, e exponent bits, the rest mantissa.
  local function double(n)
    local b = {byte(data, pos, pos + n - 1)}
    pos = pos + n
    local e = n == 8 and 11 or 8
    local bits, bias = 8 * n - 1 - e, 2 ^ (e - 1) - 1
    local split = 2 ^ (15 - e)  -- the second byte holds the exponent's last e - 7 bits above this
    local sign = b[1] >= 128 and -1 or 1
    local exponent = (b[1] % 128) * (256 / split) + math.floor(b[2] / split)
    local mantissa = b[2] % split
    for i = 3, n do mantissa = mantissa * 256 + b[i] end
    if exponent == 0 then return sign * mantissa * 2 ^ (1 - bias - bits) end
    return sign * (1 + mantissa / 2 ^ bits) * 2 ^ (exponent - bias)
  end
  local value
  local function str(n)
    local s = sub(data, pos, pos + n - 1)
    pos = pos + n
    return s
  end
  local function array(n)
    local t = {}
    for i = 1, n do t[i] = value() end
    return t
  end
  local function map(n)
    local t = {}
    for _ = 1, n do
      local k = value()
      t[k] = value()
    end
    return t
  end
  value = function()
    local c = byte(data, pos)
    pos = pos + 1
    if c < 0x80 then return c end
    if c < 0x90 then return map(c - 0x80) end
    if c < 0xa0 then return array(c - 0x90) end
    if c < 0xc0 then return str(c - 0xa0) end
    if c >= 0xe0 then return c - 0x100 end
    if c == 0xc0 then return nil end
    if c == 0xc2 then return false end
    if c == 0xc3 then return true end
    if c == 0xca then return double(4) end
    if c == 0xcb then return double(8) end
    if c >= 0xcc and c <= 0xcf then return uint(2 ^ (c - 0xcc)) end
    if c >= 0xd0 and c <= 0xd3 then return int(2 ^ (c - 0xd0)) end
    if c == 0xd9 or c == 0xc4 then return str(uint(1)) end
    if c == 0xda or c == 0xc5 then return str(uint(2)) end
    if c == 0xdb or c == 0xc6 then return str(uint(4)) end
    if c == 0xdc then return array(uint(2)) end
    if c == 0xdd then return array(uint(4)) end
    if c == 0xde then return map(uint(2)) end
    if c == 0xdf then return map(uint(4)) end
    error('rq-policies: cannot decode msgpack type ' .. c)
  end
  return value()
end

local function decode_args(data)
  if cmsgpack then return cmsgpack.unpack(data) end
  return decode_msgpack(data)
end
