"""Signed archives: `farm keys init`, signed exports, imports and runtimes that refuse unsigned, modified or
untrusted archives, key rotation and revocation, and --allow-unsigned (docs/archives.md, "Signatures")."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from servers import farm_env

import farm
import farm_archives
from farm.environment import fingerprint_digest
from farm.identity import Candidate, Problem, Scope, cache_key, fields, key_environment, split_fields
from farm.stores import archive as arc
from farm.stores.base import DecisionRecord
from farm_archives import operations as ops

FP = fields(["host-numpy", "cpu", "model A", "driver 1", "cpython", "build 1", "", "opts"])
NAMES = ("ref", "fast", "other")
POLICY = farm.StackPolicy()


def key_for(workload: str) -> str:
    problem = Problem(Scope.OPERATOR, "scale", FP, workload, persistent=True)
    return cache_key(problem, [Candidate(n) for n in NAMES], 0, POLICY)


def entry(workload: str) -> arc.ArchiveEntry:
    key = key_for(workload)
    meta = {"run": "run-1", "problem_id": f"pid-{workload}", "operation": split_fields(key)[2],
            "fingerprint": fingerprint_digest(key_environment(key)), "reference": "ref"}
    record = DecisionRecord(key, 1, 0, "fast", True, 0.5, time.time() - 60, meta)
    trial = {"run": "run-1", "problem_id": f"pid-{workload}", "group": "0", "role": "candidate", "candidate": "fast",
             "candidate_index": 1, "verdict": "passed", "note": "", "pair": 0, "reference_seconds": 0.002,
             "candidate_seconds": 0.001, "max_abs_error": 0.0, "max_rel_error": None, "host": "h", "device": "cpu:0",
             "worker": "w", "attempt": 1}
    return arc.ArchiveEntry(record, f"pid-{workload}", (trial,))


@pytest.fixture(autouse=True)
def no_trust_from_the_environment(monkeypatch):
    for name in ("FARM_TRUSTED_KEYS", "FARM_ALLOW_UNSIGNED", "FARM_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def key(tmp_path) -> farm_archives.SigningKey:
    private, _, _ = farm_archives.generate_keys(tmp_path / "keys", "site-a")
    return farm_archives.load_signing_key(private)


def write(parent: Path, signer: farm_archives.SigningKey | None, workloads: tuple[str, ...] = ("n=1", "n=2")) -> Path:
    return farm_archives.write_archive(parent, FP, [entry(w) for w in workloads], signer=signer).path


def trust(*keys: farm_archives.SigningKey, allow_unsigned: bool = False) -> arc.Trust:
    return arc.Trust(tuple(k.public for k in keys), allow_unsigned)


def farm_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "farm_cli", *args], capture_output=True, text=True,
                          env=farm_env(env), cwd=cwd, timeout=120)


def runtime_source(store: arc.ArchiveStore) -> farm.DecisionSource:
    from fakes import FakeRunner

    tuner = farm.StackTuner(farm.StackPolicy(mode=farm.Mode.CACHE_ONLY), fleet=[store])
    problem = Problem(Scope.OPERATOR, "scale", FP, "n=1", persistent=True)
    return tuner.select(problem, [Candidate(n) for n in NAMES], 0, FakeRunner()).source


# -- keys ---------------------------------------------------------------------------------------------------------


def test_keys_init_writes_an_owner_only_private_key_and_never_overwrites_one(tmp_path):
    done = farm_cli("keys", "init", "--dir", "keys", "--name", "site-a", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    private, public = tmp_path / "keys" / "site-a.key", tmp_path / "keys" / "site-a.pub"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700
    (line,) = arc.read_trusted_keys(public)
    assert line.key_id == farm_archives.load_signing_key(private).key_id and line.key_id in done.stdout
    before = private.read_bytes()
    again = farm_cli("keys", "init", "--dir", "keys", "--name", "site-a", cwd=tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "never overwritten" in again.stderr
    assert private.read_bytes() == before
    shown = farm_cli("keys", "show", str(private), cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.split()[0] == line.key_id


def test_keys_init_in_a_git_working_tree_keeps_the_private_key_out_of_commits_and_says_where_it_is(tmp_path):
    tree = tmp_path / "repo"
    (tree / ".git").mkdir(parents=True)  # a working tree (keys init only looks for it; no git command runs)
    done = farm_cli("keys", "init", cwd=tree)
    assert done.returncode == 0, done.stderr
    private = tree / "farm-keys" / "farm.key"
    assert f"private key {private.resolve()} (mode 0600" in done.stdout
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    ignore = tree / "farm-keys" / ".gitignore"
    assert "*.key" in ignore.read_text().splitlines() and "farm-keys/.gitignore keeps its private keys" in done.stdout
    farm_cli("keys", "init", "--name", "second", cwd=tree)
    assert ignore.read_text().splitlines().count("*.key") == 1
    outside = farm_cli("keys", "init", "--dir", "keys", cwd=tmp_path)
    assert outside.returncode == 0 and "git working tree" not in outside.stdout
    assert not (tmp_path / "keys" / ".gitignore").exists()


def test_the_repository_ignores_the_key_folders_its_docs_write():
    ignored = (Path(__file__).resolve().parent.parent / ".gitignore").read_text().splitlines()
    assert {"/keys/", "/farm-keys/", "*.key"} <= set(ignored)


def test_a_signing_key_readable_by_others_is_refused(key, tmp_path):
    assert key.path is not None
    os.chmod(key.path, 0o644)
    with pytest.raises(farm.FarmError, match="mode 0644: a signing key must be readable by its owner only"):
        farm_archives.load_signing_key(key.path)


# -- verification -------------------------------------------------------------------------------------------------


def test_a_signed_archive_is_read_with_its_signer_and_an_unsigned_one_is_refused_unless_allowed(key, tmp_path):
    signed = write(tmp_path / "signed", key)
    assert ops.load_archives(signed, trust(key))[0].signer == key.key_id
    unsigned = write(tmp_path / "unsigned", None)
    with pytest.raises(arc.ArchiveError, match="manifest.sig: missing: the archive is unsigned and refused"):
        ops.load_archives(unsigned, trust(key))
    with pytest.raises(arc.ArchiveError, match="unsigned and refused"):
        ops.load_archives(unsigned)  # no trusted keys configured at all: still refused
    assert ops.load_archives(unsigned, trust(allow_unsigned=True))[0].signer is None


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_one_byte_change_anywhere_in_a_signed_archive_is_refused(key, tmp_path):
    folder = write(tmp_path / "a", key)
    names = [*arc.DATA_FILES, arc.MANIFEST_FILE, arc.SIGNATURE_FILE]
    original = {name: (folder / name).read_bytes() for name in names}
    checked = 0
    for name in names:
        size = len(original[name])
        for at in sorted({0, 1, size // 3, size // 2, size - 2, size - 1}):
            _flip(folder / name, at)
            with pytest.raises(arc.ArchiveError):
                ops.load_archives(folder, trust(key))
            with pytest.raises(arc.ArchiveError):  # --allow-unsigned never lets a changed signed archive in
                ops.load_archives(folder, trust(key, allow_unsigned=True))
            (folder / name).write_bytes(original[name])
            checked += 1
    assert checked >= 16
    assert ops.load_archives(folder, trust(key))[0].signer == key.key_id


def test_a_resealed_manifest_or_a_signature_moved_to_another_archive_is_refused(key, tmp_path):
    one, two = write(tmp_path / "one", key), write(tmp_path / "two", key, ("n=3",))
    manifest = json.loads((one / arc.MANIFEST_FILE).read_text())
    manifest["created"] += 1  # the attacker rewrites the manifest consistently but cannot sign it
    (one / arc.MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    with pytest.raises(arc.ArchiveError, match="does not match manifest.json: the archive was modified"):
        ops.load_archives(one, trust(key))
    write(tmp_path / "one", key)
    (one / arc.SIGNATURE_FILE).write_bytes((two / arc.SIGNATURE_FILE).read_bytes())
    with pytest.raises(arc.ArchiveError, match="does not match manifest.json"):
        ops.load_archives(one, trust(key))


def test_key_rotation_accepts_every_trusted_key_and_revocation_stops_a_removed_keys_archives(tmp_path):
    old = farm_archives.load_signing_key(farm_archives.generate_keys(tmp_path / "keys", "old")[0])
    new = farm_archives.load_signing_key(farm_archives.generate_keys(tmp_path / "keys", "new")[0])
    by_old, by_new = write(tmp_path / "old", old), write(tmp_path / "new", new, ("n=3",))
    trusted = tmp_path / "trusted.pub"
    trusted.write_text(f"# the fleet's signers\n{old.public.line()}\n\n{new.public.line()}\n")
    both = arc.Trust.from_env({"FARM_TRUSTED_KEYS": str(trusted)})
    assert [a.signer for a in ops.load_archives(by_old, both) + ops.load_archives(by_new, both)] == [
        old.key_id, new.key_id]
    trusted.write_text(new.public.line() + "\n")  # the old key is revoked
    revoked = arc.Trust.from_env({"FARM_TRUSTED_KEYS": str(trusted)})
    with pytest.raises(arc.ArchiveError, match=f"signed by key {old.key_id}, which is not a trusted key"):
        ops.load_archives(by_old, revoked)
    assert ops.load_archives(by_new, revoked)[0].signer == new.key_id
    inline = arc.Trust.from_env({"FARM_TRUSTED_KEYS": f"{old.public.line()},{new.public.line()}"})
    assert {k.key_id for k in inline.keys} == {old.key_id, new.key_id}


def test_a_bad_trusted_keys_entry_names_the_file_and_line(tmp_path):
    path = tmp_path / "trusted.pub"
    path.write_text("# ok\nfarm-ed25519 AAAA not-a-key\n")
    with pytest.raises(farm.FarmError, match=r"trusted.pub: line 2: 'AAAA'… is not the base64 of a 32-byte"):
        arc.Trust.from_env({"FARM_TRUSTED_KEYS": str(path)})


# -- the runtime --------------------------------------------------------------------------------------------------


def test_the_runtime_serves_trusted_archives_and_misses_with_a_warning_on_untrusted_ones(key, tmp_path, caplog):
    write(tmp_path / "good", key)
    assert runtime_source(arc.ArchiveStore(tmp_path / "good", trust=trust(key))) is farm.DecisionSource.FLEET_CACHE
    other = farm_archives.load_signing_key(farm_archives.generate_keys(tmp_path / "keys", "other")[0])
    for name, signer in (("unsigned", None), ("untrusted", other)):
        write(tmp_path / name, signer)
        with caplog.at_level(logging.WARNING):
            store = arc.ArchiveStore(tmp_path / name, trust=trust(key))
            assert runtime_source(store) is farm.DecisionSource.CACHE_MISS
        assert "unusable and skipped" in caplog.text and ("unsigned" in caplog.text or other.key_id in caplog.text)
        caplog.clear()
    folder = write(tmp_path / "modified", key)
    _flip(folder / arc.MANIFEST_FILE, 40)
    with caplog.at_level(logging.WARNING):
        assert runtime_source(arc.ArchiveStore(folder, trust=trust(key))) is farm.DecisionSource.CACHE_MISS
    assert "does not match manifest.json" in caplog.text


def test_the_runtime_takes_its_trusted_keys_from_the_environment_or_the_policy(key, tmp_path, monkeypatch, caplog):
    write(tmp_path / "a", key)
    assert runtime_source(arc.ArchiveStore(tmp_path / "a")) is farm.DecisionSource.CACHE_MISS
    monkeypatch.setenv("FARM_TRUSTED_KEYS", key.public.line())
    assert runtime_source(arc.ArchiveStore(tmp_path / "a")) is farm.DecisionSource.FLEET_CACHE
    monkeypatch.delenv("FARM_TRUSTED_KEYS")
    from fakes import FakeRunner

    policy = farm.StackPolicy(mode=farm.Mode.CACHE_ONLY, trusted_keys=(key.public.line(),))
    tuner = farm.StackTuner(policy, fleet=[tmp_path / "a"])
    problem = Problem(Scope.OPERATOR, "scale", FP, "n=1", persistent=True)
    assert tuner.select(problem, [Candidate(n) for n in NAMES], 0, FakeRunner()).source is (
        farm.DecisionSource.FLEET_CACHE)
    assert farm.StackPolicy.from_dict(json.loads(json.dumps(policy.to_dict()))) == policy
    with pytest.raises(farm.TuneFailure, match=r"policy.trusted_keys\[0\]"):
        farm.StackPolicy(trusted_keys=("ssh-rsa AAAA",)).validate()
    with caplog.at_level(logging.WARNING):
        monkeypatch.setenv("FARM_ALLOW_UNSIGNED", "1")
        write(tmp_path / "u", None)
        assert runtime_source(arc.ArchiveStore(tmp_path / "u")) is farm.DecisionSource.FLEET_CACHE
    assert "is UNSIGNED and accepted only because unsigned archives are allowed" in caplog.text


# -- the CLI ------------------------------------------------------------------------------------------------------


def test_the_cli_signs_exports_and_merges_and_imports_only_trusted_archives(tmp_path):
    from farm.stores.local import FARM, LocalStore

    private, public, key = farm_archives.generate_keys(tmp_path / "keys", "site-a")
    cache = tmp_path / "cache"
    local = LocalStore(cache, owner=FARM)
    for w in ("n=1", "n=2"):
        e = entry(w)
        local.publish(e.record, FP, e.problem_id, list(e.trials))
    local.close()
    done = farm_cli("archive", "export", "--from-cache", str(cache), "--out", "out", cwd=tmp_path,
                    env={"FARM_SIGNING_KEY": str(private)})
    assert done.returncode == 0 and f"signed by key {key.key_id}" in done.stdout, done.stderr
    folder = tmp_path / "out" / fingerprint_digest(FP)
    assert ops.load_archives(folder, arc.Trust((key,)))[0].signer == key.key_id

    target = ["archive", "import", str(folder), "--into-cache", str(tmp_path / "c2"), "--force"]
    refused = farm_cli(*target, cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"signed by key {key.key_id}, which is not a trusted key" in refused.stderr
    assert not (tmp_path / "c2").exists()
    accepted = farm_cli(*target, "--trusted-keys", str(public), cwd=tmp_path)
    assert accepted.returncode == 0 and "imported archive" in accepted.stdout, accepted.stderr

    merged = farm_cli("archive", "merge", "merged", str(folder), str(folder), "--signing-key", str(private),
                      cwd=tmp_path, env={"FARM_TRUSTED_KEYS": str(public)})
    assert merged.returncode == 0, merged.stderr
    assert (tmp_path / "merged" / folder.name / arc.SIGNATURE_FILE).exists()

    unsigned = farm_cli("archive", "export", "--from-cache", str(cache), "--out", "plain", cwd=tmp_path)
    assert unsigned.returncode == 0 and "UNSIGNED" in unsigned.stderr
    plain = tmp_path / "plain" / folder.name
    no = farm_cli("archive", "import", str(plain), "--into-cache", str(tmp_path / "c3"), "--force",
                  "--trusted-keys", str(public), cwd=tmp_path)
    assert no.returncode == 2 and no.stderr.count("\n") == 1 and "unsigned and refused" in no.stderr
    yes = farm_cli("archive", "import", str(plain), "--into-cache", str(tmp_path / "c3"), "--force",
                   "--allow-unsigned", cwd=tmp_path)
    assert yes.returncode == 0 and "for development only" in yes.stderr and "is UNSIGNED" in yes.stderr


def test_decisions_imported_into_redis_keep_their_signer_through_an_export(key, redis_db, tmp_path):
    from farm.stores.redis import RedisDecisions
    from farm_fleet.settings import Settings

    store = RedisDecisions(client=redis_db, settings=Settings(prefix="sig"))
    folder = write(tmp_path / "site-a", key, ("n=1", "n=2", "n=3"))
    (result,) = ops.import_redis(ops.load_archives(folder, trust(key)), store)
    assert result.new == 3
    hub = farm_archives.load_signing_key(farm_archives.generate_keys(tmp_path / "keys", "hub")[0])
    (exported,) = ops.export_redis(store, tmp_path / "out", signer=hub)
    manifest = json.loads((exported.written.path / arc.MANIFEST_FILE).read_text())
    assert manifest["provenance"] == {"signers": {key.key_id: 3}} and exported.provenance == {key.key_id: 3}
    assert ops.load_archives(exported.written.path, trust(hub))[0].signer == hub.key_id

    newer = entry("n=1")
    newer = arc.ArchiveEntry(DecisionRecord(newer.record.cache_key, 2, 0, "other", True, 0.4, time.time(),
                                            dict(newer.record.meta)), newer.problem_id, newer.trials)
    store.publish(newer.record, FP)  # the farm re-decides one of them: that one is the farm's own now
    (again,) = ops.export_redis(store, tmp_path / "out2", signer=hub)
    assert again.provenance == {key.key_id: 2}
    unsigned = write(tmp_path / "plain", None, ("n=9",))
    ops.import_redis(ops.load_archives(unsigned, trust(allow_unsigned=True)), store)
    (third,) = ops.export_redis(store, tmp_path / "out3")
    assert third.provenance == {key.key_id: 2}
    assert "provenance" in json.loads((third.written.path / arc.MANIFEST_FILE).read_text())
