-- A singleflight shared through Redis (RedisSingleFlight, reachlimit/redis/_flight.py, whose
-- design note says what each operation is for): every operation on one key's flights, the
-- first argument naming which.
--
-- KEYS (one hash tag per caller's key, F = {<prefix>:<name>:<digest>}: one Cluster slot)
--   1 F:lead   the claim: "<flight>:<token>", with the claim's lease (PX)
--   2 F:n      the flight counter: flight numbers come from INCR (not passed to drop)
-- Keys built from F, the text of KEYS[1] before "lead" (same hash tag, same slot)
--   F:out:<n>   flight n's outcome           F:w:<n>   how many followers wait on flight n
--   F:bell:<n>  flight n's doorbell: the publish pushes one element per follower
--
-- ARGV
--   1 the operation: join, check, publish, renew or drop
--   2 our token (drop: the owner prefix of a process that died, or a whole token)
--   3 the claim's lease (ms)         4 how long the counter outlives the last write (ms)
--   check, renew   5 the flight      publish   5 the flight, 6 the outcome, 7 how long the
--                                              outcome stays (ms)
-- Replies {status, flight[, outcome]} (join and check): 0 lead flight n (claimed), 1 follow
-- flight n, 2 flight n has ended with this outcome; publish, renew and drop: 1 or 0.
--
-- Run on its own, say: redis-cli --eval flight.lua {p:n:k}:lead {p:n:k}:n , join me 5000 20000

local op = ARGV[1]
local lead, counter = KEYS[1], KEYS[2]
local base = string.sub(lead, 1, -5)  -- "F:" of "F:lead"
local token = ARGV[2]
local lease, keep = tonumber(ARGV[3]), tonumber(ARGV[4])

if op == 'drop' then
  -- Drop a flight's claim if a process that died made it (run by that process's parent, the
  -- gunicorn master: release_claims in ../_owners.py), or if it is the claim of one token (a
  -- script whose reply was lost may have left it: RedisSingleFlight._claiming). A claim is
  -- "<flight>:<token>" and every token starts with its owner, so the claim is deleted only
  -- when its token starts with ARGV[2] (tokens have one length: a token is the only token
  -- that starts with it); the flight's followers then take it over at their next check (no
  -- claim and no outcome: the leader is gone) instead of when its lease ends. Anything else
  -- under that name (not a string, another's claim) is left as it is.
  if redis.call('TYPE', lead).ok ~= 'string' then return 0 end
  local claim = redis.call('GET', lead)
  local n = string.match(claim, '^(%d+):')
  if n and string.sub(claim, #n + 2, #n + 1 + #token) == token then
    redis.call('DEL', lead)
    return 1
  end
  return 0
end

if op == 'renew' then
  -- Push the claim's lease end if the claim is still ours (1), else 0.
  if redis.call('GET', lead) == ARGV[5] .. ':' .. token then
    redis.call('PEXPIRE', lead, lease)
    redis.call('PEXPIRE', counter, keep)
    return 1
  end
  return 0
end

if op == 'publish' then
  -- SET the outcome NX (the first outcome of a flight wins), drop the claim if it is still
  -- ours, and push the doorbell once per counted follower. 1 if this outcome was the first.
  local n = ARGV[5]
  local first = redis.call('SET', base .. 'out:' .. n, ARGV[6], 'PX', tonumber(ARGV[7]), 'NX')
  if redis.call('GET', lead) == n .. ':' .. token then redis.call('DEL', lead) end
  redis.call('PEXPIRE', counter, keep)
  if not first then return 0 end
  local waiting = tonumber(redis.call('GET', base .. 'w:' .. n)) or 0
  redis.call('DEL', base .. 'w:' .. n)
  local bell = base .. 'bell:' .. n
  for _ = 1, waiting do redis.call('RPUSH', bell, 1) end
  if waiting > 0 then redis.call('PEXPIRE', bell, tonumber(ARGV[7])) end
  return 1
end

local function flight_of(claim)
  return tonumber(string.match(claim, '^(%d+):'))
end

-- The claim, or nil; a claim that is not ours to read (corrupt) is dropped, as if it ended.
local function read_claim()
  local claim = redis.call('GET', lead)
  if claim and not flight_of(claim) then
    redis.call('DEL', lead)
    return nil
  end
  return claim
end

local function outcome(n)
  return redis.call('GET', base .. 'out:' .. n)
end

local function follow(n)
  redis.call('INCR', base .. 'w:' .. n)
  redis.call('PEXPIRE', base .. 'w:' .. n, keep)
  return {1, n}
end

local function claim(n)
  redis.call('SET', lead, n .. ':' .. token, 'PX', lease)
  redis.call('PEXPIRE', counter, keep)
  return {0, n}
end

if op == 'join' then
  -- Follow the claimed flight (or take its outcome, if it has one), or claim a new one.
  local current = read_claim()
  if current then
    local n = flight_of(current)
    local out = outcome(n)
    if out then return {2, n, out} end
    return follow(n)
  end
  return claim(redis.call('INCR', counter))
end

if op == 'check' then
  -- A follower's check of the flight it follows (ARGV[5]): its outcome -> take it; another
  -- flight claimed -> follow that one (or take its outcome); no claim, and the latest flight
  -- has an outcome (it superseded ours) -> take it; no claim and no outcome (the leader died:
  -- its lease ended) -> claim the same flight number and lead it.
  local mine = tonumber(ARGV[5])
  local out = outcome(mine)
  if out then return {2, mine, out} end
  local current = read_claim()
  if current then
    local n = flight_of(current)
    if n == mine then return {1, mine} end
    out = outcome(n)
    if out then return {2, n, out} end
    return follow(n)
  end
  local latest = tonumber(redis.call('GET', counter))
  if not latest then  -- Redis lost the counter (emptied): start over past our number
    redis.call('SET', counter, mine + 1)
    return claim(mine + 1)
  end
  if latest ~= mine then
    out = outcome(latest)
    if out then return {2, latest, out} end
  end
  return claim(latest)  -- its leader is gone: take the flight over, same number
end

return redis.error_reply('flight.lua: no operation ' .. tostring(op))
