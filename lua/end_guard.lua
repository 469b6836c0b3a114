--[[
  The guard of a job's successful end sent without rq's WATCH and SMEMBERS round trips. The worker
  sends, in one write: WATCH of the job's dependents set and of KEYS[4], this script, then rq's own
  end-of-run transaction (MULTI ... EXEC, as rq builds it). rq's end hands the job's dependents over
  in that transaction when it has any (its WATCH, then SMEMBERS, decides): here, when the job has
  dependents, or when this very end was written already (a lost reply, sent again), the script
  writes KEYS[4] (a key the same connection WATCHes), so the EXEC that follows runs nothing, and
  answers why. Otherwise it writes nothing and the transaction runs, as rq's would after an empty
  SMEMBERS, unless another client changed the dependents set after the WATCH (rq's own race rule).
  Its one write is a short-lived SET of its own key: safe to run twice.

  KEYS
    1  the job's dependents set (rq's <prefix>:job:<id>:dependents)
    2  the job's hash (rq's <prefix>:job:<id>)
    3  the job's started registry (rq's StartedJobRegistry of its queue)
    4  rq:policies:endguard:<job id>   the key this script writes to stop the EXEC
  ARGV
    1  the job's ended_at as this end writes it in the hash
    2  the run's execution in the started registry ('<job id>:<execution id>')
    3  milliseconds KEYS[4] lives

  Returns 0 (the transaction runs), 1 (the job has dependents: the worker sends rq's own end, which
  hands them over) or 2 (this end was written already: nothing to send). Written means: the run's
  execution is off the started registry (the end's transaction takes it off) and the job's hash
  holds this run's ended_at, a value no other write has (whatever status came after it: a repeat
  re-enqueued, a later run started), or is gone (result_ttl=0: the end deleted it).
]]
if redis.call('ZSCORE', KEYS[3], ARGV[2]) == false then
  local status, ended = unpack(redis.call('HMGET', KEYS[2], 'status', 'ended_at'))
  if status == false or ended == ARGV[1] then
    redis.call('SET', KEYS[4], '1', 'PX', ARGV[3])
    return 2
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('SET', KEYS[4], '1', 'PX', ARGV[3])
  return 1
end
return 0
