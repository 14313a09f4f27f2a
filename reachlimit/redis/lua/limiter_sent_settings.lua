-- Settings sent with the call: ARGV[1] the doorbell key prefix, ARGV[2] active, ARGV[3] the lease
-- (ms), ARGV[4] the presence period (ms).
local bell = ARGV[1]
local capacity = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local presence_ms = tonumber(ARGV[4])
local queue_cap = false  -- not sent: waiters are counted the general way
