"""Triton kernels, pre-tuned by the farm (import name ``farm_triton``; docs/triton.md).

Applications: ``@farm_triton.autotune(configs=[...], key=[...])`` in place of ``@triton.autotune``, or an existing
kernel's ``prune_configs_by={"early_config_prune": farm_triton.decided("name")}``, after
``farm_triton.configure(cache_directory=..., fleet=[...], report_to=...)``. A launch the farm decided gets the
farm's config with no benchmark, the same in every process and rank. Farms: ``farm_triton.operation(...)`` makes
a kernel an operation to tune, ``farm_triton.space(...)`` its config list. ``farm_triton.harvest()`` reports kernels processes tuned themselves.

Importing this package needs neither torch nor triton; using a Triton feature without them is UNAVAILABLE with a
line saying how to install them.
"""

from farm_triton.decisions import Decisions, configure, current
from farm_triton.harvest import Listener, harvest
from farm_triton.hooks import Decided, autotune, decided
from farm_triton.operation import operation
from farm_triton.space import space

__all__ = ["Decided", "Decisions", "Listener", "autotune", "configure", "current", "decided", "harvest", "operation", "space"]
