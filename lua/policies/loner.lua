--[[
  Policy part: loner (one waiting job per identity per queue). Included by the framework scripts
  through `-- @policies`; defines functions only, and writes nothing until the framework calls it.

  taken(job_key, jid): at fetch, the job was taken off its queue: free its identity. The job hash
  names its marker (field policies_loner); the marker is deleted only while it still names this
  job, so a later holder of the identity keeps it.
]]
P.loner = {}

function P.loner.taken(job_key, jid)
  local marker = redis.call('HGET', job_key, 'policies_loner')
  if marker and redis.call('GET', marker) == jid then
    redis.call('DEL', marker)
  end
end
