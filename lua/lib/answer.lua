-- Shared: the answer of an admin call that depends on what the call itself changed (a clear: was
-- there a setting to remove; a pause: was the key not paused yet; a reset: how many keys went). A
-- replay of the call (redis-py resending it after a lost reply) would find the change made and
-- answer otherwise (False, 0) although the first run made it. So the first run keeps its answer
-- under the call's request id (KEYS[a.k.answer], rq:policies:answer:<request id>, a.answer_ttl
-- seconds), and a run that finds it there is a replay: it answers the same and writes nothing
-- (the first run wrote it; writing it again could undo a change another call made since). A call
-- without the key (a pipeline's, which reads no answer) keeps nothing.
local function kept_answer(a)
  local key = a.k.answer and KEYS[a.k.answer]
  return key and redis.call('GET', key)
end
local function keep_answer(a, value)
  local key = a.k.answer and KEYS[a.k.answer]
  if key then
    redis.call('SET', key, value, 'EX', a.answer_ttl)
  end
  return value
end
