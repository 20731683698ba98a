"""Compute clients: the device a trial runs on. ``host`` (NumPy, ``cpu:N``) and ``cuda`` (CuPy, ``cuda:N``)."""

from farm.runtimes.base import ComputeClient, client_for
from farm.runtimes.host import HostClient

__all__ = ["ComputeClient", "HostClient", "client_for"]
