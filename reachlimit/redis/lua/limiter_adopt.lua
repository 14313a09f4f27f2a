-- Adopt the builds an in-process fallback admitted while Redis was away (ResilientLimiter, as
-- Redis comes back): ARGV[4..] their tokens. Each becomes a holder with a lease, whatever
-- ``held`` is (they run already: over the capacity if need be), so that no slot is given to
-- anyone while fewer than ``capacity`` of them have ended; their release is the release
-- script's general path. A token held already or given up is left as it is. Not counted as
-- acquired (the fallback admitted it). Replies how many were adopted.
local adopted = 0
for i = 4, #ARGV do
  if not redis.call('ZSCORE', holders, ARGV[i])
      and not redis.call('ZSCORE', tag .. 'gone', ARGV[i]) then
    redis.call('ZADD', holders, now + lease_ms, ARGV[i])
    adopted = adopted + 1
  end
end
if adopted > 0 then raise_peak('peak_active', held + adopted) end
return adopted
