-- Shared: make job `jid` the holder of a loner marker. The marker lives as long as the job hash
-- (ttl seconds, or for good with -1), so it never outlives the job it names. With `cap_ms`
-- (Loner(ttl=N)) it lives at most that many milliseconds whatever the job does: the identity is
-- held at most N seconds (a deferred job's, `deferred`, lives the cap itself, not its hash's
-- short lease, since that lease ends once rq has set up the dependencies).
local function take_marker(key, jid, ttl, cap_ms, deferred)
  if cap_ms then
    local ms = cap_ms
    if ttl > 0 and not deferred and ttl * 1000 < ms then ms = ttl * 1000 end
    redis.call('SET', key, jid, 'PX', ms)
  elseif ttl > 0 then
    redis.call('SET', key, jid, 'EX', ttl)
  else
    redis.call('SET', key, jid)
  end
end
