"""Test-only operations for the farm's real-process tests (loaded with ``--kernels farm_testops``).

They are deliberately hostile: a wrong but fast candidate, one that raises, one that returns NaN, one that hangs,
one that kills its own worker process, and one that runs until the test opens a gate; and a trivial one whose
inputs take a set time to build (``farmtest_paced``, the chaos soak's problems). None of this ships in ``kernels/``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from farm import TunableSet, array_signature
from farm_kernels.operation import Operation, SpecField, dim


def slow_reference(x):
    """Twice x, one element at a time: slow enough that a vectorized candidate always wins clearly."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = x[i] * 2.0
    return out


def vectorized(x):
    return x + x


def wrong_but_fast(x):
    return x * 3.0


def raises(x):
    raise RuntimeError("this candidate always fails")


def returns_nan(x):
    return np.full_like(x, np.nan)


def hangs(x):
    while True:
        time.sleep(0.05)


def ignores_the_soft_limit(x):
    """Hangs with the soft time limit's signal blocked, like a hang inside C code: only the hard limit ends it."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    while True:
        time.sleep(0.05)


def kills_its_worker(x):
    os._exit(17)


def loses_the_device_on_cpu0(x):
    """Correct, but on the worker of cpu:0 the device is "lost": every later completion fence fails, as after a
    GPU fault. Elsewhere it is an ordinary (fast) candidate."""
    if os.environ.get("FARM_WORKER_DEVICE") == "cpu:0":
        from farm.runtimes.host import HostClient

        def lost(self):
            raise RuntimeError("device lost")

        HostClient.sync = lost
    return x + x


def waits_for_the_gate(x):
    """Correct, but holds its group until the file named by FARMTEST_GATE exists: a run that a test can keep going
    for as long as it needs and then let finish."""
    gate = os.environ["FARMTEST_GATE"]
    while not os.path.exists(gate):
        time.sleep(0.02)
    return x + x


def make(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, ...]:
    return (xp.asarray(rng.random(spec["n"]), dtype=spec["dtype"]),)


PACED_ELEMENTS = 64


def paced_copy(x, index):
    return x.copy()


def paced_add_zero(x, index):
    return x + 0.0


def make_paced(spec: Mapping[str, Any], xp: Any, rng: np.random.Generator) -> tuple[Any, ...]:
    """Inputs of ``farmtest_paced``: 64 elements whatever the problem, built in ``pace_ms`` milliseconds (the
    soak's pace: each problem costs its worker about that long, so a catalog lasts as long as the soak)."""
    time.sleep(spec["pace_ms"] / 1000.0)
    return (xp.asarray(rng.random(PACED_ELEMENTS), dtype=spec["dtype"]), spec["index"])


def paced_operation() -> Operation:
    tunable = TunableSet("farmtest_paced", signature=array_signature)
    tunable.add(paced_copy, name="paced_copy", reference=True)
    tunable.add(paced_add_zero, group=0)
    return Operation(name="farmtest_paced", host=tunable, cuda=None,
                     fields=(SpecField("index", int, minimum=0, help="which problem (not its size)"),
                             SpecField("pace_ms", int, minimum=0, help="milliseconds to build its inputs")),
                     dtypes={"cpu": ("float64",)}, make=make_paced)


def operation(name: str, candidates: list[tuple[Any, int]]) -> Operation:
    tunable = TunableSet(name, signature=array_signature)
    tunable.add(slow_reference, name="slow_reference", reference=True)
    for fn, group in candidates:
        tunable.add(fn, group=group)
    return Operation(name=name, host=tunable, cuda=None, fields=(dim("n"),), dtypes={"cpu": ("float64",)}, make=make)


OPERATIONS = (
    operation("farmtest_scale", [(vectorized, 0), (wrong_but_fast, 0), (raises, 1), (returns_nan, 1)]),
    operation("farmtest_hang", [(vectorized, 0), (hangs, 1)]),
    operation("farmtest_crash", [(vectorized, 0), (kills_its_worker, 1)]),
    operation("farmtest_device", [(loses_the_device_on_cpu0, 0)]),
    operation("farmtest_stubborn", [(vectorized, 0), (ignores_the_soft_limit, 1)]),
    operation("farmtest_gate", [(waits_for_the_gate, 0)]),
    paced_operation(),
)
