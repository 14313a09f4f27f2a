-- Release's general path. ARGV[4] token, ARGV[5] "t" for a timed grant. Replies 1 if the slot
-- was still this grant's, else 0. A timed release records its time (the estimate may grow) and,
-- with the budget's deadline on, refuses the waiters who are now late.
local mine = redis.call('ZREM', holders, ARGV[4])
if mine == 1 then
  if ARGV[5] then took(ARGV[4]) end
  held = held - 1
  promote()
  if ARGV[5] and deadline_on and queued > 0 then
    local estimate = tonumber(redis.call('HGET', stats, 'estimate_ms'))
    if estimate then refuse_late(estimate) end
  end
end
return mine
