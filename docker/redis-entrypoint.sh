#!/bin/sh
# Start redis-server with ACL users written from the environment, then exec it (the compose file's Redis services
# run this; tests/test_deploy.py runs it too, against the same configuration files).
#
#   redis-entrypoint.sh CONFIG_FILE [redis-server options...]
#
#   REDIS_WRITER_USER, REDIS_WRITER_PASSWORD  required: the farm's user (coordinator, workers, Flower): every data
#                                             command, no administration (CONFIG, ACL, FLUSHALL, KEYS, SHUTDOWN...)
#   REDIS_READER_USER, REDIS_READER_PASSWORD  optional, both or neither: a read-only user for runtime clients, who
#                                             may only HGET/HMGET/HGETALL/HSCAN the decisions and fingerprints
#                                             and read the nearest-decision index (ZRANGEBYSCORE,
#                                             ZREVRANGEBYSCORE, FCALL_RO of the read-only functions; docs/nearest.md)
#   REDIS_REPORTER_USER, REDIS_REPORTER_PASSWORD  optional, both or neither: a write-only user for applications'
#                                             fleet feedback, who may only XADD to the <prefix>:feedback stream
#   FARM_PREFIX                               the farm's key prefix (default farm): the reader's key patterns
#   REDIS_ACL_FILE                            where the ACL file is written (default /tmp/farm-redis/users.acl)
#
# The default user is disabled: every client authenticates. Passwords never reach the ACL file in clear (it holds
# their SHA-256), and they must be at least 16 characters from [A-Za-z0-9._~-], because they go into redis:// URLs
# unescaped (generate them with `openssl rand -hex 32`).
set -eu

die() {
    echo "redis-entrypoint: $*" >&2
    exit 2
}

[ $# -ge 1 ] || die "usage: redis-entrypoint.sh CONFIG_FILE [redis-server options...]"
config=$1
shift
[ -r "$config" ] || die "cannot read the configuration file $config"

check_user() { # NAME VALUE
    [ -n "$2" ] || die "$1 is empty: set it in the env file (.env)"
    case $2 in
    default) die "$1 must not be 'default' (the default user is disabled)" ;;
    *[!A-Za-z0-9._-]*) die "$1 may contain only letters, digits and . _ -" ;;
    esac
}

check_password() { # NAME VALUE
    [ -n "$2" ] || die "$1 is empty: set it in the env file (.env), e.g. to the output of 'openssl rand -hex 32'"
    case $2 in
    *[!A-Za-z0-9._~-]*) die "$1 may contain only letters, digits and . _ ~ - (it goes into redis:// URLs)" ;;
    esac
    [ "${#2}" -ge 16 ] || die "$1 is shorter than 16 characters"
}

sha256() {
    printf '%s' "$1" | sha256sum | cut -d ' ' -f 1
}

writer_user=${REDIS_WRITER_USER:-}
writer_password=${REDIS_WRITER_PASSWORD:-}
reader_user=${REDIS_READER_USER:-}
reader_password=${REDIS_READER_PASSWORD:-}
reporter_user=${REDIS_REPORTER_USER:-}
reporter_password=${REDIS_REPORTER_PASSWORD:-}
prefix=${FARM_PREFIX:-farm}
acl_file=${REDIS_ACL_FILE:-/tmp/farm-redis/users.acl}

check_user REDIS_WRITER_USER "$writer_user"
check_password REDIS_WRITER_PASSWORD "$writer_password"
if [ -n "$reader_user" ] || [ -n "$reader_password" ]; then
    check_user REDIS_READER_USER "$reader_user"
    check_password REDIS_READER_PASSWORD "$reader_password"
    [ "$reader_user" != "$writer_user" ] || die "REDIS_READER_USER must differ from REDIS_WRITER_USER"
fi
if [ -n "$reporter_user" ] || [ -n "$reporter_password" ]; then
    check_user REDIS_REPORTER_USER "$reporter_user"
    check_password REDIS_REPORTER_PASSWORD "$reporter_password"
    [ "$reporter_user" != "$writer_user" ] || die "REDIS_REPORTER_USER must differ from REDIS_WRITER_USER"
    [ "$reporter_user" != "$reader_user" ] || die "REDIS_REPORTER_USER must differ from REDIS_READER_USER"
fi
case $prefix in
*[!A-Za-z0-9._-]*) die "FARM_PREFIX may contain only letters, digits and . _ -" ;;
esac

umask 077
mkdir -p "$(dirname "$acl_file")"
tmp="$acl_file.tmp.$$"
{
    # Nobody can log in as (or fall back to) the default user: it is off and has no password. Its permissions stay
    # +@all on purpose: Redis replays the append-only file as the default user, and EXEC re-checks that user's ACL
    # (redis/redis#14541, fixed by #14545 in later releases), so with -@all every MULTI/EXEC in the file -- each
    # farm_publish of a decision -- would be silently dropped at the next start (tests/test_containers.py found it).
    echo "user default off resetpass resetkeys ~* resetchannels &* +@all"
    # Everything the farm, kombu and Celery use (hashes, strings, lists, sets, sorted sets, streams, pub/sub,
    # MULTI/EXEC, EVAL/FCALL, FUNCTION LOAD, SCAN, BLPOP/BRPOP...), nothing that reconfigures or wipes the server.
    echo "user $writer_user on resetpass #$(sha256 "$writer_password") resetkeys ~* resetchannels &* +@all -@admin -@dangerous"
    if [ -n "$reader_user" ]; then
        echo "user $reader_user on resetpass #$(sha256 "$reader_password") resetkeys %R~$prefix:decisions:* %R~$prefix:fingerprints %R~$prefix:nearest:* resetchannels -@all +hget +hmget +hgetall +hscan +zrangebyscore +zrevrangebyscore +fcall_ro +ping +select +client|setname +client|getname"
    fi
    if [ -n "$reporter_user" ]; then
        # Fleet feedback (docs/farm.md): append reports to one stream, read nothing, touch no other key.
        echo "user $reporter_user on resetpass #$(sha256 "$reporter_password") resetkeys %W~$prefix:feedback resetchannels -@all +xadd +ping +select +client|setname +client|getname"
    fi
} >"$tmp"
mv "$tmp" "$acl_file"

exec redis-server "$config" --aclfile "$acl_file" "$@"
