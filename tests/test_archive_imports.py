"""What a runtime loads: ``import farm`` and a runtime with an archive tier (opened, looked up, nearest) never load
the archive tools, the package ``farm_archives`` (writer, whole-archive reader, rows, trial JSON, derived view,
signing, the bulk Redis import and its columns); and a schema 1 archive, which predates signatures, is refused with
one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from archive_helpers import FP_A, entry, hand_archive, key_for
from servers import farm_env

import farm_archives
from farm.environment import fingerprint_digest
from farm.stores import archive as arc

TOOLS = "farm_archives"  # the package and every module of it
V1 = Path(__file__).parent / "data" / "archive-v1" / fingerprint_digest(FP_A)

RUNTIME = """
import json, sys
import farm
after_import = sorted(m for m in sys.modules if m.startswith(("farm.", "farm_")))
from farm.stores.archive import ArchiveStore
store = ArchiveStore(sys.argv[1])
found = store.get(sys.argv[2])
tuner = farm.StackTuner(farm.StackPolicy(), fleet=[sys.argv[1]])
print(json.dumps({"after_import": after_import, "hit": found is not None and found.name,
                  "after_lookup": sorted(m for m in sys.modules if m.startswith(("farm.", "farm_")))}))
"""


def test_import_farm_and_a_runtime_reading_an_archive_never_load_the_archive_tools(tmp_path: Path) -> None:
    key = key_for(FP_A, "n=1")
    hand_archive(tmp_path, FP_A, [entry(key, created=time.time() - 60)])
    done = subprocess.run([sys.executable, "-c", RUNTIME, str(tmp_path), key], capture_output=True, text=True,
                          env=farm_env(), timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert loaded["hit"] == "fast"  # the archive was read: index, one row group, one record
    assert "farm.stores.archive.store" in loaded["after_lookup"]
    assert [m for m in loaded["after_import"] if m.split(".")[0] == TOOLS] == []
    assert [m for m in loaded["after_lookup"] if m.split(".")[0] == TOOLS] == []


def test_the_archive_package_names_each_export_once_and_resolves_every_one() -> None:
    from farm.stores.archive import _WHERE

    assert sorted(arc.__all__) == sorted(_WHERE)
    for name in arc.__all__:
        assert getattr(arc, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'v1'"):
        arc.__getattr__("v1")


def test_a_schema_1_archive_is_refused_in_one_line_saying_to_export_it_again(tmp_path: Path) -> None:
    folder = tmp_path / V1.name
    shutil.copytree(V1, folder)
    expected = "archive schema 1 predates signatures; export it again from its source"
    with pytest.raises(arc.ArchiveError, match=expected) as refused:
        farm_archives.read_archive(folder)
    assert "\n" not in str(refused.value) and str(folder / arc.MANIFEST_FILE) in str(refused.value)
    store = arc.ArchiveStore(tmp_path)  # the runtime tier skips it with a warning: its lookups are misses
    assert store.digests == ()
