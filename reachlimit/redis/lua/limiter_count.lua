-- The counts every step keeps up to date.
-- Never more than capacity and the queue capacity, but just after the budget was given fewer
-- (its settings are data: limiter_settings.lua); alive holds exactly the queued tokens.
local held = redis.call('ZCARD', holders)
local queued = 0
