-- A round's decisions marked published (DecisionStore.mark_published_many) as one command:
-- KEYS[i] set to ARGV[i + 1], living ARGV[1] seconds.
for i, k in ipairs(KEYS) do
  redis.call('SET', k, ARGV[i + 1], 'EX', ARGV[1])
end
return #KEYS
