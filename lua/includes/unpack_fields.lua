-- Shared: decode the job hash sent as one length-prefixed blob ("<len>:<bytes><len>:<bytes>...",
-- field and value alternating) into the flat table HSET takes. One argument instead of forty
-- saves the client most of its packing work on every enqueue, dropped or admitted.
local function unpack_fields(blob)
  local out = {}
  local pos, size = 1, #blob
  while pos <= size do
    local colon = string.find(blob, ':', pos, true)
    local len = tonumber(string.sub(blob, pos, colon - 1))
    out[#out + 1] = string.sub(blob, colon + 1, colon + len)
    pos = colon + len + 1
  end
  return out
end
