-- A round of failures (DecisionStore.failure_contexts) as one command: each failure recorded
-- (one per attempt, the oldest past the history bound dropped, an infrastructure-side one
-- also a storage error), then what deciding it reads, in the order the failures came (a
-- pipeline of ten commands per failure cost the client more than the server). Formats no key:
-- KEYS are, per failure, its job's failures hash, storage-error set, the attempt's start, its
-- last point, the job's restarts and exclusions, the attempt's decision. ARGV[1]: seconds each
-- key written lives (0: no expiry: a replay notes it instead); ARGV[2]: JSON, per failure
-- [attempt, failure JSON, attempt dropped, storage-error member ('' none), its score, [the
-- attempts of the history window]]. Returns, per failure: start, last point, the window's
-- failures, restarts and storage errors (member, score, ...), exclusions, decision.
local ttl = tonumber(ARGV[1])
local out = {}
for n, f in ipairs(cjson.decode(ARGV[2])) do
  local k = (n - 1) * 7
  local failures, storage = KEYS[k + 1], KEYS[k + 2]
  redis.call('HSET', failures, f[1], f[2])
  redis.call('HDEL', failures, f[3])
  if ttl > 0 then redis.call('EXPIRE', failures, ttl) end
  if f[4] ~= '' then
    redis.call('ZADD', storage, f[5], f[4])
    if ttl > 0 then redis.call('EXPIRE', storage, ttl) end
  end
  out[n] = {
    redis.call('GET', KEYS[k + 3]),
    redis.call('GET', KEYS[k + 4]),
    redis.call('HMGET', failures, unpack(f[6])),
    redis.call('ZRANGE', KEYS[k + 5], 0, -1, 'WITHSCORES'),
    redis.call('ZRANGE', storage, 0, -1, 'WITHSCORES'),
    redis.call('SMEMBERS', KEYS[k + 6]),
    redis.call('GET', KEYS[k + 7]),
  }
end
return out
