-- The fleet-priors lookup (farm.stores.redis_priors), appended to the "farm" library of publish.lua when it is
-- loaded: the same library, one FUNCTION LOAD.
--
-- farm_priors (read only): other fingerprints' decisions of one problem family, in one round trip.
-- KEYS: 1 the fingerprints hash (digest -> fingerprint text).
-- ARGV: 1 the problem index keys' prefix ('<prefix>:problems:'), 2 the decision hashes' prefix
--       ('<prefix>:decisions:'), 3 the family id across fingerprints, 4 a digest to leave out ('' for none),
--       5 how many records at most.
-- Returns digest, record JSON, digest, record JSON, ... in digest order: for each fingerprint (sorted) whose problem
-- index maps the family id to a field that still holds a record. The family id is a publication's alias
-- (farm_coordinator.publish), written in the publication's own transaction. The problem index and decision hashes
-- are named from the fingerprints hash, so they are not KEYS: a standalone server only (as the farm's Redis is).

local function priors(keys, args)
  local problems, decisions, family, exclude, limit = args[1], args[2], args[3], args[4], tonumber(args[5])
  local digests = redis.call('HKEYS', keys[1])
  table.sort(digests)
  local out = {}
  for _, digest in ipairs(digests) do
    if #out >= 2 * limit then break end
    if digest ~= exclude then
      local field = redis.call('HGET', problems .. digest, family)
      if field then
        local raw = redis.call('HGET', decisions .. digest, field)
        if raw then
          out[#out + 1] = digest
          out[#out + 1] = raw
        end
      end
    end
  end
  return out
end

redis.register_function{function_name = 'farm_priors', callback = priors, flags = {'no-writes'}}
