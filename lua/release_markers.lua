--[[
  Free the loner identities these jobs hold, because they stopped waiting (deleted,
  cancelled, removed from their queue, or their queue emptied). Each job hash names its own
  marker (field policies_loner); the marker is deleted only while it still names that job, so a
  late release never frees an identity that a newer job holds.

  KEYS  none: each marker is named by its job's hash (written there by the admission, which had
        the key in KEYS)
  ARGV[1]  msgpack map: job_prefix (rq:job:), jobs (the job ids)

  Returns how many markers were deleted.
]]
local rcall = redis.call
-- @include "lib/codec.lua"
local a = decode_args(ARGV[1])
local removed = 0
for _, jid in ipairs(a.jobs) do
  local marker = rcall('HGET', a.job_prefix .. jid, 'policies_loner')
  if marker and rcall('GET', marker) == jid then
    removed = removed + rcall('DEL', marker)
  end
end
return removed
