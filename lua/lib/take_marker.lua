-- Shared: make job `jid` the holder of a loner marker. The marker lives as long as the job hash
-- (ttl seconds, or for good with -1), so it never outlives the job it names.
local function take_marker(key, jid, ttl)
  if ttl > 0 then
    redis.call('SET', key, jid, 'EX', ttl)
  else
    redis.call('SET', key, jid)
  end
end
