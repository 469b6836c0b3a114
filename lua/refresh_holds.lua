--[[
  Refresh holds one owner has (a worker's heartbeat, a keeper; rq_policies.ledger), in one call
  however many ledgers they are in. The owner refreshes only while its job runs, so a hold found
  lapsed (it expired in a stall longer than its ttl, or vanished with a restart without
  persistence) is written again: a running job is counted, even if that puts the ledger over its
  cap until enough jobs end (new fetches are refused meanwhile). A lapse must not be silent: it
  is counted in the lapses hash (field lapse_fields[i]), and the caller learns which holds
  lapsed, to log them.

  KEYS  by name (rq_policies/ops.py, built by rq_policies.ledger.refresh_call):
    holds      key list             hold i's ledger, rq:policies:slots:<q> or
                                    rq:policies:lcw-running:<class>
    lapses     key                  rq:policies:lapses, HASH of lapse counters
  ARGV[1]  one msgpack map (lib/codec.lua):
    tokens     list                 hold i's token, the member in its ledger
    ttls       list                 hold i's new lifetime, seconds from now (server clock)
    fields     list                 hold i's field in the lapses hash (queue:<q>, lcw:<class>)

  Returns the list of the (1-based) positions of the holds found lapsed and re-added (empty
  when every hold was live).
]]
local rcall = redis.call

-- @include "lib/codec.lua"
-- @include "lib/server_time.lua"
-- @include "lib/outlive.lua"
-- @include "lib/ledger_refresh.lua"

local a = decode_args(ARGV[1])
local first, n = a.kl.holds[1], a.kl.holds[2]
local now = server_now()
local lapsed = {}
for i = 1, n do
  if not ledger_refresh(KEYS[first + i - 1], a.tokens[i], a.ttls[i], now) then
    lapsed[#lapsed + 1] = i
    rcall('HINCRBY', KEYS[a.k.lapses], a.fields[i], 1)
  end
end
return lapsed
