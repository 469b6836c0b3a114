--[[
  Clear the loner markers of jobs that stop waiting without a worker taking them (deleted,
  cancelled, removed from their queue, or their queue emptied). Each job hash names its own
  marker (field policies_loner); the marker is deleted only while it still names that job, so a
  late release never frees an identity that a newer job holds.

  KEYS        none (the marker keys are read from the job hashes, which are known only by id)
  ARGV[1]     job key prefix       rq:job:
  ARGV[2..]   job ids

  Returns the number of markers deleted.
]]
local rcall = redis.call
local prefix = ARGV[1]
local removed = 0
for i = 2, #ARGV do
  local jid = ARGV[i]
  local marker = rcall('HGET', prefix .. jid, 'policies_loner')
  if marker and rcall('GET', marker) == jid then
    removed = removed + rcall('DEL', marker)
  end
end
return removed
