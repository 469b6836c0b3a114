--[[
  Refresh holds one owner has (a worker's heartbeat, a keeper thread; rq_policies.ledger), in one
  call however many ledgers they are in. A hold that already lapsed is not revived: its capacity
  may already have been handed to someone else, and reviving it would run the ledger over its
  cap. The caller learns which holds lapsed, so it can stop refreshing them.

  KEYS  by name (rq_policies/ops.py, built by rq_policies.ledger.refresh_call):
    holds      key list             hold i's ledger, rq:policies:slots:<q> or
                                    rq:policies:lcw-running:<class>
  ARGV[1]  one msgpack map (lib/codec.lua):
    tokens     list                 hold i's token, the member in its ledger
    ttls       list                 hold i's new lifetime, seconds from now (server clock)

  Returns the list of the (1-based) positions of the holds found lapsed (empty when every hold
  was refreshed).
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
  end
end
return lapsed
