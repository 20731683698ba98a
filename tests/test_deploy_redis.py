"""The deployment's Redis servers, proven on real redis-server processes started by docker/redis-entrypoint.sh
itself (the compose services' entrypoint): its refusals, the ACL users of both servers, no eviction, and a real
`farm worker` and coordinator running through those ACL users.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

import pytest
import redis
from deploy_helpers import (
    DOCKER,
    ENTRYPOINT,
    FINGERPRINT,
    Credentials,
    acl_redis,
    assert_refused,
    decision,
    entrypoint_env,
    healthcheck,
)
from farm_helpers import WORKER_ENV, write_catalog
from servers import farm_env, start_worker, wait_worker_ready

from farm.stores.redis import RedisDecisions
from farm_fleet.settings import Settings

# ------------------------------------------------------------------------------------- the Redis entrypoint


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"REDIS_WRITER_USER": "farm"}, "REDIS_WRITER_PASSWORD is empty"),
        ({"REDIS_WRITER_USER": "farm", "REDIS_WRITER_PASSWORD": "short"}, "shorter than 16"),
        ({"REDIS_WRITER_USER": "farm", "REDIS_WRITER_PASSWORD": "has@and:in-a-url-1234"}, "REDIS_WRITER_PASSWORD may"),
        ({"REDIS_WRITER_USER": "default", "REDIS_WRITER_PASSWORD": "a" * 32}, "must not be 'default'"),
        ({"REDIS_WRITER_USER": "farm", "REDIS_WRITER_PASSWORD": "a" * 32, "REDIS_READER_USER": "reader"},
         "REDIS_READER_PASSWORD is empty"),
    ],
)
def test_the_redis_entrypoint_refuses_missing_weak_or_url_unsafe_credentials(tmp_path, values, named):
    acl = tmp_path / "acl" / "users.acl"
    done = subprocess.run(["sh", str(ENTRYPOINT), str(DOCKER / "redis" / "decisions.conf")], capture_output=True,
                          text=True, timeout=30, env=entrypoint_env(REDIS_ACL_FILE=str(acl), **values))
    assert done.returncode == 2
    assert named in done.stderr
    assert not acl.exists()


@pytest.mark.servers
def test_the_decisions_redis_gives_the_writer_publication_and_the_reader_decisions_only(tmp_path):
    settings = Settings(prefix="farm")
    with acl_redis("decisions.conf", tmp_path, reader=True) as server:
        record = decision()
        with server.client() as writer:
            store = RedisDecisions(client=writer, settings=settings)
            assert store.publish(record, FINGERPRINT, "p1") == (True, "new")  # FUNCTION LOAD + FCALL farm_publish
            writer.set("farm:result:r1:p1:g0", "{}")
            # The writer is no administrator: it cannot reconfigure, wipe or enumerate the server.
            assert_refused(writer.config_set, "appendonly", "no")
            assert_refused(writer.flushall)
            assert_refused(writer.keys, "*")
            assert_refused(writer.acl_list)

        reader = RedisDecisions(server.url(server.reader), settings=settings)
        try:
            assert reader.get(record.cache_key) == record
            digest = reader._digest(record.cache_key)
            assert reader.fingerprints() == {digest: FINGERPRINT}
            assert list(reader.records(digest)) == [record]
            client = reader.client
            decisions_key = settings.decisions_key(digest)
            assert_refused(client.hset, decisions_key, "x", "y")
            assert_refused(client.hdel, decisions_key, "x")
            assert_refused(client.delete, decisions_key)
            assert_refused(client.fcall, "farm_publish", 0)
            assert_refused(client.get, "farm:result:r1:p1:g0")
            assert_refused(client.hget, settings.problems_key(digest), "p1")
            assert_refused(client.set, "farm:decisions:new", "x")
            assert_refused(client.publish, "farm:channel", "x")
            assert client.ping()
        finally:
            reader.client.close()

        # Nobody gets in as the default user, with or without a password.
        with server.client(None) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        with server.client(Credentials("default", "anything")) as default, pytest.raises(redis.AuthenticationError):
            default.ping()
        with server.client(Credentials(server.writer.user, "wrong" * 4)) as wrong, \
                pytest.raises(redis.AuthenticationError):
            wrong.ping()

        # The ACL file holds password hashes only, and the append-only file is on.
        acl = server.acl_file.read_text()
        assert server.writer.password not in acl and server.reader.password not in acl
        assert acl.count(" #") == 2
        assert list((tmp_path / "appendonlydir").glob("*.aof"))


@pytest.mark.servers
def test_the_broker_redis_knows_only_the_farm_user(tmp_path):
    with acl_redis("broker.conf", tmp_path, reader=False) as server:
        with server.client() as writer:
            writer.lpush("farm.default", "message")
            assert writer.brpop(["farm.default"], timeout=1) == ("farm.default", "message")
        with server.client(Credentials("reader", "x" * 32)) as reader, pytest.raises(redis.AuthenticationError):
            reader.ping()
        with server.client(None) as anonymous, pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        assert list((tmp_path / "appendonlydir").glob("*.aof"))


@pytest.mark.servers
@pytest.mark.parametrize("conf", ["broker.conf", "decisions.conf"])
def test_a_full_redis_refuses_writes_instead_of_evicting(tmp_path, conf):
    # Only maxmemory is lowered so that the limit is reached in a moment; the policy is the file's.
    with acl_redis(conf, tmp_path, reader=False, extra=("--maxmemory", "4mb")) as server, server.client() as c:
        value = "x" * 65536
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for i in range(1000):
                c.set(f"farm:filler:{i}", value)
        assert c.exists("farm:filler:0") == 1


# ------------------------------------------------------------- the whole farm through the ACL users

SCALE = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 300, dtype = "float64" }]
"""


@pytest.mark.servers
def test_a_worker_and_the_coordinator_run_through_the_acl_users_and_an_inference_client_reads_with_the_reader(
        tmp_path):
    prefix = f"t{secrets.token_hex(4)}"
    with acl_redis("broker.conf", tmp_path / "broker", reader=False) as broker, \
            acl_redis("decisions.conf", tmp_path / "decisions", reader=True, prefix=prefix) as decisions:
        env = farm_env({**WORKER_ENV, "FARM_PREFIX": prefix})
        worker = start_worker("cpu:0", broker.url(), decisions.url(), tmp_path / "worker", env)
        check_env = {**env, "FARM_REDIS_URL": decisions.url()}
        try:
            with decisions.client() as writer:
                wait_worker_ready(worker, writer, prefix)
            ok = healthcheck(check_env)
            assert ok.returncode == 0, ok.stdout + ok.stderr
            assert "healthy" in ok.stdout

            # The coordinator's command in the compose file, with the URLs (writer users) from the environment.
            catalog = write_catalog(tmp_path / "c.toml", SCALE)
            run = subprocess.run(
                [sys.executable, "-m", "farm_cli", "tune", str(catalog), "--kernels", "farm_testops", "--json"],
                capture_output=True, text=True, timeout=120, cwd=tmp_path,
                env={**env, "FARM_BROKER_URL": broker.url(), "FARM_REDIS_URL": decisions.url()},
            )
            assert run.returncode == 0, run.stdout + run.stderr
            (published,) = json.loads(run.stdout)["decisions"]
            assert published["error"] is None and published["record"]["name"] == "vectorized"
        finally:
            worker.stop()
        # Stopped: its presence record is withdrawn, and the health check says so.
        down = healthcheck(check_env)
        assert down.returncode == 1 and "no presence record" in down.stderr

        # An inference machine, with the read-only user, hits the published decision.
        reader = RedisDecisions(decisions.url(decisions.reader), settings=Settings(prefix=prefix))
        try:
            found = reader.get(published["record"]["cache_key"])
            assert found is not None and found.to_dict() == published["record"]
        finally:
            reader.client.close()
