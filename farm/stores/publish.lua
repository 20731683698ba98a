#!lua name=farm
-- Publication of decisions under the farm's replacement rule (mirrors farm.stores.base.replaces): a verified record
-- beats an unverified one, otherwise the newer one (by `created`) wins, a tie going to the newcomer.
--
-- farm_publish: one decision, atomically: replace it under the rule, index the problem, remember the fingerprint
-- text and append an update event.
-- KEYS: 1 decisions hash of the fingerprint, 2 problems hash of the fingerprint, 3 fingerprints hash, 4 events stream,
--       5 trials hash of the fingerprint, 6 (optional) fence key
-- ARGV: 1 field (sha256 of the cache key), 2 record JSON, 3 problem id ('' for none), 4 fingerprint digest,
--       5 fingerprint text, 6 events stream max length, 7 trials JSON ('' for none),
--       8 (optional) the value the fence key must hold
--
-- Fencing: with KEYS[6], the call is refused unless the fence key (a coordinator's lease) holds exactly ARGV[8];
-- a publication consumes the lease, so a stale coordinator, or a retried call, can never publish twice.
-- The stored record compared with is validated first: a malformed one (not an object, `verified` not a
-- boolean, `created` not a finite number up to a day ahead of the server's clock) is replaced, and the event
-- says so.
--
-- Batches (an archive import: farm.stores.redis_batch) use the same rule in two steps inside one WATCH: farm_judge
-- (read only) says which decisions win, then one MULTI/EXEC writes the winners' hashes with plain HSETs and their
-- events with farm_events.
-- farm_judge  KEYS: 1 decisions hash. ARGV: per decision 3 values: field, verified ('1' or '0'), created.
--             Returns the reason of each decision ('new', 'replaced...', 'kept: ...'), joined by newlines.
-- farm_events KEYS: 1 events stream. ARGV: 1 fingerprint digest, 2 stream max length, then per event 5 values:
--             field, winner, verified ('true' or 'false'), run, reason. Returns the number of events added.

local function malformed(old_raw)
  local ok, old = pcall(cjson.decode, old_raw)
  if not ok then return 'unreadable JSON', nil end
  if type(old) ~= 'table' then return 'not an object', nil end
  if type(old['verified']) ~= 'boolean' then return 'verified is not a boolean', nil end
  local created = old['created']
  if type(created) ~= 'number' or created ~= created or created == math.huge or created == -math.huge then
    return 'created is not a finite number', nil
  end
  local now = tonumber(redis.call('TIME')[1])
  if created > now + 86400 then return 'created is in the future', nil end
  return nil, old
end

-- Whether a new record (verified, created) replaces the stored one (old_raw, nil for none), and why.
local function judge(old_raw, verified, created)
  if not old_raw then return true, 'new' end
  local problem_text, old = malformed(old_raw)
  if problem_text then
    return true, 'replaced malformed record (' .. problem_text .. ')'
  elseif old['verified'] ~= verified then
    if not verified then return false, 'kept: a verified record beats an unverified one' end
    return true, 'replaced: verified beats unverified'
  elseif tonumber(created) < old['created'] then
    return false, 'kept: the stored record is newer'
  end
  return true, 'replaced: newer run'
end

local function publish(keys, args)
  local field, record, problem, digest, text, maxlen = args[1], args[2], args[3], args[4], args[5], args[6]
  local trials = args[7] or ''
  if keys[6] then
    local holder = redis.call('GET', keys[6])
    if holder ~= args[8] then
      return {0, 'refused: stale lease (held by ' .. tostring(holder or 'nobody') .. ')'}
    end
  end
  local new = cjson.decode(record)
  local wins, reason = judge(redis.call('HGET', keys[1], field), new['verified'], new['created'])
  if not wins then
    if keys[6] then redis.call('DEL', keys[6]) end
    return {0, reason}
  end
  redis.call('HSET', keys[1], field, record)
  if trials ~= '' then
    redis.call('HSET', keys[5], field, trials)
  else
    redis.call('HDEL', keys[5], field)
  end
  if problem ~= '' then
    redis.call('HSET', keys[2], problem, field)
  end
  redis.call('HSET', keys[3], digest, text)
  if keys[6] then redis.call('DEL', keys[6]) end
  local meta = new['meta'] or {}
  redis.call('XADD', keys[4], 'MAXLEN', '~', maxlen, '*',
    'fingerprint', digest, 'field', field, 'winner', tostring(new['name']),
    'verified', tostring(new['verified']), 'run', tostring(meta['run'] or ''), 'reason', reason)
  return {1, reason}
end

local function judge_many(keys, args)
  local fields = {}
  for i = 1, #args, 3 do fields[#fields + 1] = args[i] end
  if #fields == 0 then return '' end
  local olds = redis.call('HMGET', keys[1], unpack(fields))
  local reasons = {}
  for j = 1, #fields do
    local i = 3 * j - 2
    local _, reason = judge(olds[j] or nil, args[i + 1] == '1', args[i + 2])
    reasons[j] = reason
  end
  return table.concat(reasons, '\n')
end

local function events(keys, args)
  local digest, maxlen = args[1], args[2]
  local n = 0
  for i = 3, #args, 5 do
    redis.call('XADD', keys[1], 'MAXLEN', '~', maxlen, '*', 'fingerprint', digest, 'field', args[i],
      'winner', args[i + 1], 'verified', args[i + 2], 'run', args[i + 3], 'reason', args[i + 4])
    n = n + 1
  end
  return n
end

redis.register_function('farm_publish', publish)
redis.register_function{function_name = 'farm_judge', callback = judge_many, flags = {'no-writes'}}
redis.register_function('farm_events', events)
