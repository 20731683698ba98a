"""Fuzzed parsers (issue 12.8): the catalog loader, the wire protocol's ``from_dict`` parsers and the decision
record parser raise only their documented errors (ConfigError, ProtocolError, CorruptRecord) on any input.

Hypothesis, seeded by a kept corpus of valid inputs (``tests/fuzz/corpus/``), mutates them structurally (values
replaced by arbitrary JSON, keys dropped or added) and byte-wise. The run is bounded for CI (``FUZZ_EXAMPLES``
examples per target, default 150; raise it for a longer local campaign); failing examples are kept in
``tests/fuzz/examples/`` (read-only in CI) and replayed first on every run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase, ReadOnlyDatabase

from farm.decisions import DecisionRecord, _checksum
from farm.errors import ConfigError, CorruptRecord
from farm_coordinator.catalog import load_catalog
from farm_fleet.protocol import GroupResult, GroupTask, ProtocolError

HERE = Path(__file__).parent / "fuzz"
CORPUS = HERE / "corpus"
_examples = DirectoryBasedExampleDatabase(str(HERE / "examples"))
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),
    deadline=None,
    database=ReadOnlyDatabase(_examples) if os.environ.get("CI") else _examples,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def corpus(kind: str) -> list[Path]:
    return sorted((CORPUS / kind).iterdir())


EDGES = st.sampled_from([10**400, -(10**400), 2**63, -1, 0, 1e308, float("nan"), float("inf"), -0.0, "", "cpu",
                         "cuda", "float32", "[" * 5000 + "]" * 5000])
LEAF = EDGES | st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
JSON = st.recursive(
    LEAF,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON-like value: dict keys and list positions, at any depth."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _paths(item, (*prefix, i))
    return found


@st.composite
def mutated(draw: Any, value: Any) -> Any:
    """``value`` with one to three places replaced by arbitrary JSON, removed, or given a new sibling."""
    value = json.loads(json.dumps(value))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(value)
        shallow = [p for p in paths if len(p) <= 1]
        path = draw(st.sampled_from(shallow if draw(st.booleans()) else paths))
        if not path:
            value = draw(JSON)
            continue
        parent = value
        for step in path[:-1]:
            parent = parent[step]
        op = draw(st.integers(0, 5))
        if op == 0:
            del parent[path[-1]]
        elif op == 1 and isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(JSON)
        elif op == 1:
            parent.append(draw(JSON))
        else:
            parent[path[-1]] = draw(EDGES | LEAF | JSON)
    return value


@st.composite
def one_field(draw: Any, value: Any) -> Any:
    """``value`` with one member of its top-level object (or of one object nested in it) set to an edge value."""
    value = json.loads(json.dumps(value))
    objects = [value] + [v for v in (value.values() if isinstance(value, dict) else []) if isinstance(v, dict)]
    target = draw(st.sampled_from(objects))
    if isinstance(target, dict) and target:
        target[draw(st.sampled_from(sorted(target)))] = draw(EDGES | LEAF)
    return value


def variants(value: Any) -> st.SearchStrategy[Any]:
    return one_field(value) | mutated(value)


@st.composite
def byte_mutations(draw: Any, data: bytes) -> bytes:
    """``data`` with a few bytes flipped, deleted or inserted."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 8))):
        if not out:
            out.extend(draw(st.binary(min_size=1, max_size=4)))
            continue
        at = draw(st.integers(0, len(out) - 1))
        op = draw(st.integers(0, 2))
        if op == 0:
            out[at] = draw(st.integers(0, 255))
        elif op == 1:
            del out[at]
        else:
            out[at:at] = draw(st.binary(min_size=1, max_size=4))
    return bytes(out)


# -- the catalog loader ------------------------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    """Inline TOML for JSON-like values (enough for the fuzzer: tables inline, strings as JSON strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    return '""'  # None has no TOML form


def toml_document(data: Any) -> str:
    if not isinstance(data, dict):
        data = {"problems": data}
    return "\n".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in data.items()) + "\n"


def load(text: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "catalog.toml"
        path.write_bytes(text)
        with contextlib.suppress(ConfigError):
            load_catalog(path)


def catalog_data(path: Path) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(path.read_text())


@pytest.mark.parametrize("path", corpus("catalog"), ids=lambda p: p.name)
def test_the_catalog_corpus_loads(path: Path) -> None:
    load_catalog(path)


@FUZZ
@given(st.sampled_from(corpus("catalog")).flatmap(lambda p: variants(catalog_data(p))))
def test_the_catalog_loader_raises_only_config_errors_on_mutated_structures(data: Any) -> None:
    load(toml_document(data).encode())


@FUZZ
@given(st.sampled_from(corpus("catalog")).flatmap(lambda p: byte_mutations(p.read_bytes())))
def test_the_catalog_loader_raises_only_config_errors_on_mutated_bytes(text: bytes) -> None:
    load(text)


# -- the wire protocol -------------------------------------------------------------------------------------------


def parse_message(data: Any) -> None:
    for parser in (GroupTask.from_dict, GroupResult.from_dict):
        with contextlib.suppress(ProtocolError):
            parser(data)


@pytest.mark.parametrize("path", corpus("protocol"), ids=lambda p: p.name)
def test_the_protocol_corpus_parses(path: Path) -> None:
    data = json.loads(path.read_text())
    parser = GroupTask.from_dict if "candidates" in data else GroupResult.from_dict
    assert parser(data).to_dict() == data


@FUZZ
@given(st.sampled_from(corpus("protocol")).flatmap(lambda p: variants(json.loads(p.read_text()))) | JSON)
def test_the_protocol_parsers_raise_only_protocol_errors(data: Any) -> None:
    parse_message(data)


# -- the decision record -----------------------------------------------------------------------------------------


def parse_record(text: str | bytes) -> None:
    with contextlib.suppress(CorruptRecord):
        DecisionRecord.from_json(text)


def resealed(data: Any) -> str:
    """A mutated record with a valid checksum, so the parser's field checks are reached too."""
    if isinstance(data, dict):
        body = {k: v for k, v in data.items() if k != "checksum"}
        body["checksum"] = _checksum(body)
        return json.dumps(body)
    return json.dumps(data)


@pytest.mark.parametrize("path", corpus("record"), ids=lambda p: p.name)
def test_the_record_corpus_parses(path: Path) -> None:
    assert DecisionRecord.from_json(path.read_bytes()).name == "a"


@FUZZ
@given(st.sampled_from(corpus("record")).flatmap(lambda p: variants(json.loads(p.read_text()))))
def test_the_record_parser_raises_only_corrupt_record_on_resealed_mutations(data: Any) -> None:
    parse_record(resealed(data))


@FUZZ
@given(st.sampled_from(corpus("record")).flatmap(lambda p: byte_mutations(p.read_bytes())))
def test_the_record_parser_raises_only_corrupt_record_on_mutated_bytes(text: bytes) -> None:
    parse_record(text)


# -- inputs the fuzzers once broke the parsers with, replayed on every run ----------------------------------------


@pytest.mark.parametrize("path", sorted((HERE / "regressions").iterdir()), ids=lambda p: p.name)
def test_inputs_that_once_broke_a_parser_raise_only_its_documented_error(path: Path) -> None:
    if path.name.startswith("catalog-"):
        with pytest.raises(ConfigError):
            load_catalog(path)
    elif path.name.startswith("record-"):
        with pytest.raises(CorruptRecord):
            DecisionRecord.from_json(path.read_bytes())
    else:
        with pytest.raises(ProtocolError):
            data = json.loads(path.read_text())
            (GroupTask.from_dict if "indices" in data else GroupResult.from_dict)(data)
