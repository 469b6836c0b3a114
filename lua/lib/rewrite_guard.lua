-- Shared (lua/fetch.lua): a popped job that carries a rewrite guard (its id's tombstone starts
-- with "rewrite ", written by lib/pending.lua's rewrite_pending when an enqueue rewrote the
-- pending job in place). rq's scheduler reads due jobs by its own host's clock and writes them
-- back to the queue in a second step, from the job it read: a host clock ahead of the server's
-- can thus write the payload from before the rewrite back over it and queue the job early. The
-- guard holds the rewritten payload and run time: when the job's data differs from it, the
-- payload is restored, and a job whose run time has not come is put back in the scheduled
-- registry (status scheduled, no enqueued_at, as rq's schedule_job writes it) instead of being
-- handed out. Either way the guard goes: it was only for this one move.
-- Returns true when the job went back to wait (the caller does not hand it out).
local function unpack_strings(s)
  local out, pos = {}, 1
  while pos <= #s do
    local colon = string.find(s, ':', pos, true)
    local n = tonumber(string.sub(s, pos, colon - 1))
    out[#out + 1] = string.sub(s, colon + 1, colon + n)
    pos = colon + n + 1
  end
  return out
end

local function rewrite_guard(job_key, jid, guard_key, guard, now)
  rcall('DEL', guard_key)
  local kept = unpack_strings(string.sub(guard, 9))
  local registry, score = kept[1], tonumber(kept[2])
  local restore, drop, stale = {}, {}, false
  for i = 3, #kept - 1, 2 do
    local name, value = kept[i], kept[i + 1]
    if value == '-' then
      drop[#drop + 1] = name
    else
      value = string.sub(value, 2)
      restore[#restore + 1] = name
      restore[#restore + 1] = value
      -- Only the data tells a stale write: the app may change meta through a handle meanwhile.
      if name == 'data' and rcall('HGET', job_key, 'data') ~= value then stale = true end
    end
  end
  if not stale then return false end
  if #restore > 0 then rcall('HSET', job_key, unpack(restore)) end
  if #drop > 0 then rcall('HDEL', job_key, unpack(drop)) end
  if score and score > now then
    rcall('ZADD', registry, score, jid)
    rcall('HSET', job_key, 'status', 'scheduled')
    rcall('HDEL', job_key, 'enqueued_at')
    return true
  end
  return false
end
