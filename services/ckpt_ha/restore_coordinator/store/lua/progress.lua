-- The progress of a batch of reports (ProgressStore._write_progress) as one command, one job
-- after another (a pipeline of six commands per report cost the client more than the
-- server). Formats no key: KEYS are, per job, its trajectory hash, its step index, then the
-- last-point key of each attempt it reports. ARGV[1]: seconds each key written lives (0: no
-- expiry: a replay notes it instead); ARGV[2]: the trajectory's bound; ARGV[3]: JSON, per job
-- [[last point of each attempt, in the order of its KEYS], [step, point, step, point, ...]].
-- The oldest steps past the bound go in the same call. Chunks, not one unpack of a list:
-- no limit on the batch's size.
local ttl, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local CHUNK = 1000
local k = 0
for _, job in ipairs(cjson.decode(ARGV[3])) do
  local traj, idx, lasts, steps = KEYS[k + 1], KEYS[k + 2], job[1], job[2]
  for i, doc in ipairs(lasts) do
    if ttl > 0 then
      redis.call('SET', KEYS[k + 2 + i], doc, 'EX', ttl)
    else
      redis.call('SET', KEYS[k + 2 + i], doc)
    end
  end
  k = k + 2 + #lasts
  if #steps > 0 then
    for i = 1, #steps, CHUNK do
      local j = math.min(i + CHUNK - 1, #steps)
      redis.call('HSET', traj, unpack(steps, i, j))
      local scored = {}
      for s = i, j, 2 do
        scored[#scored + 1] = steps[s]
        scored[#scored + 1] = steps[s]
      end
      redis.call('ZADD', idx, unpack(scored))
    end
    if ttl > 0 then
      redis.call('EXPIRE', traj, ttl)
      redis.call('EXPIRE', idx, ttl)
    end
    local over = redis.call('ZCARD', idx) - limit
    if over > 0 then
      local dropped = redis.call('ZPOPMIN', idx, over)
      local steps_dropped = {}
      for i = 1, #dropped, 2 do steps_dropped[#steps_dropped + 1] = dropped[i] end
      for i = 1, #steps_dropped, CHUNK do
        redis.call('HDEL', traj, unpack(steps_dropped, i, math.min(i + CHUNK - 1, #steps_dropped)))
      end
    end
  end
end
return 0
