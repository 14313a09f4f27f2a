-- Drop a flight's claim if a process that died made it (run by that process's parent, the
-- gunicorn master: release_claims in ../_owners.py), or if it is the claim of one token (a
-- script whose reply was lost may have left it: RedisSingleFlight._claiming). Self-contained.
-- KEYS[1] the flight's claim, F:lead. ARGV[1] the dead process's owner prefix,
-- "<host>:<boot id>:<pid>:", or a whole token (tokens have one length: a token is the only
-- token that starts with it).
-- A claim is "<flight>:<token>" and every token starts with its owner, so the claim is deleted
-- only when its token starts with ARGV[1]; the flight's followers then take it over at their
-- next check (no claim and no outcome: the leader is gone) instead of when its lease ends.
-- Anything else under that name (not a string, another's claim) is left as it is.
-- Replies 1 if it dropped the claim, else 0.
local lead, owner = KEYS[1], ARGV[1]
if redis.call('TYPE', lead).ok ~= 'string' then return 0 end
local claim = redis.call('GET', lead)
local n = string.match(claim, '^(%d+):')
if n and string.sub(claim, #n + 2, #n + 1 + #owner) == owner then
  redis.call('DEL', lead)
  return 1
end
return 0
