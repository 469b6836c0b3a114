-- Shared: a pending job in rq's scheduled registry (a trailing or debounced job).
-- pending_at: is job `jid` still pending, its run time not yet reached? A job whose time has
-- come may be in the middle of rq's scheduler moving it to the queue, so it is never replaced or
-- dropped: only a job that cannot have been picked up yet is.
-- drop_pending: take such a job out of the registry and delete its hash, in that order, only
-- while it is still pending, and leave a tombstone (`tomb` .. jid, `tomb_ttl` seconds): rq's
-- scheduler reads due jobs by its own host's clock and writes them back to the queue in a second
-- step, so a host clock ahead of the server's can bring the deleted job back after this drop;
-- the fetch then finds the tombstone and drops that id. The tombstone names what superseded the
-- job, `policy` and job id `by` ("<policy> <id>"; "reset " for rq-policies reset), which
-- rq-policies explain reads; a job replaced by an enqueue of its own id is written again at once
-- and leaves none (it would drop itself). Returns 1 when it was dropped.
-- tomb_write: write tombstone `tomb` .. `jid`, and keep the tombstones' marker alive at least as
-- long: the tombstone prefix itself (the key `tomb`, the tombstone of no job), as every version
-- since the probe reads it (so tombstones written before an upgrade are still checked): while it
-- is absent no tombstone exists, so the fetch skips its per-job tombstone read (lua/fetch.lua's
-- probe; keys.SUPERSEDED_MARKER).
-- @include "lib/keys.lua"
local function tomb_write(tomb, jid, value, ttl)
  redis.call('SET', key_of(tomb, jid), value, 'EX', ttl)
  if redis.call('TTL', tomb) < ttl then
    redis.call('SET', tomb, '1', 'EX', ttl)
  end
end

local function pending_at(registry, jid, now)
  if not jid then return false end
  local score = redis.call('ZSCORE', registry, jid)
  return score and tonumber(score) > now
end

local function drop_pending(registry, job_prefix, jid, now, tomb, tomb_ttl, policy, by)
  if not pending_at(registry, jid, now) then return 0 end
  redis.call('ZREM', registry, jid)
  redis.call('DEL', key_of(job_prefix, jid))
  if tomb and by ~= jid then
    tomb_write(tomb, jid, (policy or 'reset') .. ' ' .. (by or ''), tomb_ttl)
  end
  return 1
end

-- rewrite_pending: a replacing enqueue (Debounce, a trailing Throttle) rewrites pending job
-- `holder` in place instead of deleting it: same id, so every handle the app kept reads the job
-- that will run. Its payload (data, description, meta, and the call-derived policy fields named
-- in `extra`) becomes this call's (`fields`, the flat list the call would have written; a field
-- the call lacks is deleted), its run time `score` (its place in `registry`), and it names this
-- call's job id in policies_replaced_by. Everything else (created_at, the enqueue options) stays.
-- Two records, each under the tombstone prefix (`ctx.tomb`):
--   * this call's id (when it is not the holder's): "<policy> <holder> merged <created>" (the
--     call's created_at), for explain (the
--     id the app never got names the job its payload went into) and for a resend of this very
--     call (merged_into: answered as the first attempt was, nothing rewritten again);
--   * the holder's: a rewrite guard, "rewrite " .. the new payload and run time, until the run
--     time plus ctx.tomb_ttl: rq's scheduler reads due jobs by its own host's clock and writes
--     them back in a second step, so a host clock ahead of the server's can write the old payload
--     back over this rewrite and queue the job early; the fetch then finds the guard, restores
--     the payload and puts the job back to wait for its time (lua/fetch.lua, rewrite_guard).
local REWRITE_PAYLOAD = {'data', 'description', 'meta'}

local function pack_strings(list)
  local out = {}
  for i, s in ipairs(list) do
    out[i] = #s .. ':' .. s
  end
  return table.concat(out)
end

local function rewrite_pending(ctx, holder, fields, extra, registry, score, policy)
  local key = key_of(ctx.job_prefix, holder)
  local new = {}
  for i = 1, #fields - 1, 2 do
    new[fields[i]] = fields[i + 1]
  end
  local set = {'policies_replaced_by', ctx.jid}
  local kept = {registry, tostring(score)}
  local names = {unpack(REWRITE_PAYLOAD)}
  for _, name in ipairs(extra or {}) do names[#names + 1] = name end
  for _, name in ipairs(names) do
    local value = new[name]
    kept[#kept + 1] = name
    if value then
      set[#set + 1] = name
      set[#set + 1] = value
      kept[#kept + 1] = '+' .. value
    else
      rcall('HDEL', key, name)
      kept[#kept + 1] = '-'
    end
  end
  rcall('HSET', key, unpack(set))
  rcall('ZADD', registry, 'XX', score, holder)
  if ctx.tomb then
    local ttl = math.ceil(score - ctx.now) + ctx.tomb_ttl
    if ttl < 1 then ttl = 1 end
    tomb_write(ctx.tomb, holder, 'rewrite ' .. pack_strings(kept), ttl)
    if ctx.jid ~= '' and ctx.jid ~= holder then
      tomb_write(ctx.tomb, ctx.jid, policy .. ' ' .. holder .. ' merged ' .. (ctx.created or ''), ctx.tomb_ttl)
    end
  end
end

-- merged_into: the job this call's id was merged into by `policy` (a resend of a call whose
-- rewrite already happened: the record holds this very call's creation time, which no other call
-- shares, so a later call reusing a chosen id is not taken for a resend), or nil.
local function merged_into(ctx, policy)
  if not ctx.tomb or ctx.jid == '' then return nil end
  local record = rcall('GET', key_of(ctx.tomb, ctx.jid))
  if not record then return nil end
  local name, holder, created = string.match(record, '^(%S+) (%S+) merged ?(%S*)$')
  if name == policy and created == (ctx.created or '') then return holder end
  return nil
end

-- replaceable: is `jid` a pending job that can still be rewritten in place (its run time not yet
-- come, its hash still there)?
local function replaceable(registry, job_prefix, jid, now)
  return pending_at(registry, jid, now) and rcall('EXISTS', key_of(job_prefix, jid)) == 1
end
