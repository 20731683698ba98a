"""Compute clients: the device a trial runs on. ``host`` (NumPy, ``cpu:N``) and ``cuda`` (CuPy, ``cuda:N``).

The factory lives here so that ``base`` (the port and the device lock) imports neither runtime.
"""

from farm.runtimes.base import ComputeClient, parse_device
from farm.runtimes.host import HostClient

__all__ = ["ComputeClient", "HostClient", "client_for", "parse_device"]


def client_for(device: str) -> ComputeClient:
    """The client for ``cpu:N`` or ``cuda:N``; a CUDA client without a device raises UNAVAILABLE."""
    kind, index = parse_device(device)
    if kind == "cpu":
        return HostClient(index)
    from farm.runtimes.cuda import CudaClient  # CuPy itself is imported lazily by the client

    return CudaClient(index)
