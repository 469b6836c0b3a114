--[[
  Clear one identity's policy state on one queue (`rq-policies reset`): its loner marker, its
  throttle slots (the window opens again), its pending trailing job marker and its debounce
  state, in one atomic step. Jobs already written to rq stay where they are: a reset frees the
  identity, it does not delete work (the ids it pointed at are returned so the caller can say so).

  The throttle slot keys carry a slot index that depends on each policy's period, so the caller
  finds them by SCAN (in Python, never here) and passes them in.

  KEYS[1]    loner marker       rq:policies:loner:<q>:<digest>      (STRING)
  KEYS[2]    trailing marker    rq:policies:trailing:<q>:<digest>   (STRING)
  KEYS[3]    debounce state     rq:policies:debounce:<q>:<digest>   (HASH)
  KEYS[4..]  throttle slots     rq:policies:throttle:<q>:<digest>:<slot>

  No ARGV.

  Returns {loner deleted, trailing deleted, debounce deleted, throttle slots deleted,
           loner job id or '', trailing job id or ''}.
]]
local rcall = redis.call

local function take_string(key)
  if rcall('TYPE', key).ok ~= 'string' then
    return 0, ''
  end
  local value = rcall('GET', key)
  rcall('DEL', key)
  return 1, value
end

local loner, loner_id = take_string(KEYS[1])
local trailing, trailing_id = take_string(KEYS[2])
local debounce = rcall('DEL', KEYS[3])
local throttle = 0
for i = 4, #KEYS do
  throttle = throttle + rcall('DEL', KEYS[i])
end
return {loner, trailing, debounce, throttle, loner_id, trailing_id}
