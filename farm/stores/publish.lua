#!lua name=farm
-- Publication of one decision, atomically: replace it under the farm's replacement rule, index the problem,
-- remember the fingerprint text and append an update event. Mirrors farm.stores.base.replaces.
--
-- KEYS: 1 decisions hash of the fingerprint, 2 problems hash of the fingerprint, 3 fingerprints hash, 4 events stream,
--       5 trials hash of the fingerprint
-- ARGV: 1 field (sha256 of the cache key), 2 record JSON, 3 problem id ('' for none), 4 fingerprint digest,
--       5 fingerprint text, 6 events stream max length, 7 trials JSON ('' for none)
local function publish(keys, args)
  local field, record, problem, digest, text, maxlen = args[1], args[2], args[3], args[4], args[5], args[6]
  local trials = args[7] or ''
  local new = cjson.decode(record)
  local reason = 'new'
  local old_raw = redis.call('HGET', keys[1], field)
  if old_raw then
    local ok, old = pcall(cjson.decode, old_raw)
    if not ok then
      reason = 'replaced unreadable record'
    elseif old['verified'] ~= new['verified'] then
      if not new['verified'] then
        return {0, 'kept: a verified record beats an unverified one'}
      end
      reason = 'replaced: verified beats unverified'
    elseif tonumber(new['created']) < tonumber(old['created']) then
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
  local meta = new['meta'] or {}
  redis.call('XADD', keys[4], 'MAXLEN', '~', maxlen, '*',
    'fingerprint', digest, 'field', field, 'winner', tostring(new['name']),
    'verified', tostring(new['verified']), 'run', tostring(meta['run'] or ''), 'reason', reason)
  return {1, reason}
end

redis.register_function('farm_publish', publish)
