"""Tunable operations for the farm: matmul, softmax, reduce_sum, transpose, bias_gelu_fusion, and users' own.

Light on purpose: importing ``kernels`` loads no operation and never imports CuPy. The registry
(:mod:`farm_kernels.registry`) loads the builtin operations, the ``farm.kernels`` entry points and ``--kernels``
modules on demand; see docs/kernels.md.
"""

from farm_kernels.operation import REQUIRED, Operation, SpecField, choice, code_identity, dim
from farm_kernels.registry import ensure_loaded, get, load_module, names, register

__all__ = [
    "REQUIRED",
    "Operation",
    "SpecField",
    "choice",
    "code_identity",
    "dim",
    "ensure_loaded",
    "get",
    "load_module",
    "names",
    "register",
]
