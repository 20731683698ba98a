#!lua name=farm
-- Publication of one decision, atomically: replace it under the farm's replacement rule, index the problem,
-- remember the fingerprint text and append an update event. Mirrors farm.stores.base.replaces.
--
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
  local reason = 'new'
  local old_raw = redis.call('HGET', keys[1], field)
  if old_raw then
    local problem_text, old = malformed(old_raw)
    if problem_text then
      reason = 'replaced malformed record (' .. problem_text .. ')'
    elseif old['verified'] ~= new['verified'] then
      if not new['verified'] then
        if keys[6] then redis.call('DEL', keys[6]) end
        return {0, 'kept: a verified record beats an unverified one'}
      end
      reason = 'replaced: verified beats unverified'
    elseif tonumber(new['created']) < old['created'] then
      if keys[6] then redis.call('DEL', keys[6]) end
      return {0, 'kept: the stored record is newer'}
    else
      reason = 'replaced: newer run'
    end
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

redis.register_function('farm_publish', publish)
