-- Redis's clock, in ms: every deadline and lease is decided by it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
