-- Settings written into the text of a hot script: each marker between two at-signs is
-- replaced by the limiter's value of that setting (lua/__init__.py, hot_script).
local capacity, lease_ms, presence_ms = @ACTIVE@, @LEASE_MS@, @PRESENCE_MS@
local queue_cap, wait_ms = @QUEUE@, @WAIT_MS@
