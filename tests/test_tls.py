"""TLS end to end: certificates from tools/certs.py, a real redis-server with only its TLS port given to the farm
(client certificates required), a worker, the coordinator (`farm tune`), `farm status` and the runtime's Redis
tier all connecting with verification, and a wrong CA refused in one line naming the server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from farm_helpers import WORKER_ENV, write_catalog
from servers import ROOT, farm_env, free_port, redis_server, start_worker, wait_for

from farm_fleet.settings import Settings

pytestmark = pytest.mark.servers

SCALE = """
[[problems]]
operation = "farmtest_scale"
workloads = [{ n = 37, dtype = "float64" }]
"""


def certificates(directory: Path) -> Path:
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "certs.py"), str(directory)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return directory


def tls_url(port: int, db: int, certs: Path, ca: Path | None = None) -> str:
    return (f"rediss://127.0.0.1:{port}/{db}?ssl_cert_reqs=required&ssl_ca_certs={ca or certs / 'ca.pem'}"
            f"&ssl_certfile={certs / 'client.pem'}&ssl_keyfile={certs / 'client.key'}")


@pytest.fixture
def tls_redis(tmp_path):
    certs = certificates(tmp_path / "certs")
    port = free_port()
    extra = ("--tls-port", str(port), "--tls-cert-file", str(certs / "server.pem"), "--tls-key-file",
             str(certs / "server.key"), "--tls-ca-cert-file", str(certs / "ca.pem"), "--tls-auth-clients", "yes")
    with redis_server(tmp_path / "redis", extra) as server:  # its plain port is only the fixture's readiness check
        yield server, port, certs


def farm(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_worker_coordinator_status_and_runtime_work_over_verified_tls(tls_redis, tmp_path):
    server, port, certs = tls_redis
    broker, results = tls_url(port, 0, certs), tls_url(port, 1, certs)
    env = farm_env({**WORKER_ENV, "FARM_PREFIX": "tls"})
    worker = start_worker("cpu:0", broker, results, tmp_path / "w", env)
    try:
        plain = server.client(1)
        wait_for(lambda: worker.process.poll() is None and any(plain.scan_iter(match="tls:worker:*"))
                 and "ready" in worker.output(), 120, f"the TLS worker to be ready:\n{worker.output()[-3000:]}")
        catalog = write_catalog(tmp_path / "c.toml", SCALE)
        done = farm("tune", str(catalog), "--broker", broker, "--redis", results, "--kernels", "farm_testops",
                    "--json", cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        status = farm("status", "--redis", results, "--broker", broker, "--json", cwd=tmp_path, env=env)
        assert status.returncode == 0, status.stderr
        assert "cpu:0" in status.stdout
    finally:
        worker.stop()
    # The decision is in Redis (read over TLS by the runtime's fleet tier, and by the farm's plain test client).
    from farm.stores.redis import RedisDecisions

    settings = Settings.from_env(env)
    assert plain.hlen(f"{settings.prefix}:decisions:{next(iter(RedisDecisions(client=plain, settings=settings).fingerprints()))}") == 1
    runtime = RedisDecisions(results, settings=settings)
    try:
        assert runtime.fingerprints()
    finally:
        runtime.client.close()
    plain.close()


def test_a_wrong_ca_is_a_one_line_error_naming_the_server(tls_redis, tmp_path):
    _, port, certs = tls_redis
    other = certificates(tmp_path / "other")
    wrong = tls_url(port, 1, certs, other / "ca.pem")
    env = farm_env({"FARM_PREFIX": "tls"})
    for args in (["status", "--redis", wrong], ["archive", "export", "--redis", wrong, "--out", "out"]):
        done = farm(*args, cwd=tmp_path, env=env)
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert f"127.0.0.1:{port}" in done.stderr and "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr
    worker = start_worker("cpu:0", tls_url(port, 0, certs, other / "ca.pem"), wrong, tmp_path / "w", env)
    try:
        assert worker.process.wait(120) == 2
    finally:
        worker.stop()
    lines = [line for line in worker.output().splitlines() if line.strip()]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "CERTIFICATE_VERIFY_FAILED" in lines[0], lines


def test_the_compose_tls_profile_serves_redis_on_tls_only_and_every_client_verifies_the_server():
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!reset", lambda loader, node: None)
    services = yaml.load((ROOT / "compose.tls.yaml").read_text(), Loader=Loader)["services"]
    for name in ("redis-broker", "redis-decisions"):
        command = services[name]["command"]
        assert command[command.index("--port") + 1] == "0" and command[command.index("--tls-port") + 1] == "6379"
        assert "/certs/ca.pem" in " ".join(services[name]["healthcheck"]["test"])
    urls = {f"{name}.{var}": url for name, service in services.items()
            for var, url in (service.get("environment") or {}).items() if var.endswith("_URL")}
    assert {key.split(".")[0] for key in urls} == {"worker-gpu0", "worker-gpu1", "flower", "coordinator"}
    for key, url in urls.items():
        assert url.startswith("rediss://") and url.endswith("?ssl_cert_reqs=required&ssl_ca_certs=/certs/ca.pem"), key


def test_a_worker_and_the_coordinator_use_an_amqps_broker_node_with_verification_and_a_wrong_ca_names_it(
        tls_redis, tmp_path):
    from rabbitmq import rabbitmq_node

    _, port, certs = tls_redis
    results = tls_url(port, 1, certs)
    env = farm_env({**WORKER_ENV, "FARM_PREFIX": "tlsq"})
    other = certificates(tmp_path / "other")
    with rabbitmq_node(tmp_path / "rabbitmq", certs) as rabbit, rabbit.vhost(certs / "ca.pem") as broker:
        wrong_ca = broker.replace(str(certs / "ca.pem"), str(other / "ca.pem"))  # the same vhost, another CA
        worker = start_worker("cpu:0", wrong_ca, results, tmp_path / "bad", env)
        try:
            assert worker.process.wait(120) == 2
        finally:
            worker.stop()
        lines = [line for line in worker.output().splitlines() if line.strip()]
        assert len(lines) == 1 and f"cannot reach the broker at 127.0.0.1:{rabbit.port}" in lines[0], lines
        assert "CERTIFICATE_VERIFY_FAILED" in lines[0]

        worker = start_worker("cpu:0", broker, results, tmp_path / "w", env)
        try:
            plain = tls_redis[0].client(1)
            wait_for(lambda: worker.process.poll() is None and any(plain.scan_iter(match="tlsq:worker:*"))
                     and "ready" in worker.output(), 120, f"the worker to be ready:\n{worker.output()[-3000:]}")
            plain.close()
            done = farm("tune", str(write_catalog(tmp_path / "c.toml", SCALE)), "--broker", broker, "--redis", results,
                        "--kernels", "farm_testops", cwd=tmp_path, env=env)
            assert done.returncode == 0, done.stderr[-3000:]
        finally:
            worker.stop()


def test_the_amqps_query_becomes_py_amqp_tls_options_and_leaves_the_url():
    import ssl

    from farm_fleet.celeryconf import amqp_tls, celery_config

    url, tls = amqp_tls("amqps://u:p@h:5671/farm?ssl_cert_reqs=required&ssl_ca_certs=/c/ca.pem&heartbeat=30")
    assert (url, tls) == ("amqps://u:p@h:5671/farm?heartbeat=30", {"cert_reqs": ssl.CERT_REQUIRED,
                                                                    "ca_certs": "/c/ca.pem"})
    assert amqp_tls("amqp://u:p@h:5672/farm") == ("amqp://u:p@h:5672/farm", {})
    config = celery_config(Settings(broker_url="amqps://u:p@h:5671/farm?ssl_cert_reqs=required&ssl_ca_certs=/c/ca.pem"))
    assert config["broker_url"] == "amqps://u:p@h:5671/farm" and config["broker_use_ssl"]["ca_certs"] == "/c/ca.pem"
    conf = (ROOT / "docker" / "rabbitmq" / "tls.conf").read_text()
    assert "listeners.tcp = none" in conf and "listeners.ssl.default = 5671" in conf
