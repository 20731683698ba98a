"""One error hierarchy under FarmError: every error says when it is raised and round-trips through JSON."""

from __future__ import annotations

import inspect
import json
import pickle

import pytest

import farm.errors as errors
import farm_fleet.errors as fleet_errors
from farm.errors import (
    ArchiveError,
    ConfigError,
    CorruptRecord,
    CubinError,
    CudaToolError,
    DeviceBusy,
    FailureKind,
    FarmError,
    NvrtcError,
    NvrtcUnavailable,
    ProtocolError,
    ReplayFailure,
    RestrictionError,
    TuneFailure,
    ValidationUnavailable,
    error_from_dict,
)
from farm_fleet.errors import (
    CompileTimeout,
    DeviceQuarantined,
    GroupsFailed,
    IllegalTransition,
    RunInterrupted,
    StoreUnavailable,
)

EXAMPLES = [
    FarmError("no live workers"),
    TuneFailure(FailureKind.DEVICE, "device lost"),
    ConfigError("c.toml", "problems[0].n", 0, "must be >= 1"),
    ProtocolError("message field 'run' is missing"),
    CorruptRecord("bad checksum"),
    ArchiveError("decisions.parquet row 3: field 'ratio'"),
    ValidationUnavailable("ref"),
    DeviceQuarantined("cpu:0 failed a fence"),
    DeviceBusy("cpu:0: lock held by another user"),
    CudaToolError("nvrtc"),
    NvrtcUnavailable("libnvrtc.so.12 not found"),
    NvrtcError("softmax.cu(3): error: expected a ;"),
    CubinError("not an ELF file"),
    StoreUnavailable("the results Redis unreachable for 20s"),
    IllegalTransition("problem p1: published -> running"),
    RunInterrupted("run r1 interrupted with 3 problems unfinished"),
    RestrictionError("space 'tiled': restriction 'block // unroll' failed: ZeroDivisionError"),
    ReplayFailure("launch failed as recorded (RuntimeFailedConfig) for (16, 4)"),
    GroupsFailed("1 of 2 groups failed in the farm: p1/g0: rejected"),
    CompileTimeout("3 kernels not compiled after 60 s on queue farm.compile"),
]


def test_every_error_of_the_farm_is_under_the_root_with_a_raised_when_docstring() -> None:
    classes = [c for module in (errors, fleet_errors) for _, c in inspect.getmembers(module, inspect.isclass)
               if issubclass(c, BaseException)]
    assert {type(e) for e in EXAMPLES} == set(classes)
    for cls in classes:
        assert issubclass(cls, FarmError)
        assert (cls.__doc__ or "").startswith("Raised when "), cls.__name__


def test_the_old_homes_of_errors_name_the_same_classes() -> None:
    from farm.stores.archive import ArchiveError as archive_error
    from farm.stores.base import CorruptRecord as corrupt
    from farm.trials import ValidationUnavailable as unavailable
    from farm_fleet.protocol import ProtocolError as protocol
    from farm_workers.tasks import DeviceQuarantined as quarantined

    assert (archive_error, corrupt, unavailable, protocol, quarantined) == (
        ArchiveError, CorruptRecord, ValidationUnavailable, ProtocolError, DeviceQuarantined)
    assert issubclass(ProtocolError, ValueError)  # callers that catch ValueError keep working


@pytest.mark.parametrize("error", EXAMPLES, ids=lambda e: type(e).__name__)
def test_an_error_round_trips_through_json_and_pickle(error: FarmError) -> None:
    back = error_from_dict(json.loads(json.dumps(error.to_dict())))
    assert type(back) is type(error) and str(back) == str(error) and back.to_dict() == error.to_dict()
    copied = pickle.loads(pickle.dumps(error))
    assert type(copied) is type(error) and str(copied) == str(error)


def test_a_tune_failure_keeps_its_kind_across_json() -> None:
    back = TuneFailure.from_dict(TuneFailure.device("lost").to_dict())
    assert isinstance(back, TuneFailure) and back.kind is FailureKind.DEVICE and back.message == "lost"


@pytest.mark.parametrize("data", [None, {"message": "x"}, {"error": "KeyError", "message": "x"},
                                  {"error": "ConfigError", "source": "s"}])
def test_a_malformed_error_message_is_a_protocol_error(data: object) -> None:
    with pytest.raises(ProtocolError):
        error_from_dict(data)


def test_from_dict_on_a_subclass_refuses_another_branch() -> None:
    with pytest.raises(ProtocolError):
        TuneFailure.from_dict(ConfigError("s", "f", 1, "p").to_dict())


def test_every_exception_class_of_the_product_lives_in_an_errors_module_or_is_private() -> None:
    import ast

    from test_imports import modules

    found = []
    for module, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception", "Failure")) or b.id == "FarmError")
                for b in node.bases
            ):
                found.append(f"{module}.{node.name}")
                assert (ast.get_docstring(node) or "").startswith("Raised when "), f"{module}.{node.name}"
    public = [name for name in found if not name.rsplit(".", 1)[1].startswith("_")]
    assert public and all(name.startswith(("farm.errors.", "farm_fleet.errors.")) for name in public), public


def test_the_core_errors_module_holds_no_error_that_only_the_fleet_raises() -> None:
    for name in ("StoreUnavailable", "IllegalTransition", "RunInterrupted", "DeviceQuarantined"):
        assert not hasattr(errors, name), name
        assert issubclass(getattr(fleet_errors, name), FarmError)
