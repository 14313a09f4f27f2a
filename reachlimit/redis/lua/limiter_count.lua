-- The counts every step keeps up to date.
local held = redis.call('ZCARD', holders)  -- never more than capacity
local queued = 0  -- never more than the queue capacity; alive holds exactly the queued tokens
