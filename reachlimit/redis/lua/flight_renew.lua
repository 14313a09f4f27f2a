-- Renew a claim. ARGV[5] the flight. Replies 1 if the claim was still ours (and is renewed).
if redis.call('GET', lead) == ARGV[5] .. ':' .. token then
  redis.call('PEXPIRE', lead, lease)
  redis.call('PEXPIRE', counter, keep)
  return 1
end
return 0
