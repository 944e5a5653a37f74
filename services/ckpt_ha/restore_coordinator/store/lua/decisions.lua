-- A round's decisions (DecisionStore.record_decisions) as one command, all or nothing: each
-- decision with its plan, the restart it counts and its pins, after settling the escalation
-- the plan ends (attention.lua's rule for a clear of 'escalated' only: a record of that status
-- and of the plan's time or older goes). Formats no key: KEYS[1] is the attention hash, KEYS[2]
-- the index of jobs by their latest restart (no expiry, trimmed to ARGV[1] behind), then per
-- decision its decision key, the job's restarts and pins, and with a plan the plan's key.
-- ARGV[1]: seconds each key written lives (0: no expiry: a replay notes it instead);
-- ARGV[2]: the restarts kept per job; ARGV[3]: JSON, per decision [job, unix time it settles
-- ('' none), decision JSON, plan JSON ('' none), restart member, its score, [pin field, pin
-- JSON, ...]].
local ttl, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local attention, restarted = KEYS[1], KEYS[2]
local k = 2
local function set(key, value)
  if ttl > 0 then
    redis.call('SET', key, value, 'EX', ttl)
  else
    redis.call('SET', key, value)
  end
end
for _, d in ipairs(cjson.decode(ARGV[3])) do
  local job, settles, decision, plan, member, score, pins = d[1], d[2], d[3], d[4], d[5], d[6], d[7]
  if settles ~= '' then
    local old = redis.call('HGET', attention, job)
    if old then
      local at, status = string.match(old, '^([^|]*)|([^|]*)')
      if tonumber(at) <= tonumber(settles) and status == 'escalated' then
        redis.call('HDEL', attention, job)
      end
    end
  end
  set(KEYS[k + 1], decision)
  local restarts, pinned = KEYS[k + 2], KEYS[k + 3]
  if plan ~= '' then
    set(KEYS[k + 4], plan)
    redis.call('ZADD', restarts, score, member)
    redis.call('ZREMRANGEBYRANK', restarts, 0, -keep - 1)
    if ttl > 0 then redis.call('EXPIRE', restarts, ttl) end
    redis.call('ZADD', restarted, 'GT', score, job)
    redis.call('ZREMRANGEBYSCORE', restarted, '-inf', tonumber(score) - ttl)
    k = k + 4
  else
    k = k + 3
  end
  if #pins > 0 then redis.call('HSET', pinned, unpack(pins)) end
end
return #KEYS
