--[[
  The narrow admission: what lua/admit.lua does for the commonest calls, in flat arguments. A job
  with no policy (PolicyQueue's plain enqueue), or with a Loner alone that drops or raises on a
  conflict (not 'replace'), written now at its queue's tail or head or scheduled (modes R, L, S),
  not forced (rq_policies.admission chooses: every other call goes to admit.lua); and the probe of such
  a Loner (mode N with the option `probe`: the checks only, for an enqueue expected to be dropped).
  The same check, the same writes in the same order and the same reply as admit.lua with loner's
  part (lua/policies/loner.lua: lib/loner_held.lua, lib/take_marker.lua), without what admit.lua
  pays before any policy decides: the msgpack decode of its one argument, the parts' loaders and
  the context (docs/scaling.md: the Loner admission's server time, part by part). Safe to run
  twice: a replay finds its own `created` in the job hash (or in the record) and writes nothing.

  KEYS  1 job (rq:job:<id>), 2 dest (the queue list, or the scheduled registry for mode S),
        3 queues (rq:queues) (a probe touches none of the three: rq:job:<its id, or ''>, the queue
        list and rq:queues are passed, so every call's KEYS start alike); with a Loner 4 its marker (rq:policies:loner:<q>:<digest>), 5 drops
        (rq:policies:drops), 6 drops_minute (rq:policies:drops-minute:); then, each only when its
        option is given, record (rq:policies:pushed:<id>) and dropped (rq:policies:dropped:<id>)
  ARGV  1 jid ('' in a probe without an explicit id), 2 created (the job's created_at as its hash holds it;
        '' in a probe), 3 mode (R | L | S; N in a probe),
        4 score (epoch seconds, mode S; else 0), 5 ttl (seconds the hash lives, -1: no expiry),
        6 queue_key (rq:queue:<q>), 7 wake (rq:policies:wake:<q>), 8 F, the index of the job's
        first field; then, from 9 to F - 1, options as name/value pairs:
          loner      the Loner's field in the drop counters (<policy>:<q>): a Loner call
          job_prefix rq:job: (a Loner call: its holder's hash)
          worker     rq:worker: prefix, alive: rq:policies:alive: prefix (a Loner call)
          finished   '1': Loner(until='finished')
          ttl_ms     Loner(ttl=N) in milliseconds
          record     record_ttl: KEYS `record` keeps `created` that long (a job rq deletes soon
                     after it runs: a replay that arrives after that still writes nothing)
          dropped    dropped_ttl: KEYS `dropped` (an id the caller chose): a drop leaves its record,
                     an admission clears the id's tombstone (prefix: the option `tombstone`)
          tombstone  rq:policies:superseded:
          probe      '1': the checks only (admit.lua's `probe`); mode N, no fields
        F.. the job hash as a flat field/value list

  Returns admit.lua's verdict (its header): code 1 with job (admitted, or this very call's replay,
  then with policy 'loner' when the marker told it), or code 0 with policy 'loner' and the holder;
  a probe: code 0 as a drop, or -1 (nothing to drop; with policy 'loner' and the job when the marker
  names this very id: the full path answers that replay).
]]
local rcall = redis.call

-- @include "lib/keys.lua"
-- @include "lib/save_job.lua"
-- @include "lib/count_drop.lua"
-- @include "lib/drop_record.lua"
-- @include "lib/take_marker.lua"
-- @include "lib/loner_held.lua"

local jid, created, mode = ARGV[1], ARGV[2], ARGV[3]
local first = tonumber(ARGV[8])
local o = {}
for i = 9, first - 2, 2 do
  o[ARGV[i]] = ARGV[i + 1]
end
local job_key, at = KEYS[1], 4
local marker, drops, drops_minute, record, dropped
if o.loner then
  marker, drops, drops_minute, at = KEYS[4], KEYS[5], KEYS[6], 7
end
if o.record then
  record, at = KEYS[at], at + 1
end
if o.dropped then
  dropped = KEYS[at]
end

-- A replay of this very call (admit.lua's first check): the hash holds its creation time, or for a
-- job rq already deleted, the record does.
if created ~= '' then
  local prior = rcall('HGET', job_key, 'created_at')
  if prior == created or (not prior and record and rcall('GET', record) == created) then
    return {'code', 1, 'job', jid}
  end
end

local ttl = tonumber(ARGV[5])
if marker then
  local holder = rcall('GET', marker)
  if holder and loner_held(o.job_prefix, {finished = o.finished, worker_prefix = o.worker,
                                          alive_prefix = o.alive}, holder) then
    if holder == jid then
      return {'code', o.probe and -1 or 1, 'policy', 'loner', 'job', jid}
    end
    count_drop(drops, drops_minute, o.loner, 0)
    if dropped then
      record_drop(dropped, 'loner', holder, 0, ARGV[6], o.dropped)
    end
    return {'code', 0, 'policy', 'loner', 'job', holder}
  end
  if o.probe then
    return {'code', -1}
  end
  take_marker(marker, jid, ttl, tonumber(o.ttl_ms), false)
end
if dropped then
  rcall('DEL', key_of(o.tombstone, jid))
end

rcall('HSET', job_key, unpack(ARGV, first))
place_job(job_key, KEYS[2], KEYS[3], ARGV[6], jid, mode, ARGV[4], ttl, ARGV[7])
if record then
  rcall('SET', record, created, 'EX', o.record)
end
return {'code', 1, 'job', jid}
