"""Read a kernel's resources from a cubin (an ELF file) and check launches against an architecture's limits.

No cuobjdump: the cubin's own sections say it. For a kernel ``k``:

- ``.text.k``: its code;
- ``.nv.info``: per-kernel attributes keyed by symbol index: ``EIATTR_REGCOUNT`` (0x2f) is the registers per
  thread (older cubins keep it only in the top byte of ``.text.k``'s ``sh_info``, the fallback), and
  ``EIATTR_FRAME_SIZE`` (0x11) the stack frame (local memory: spills or local arrays);
- ``.nv.shared.k``: its static shared memory (the section's size; absent when it uses none). sm_90 cubins count
  the 1 KiB the system reserves per block in it (ptxas' ``-v`` report does not), so the checks are conservative;
- ``.nv.info.k``: attributes (type-length records); ``EIATTR_MAX_THREADS`` (0x05) holds ``__launch_bounds__``.

:func:`launch_problems` checks one launch configuration against :class:`ArchLimits` the way the driver does
before a launch (registers are allocated per warp in units of 256, so "too many resources requested for launch"
comes from ``ceil(regs * 32 / 256) * 256 * warps > 65536``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from farm.errors import CubinError

EIATTR_MAX_THREADS = 0x05
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F
EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL, EIFMT_SVAL = 1, 2, 3, 4
STT_FUNC = 2


@dataclass(frozen=True)
class ArchLimits:
    """Per-block launch limits of a compute capability (CUDA C Programming Guide, "Compute capabilities")."""

    arch: str
    registers_per_block: int = 65536
    registers_per_thread: int = 255
    register_unit: int = 256  # registers are allocated per warp in units of this many
    threads_per_block: int = 1024
    static_shared: int = 48 * 1024  # static __shared__ per block, on every architecture
    shared_per_block_optin: int = 48 * 1024  # static + dynamic with the opt-in attribute


LIMITS = {
    "sm_80": ArchLimits("sm_80", shared_per_block_optin=163 * 1024),
    "sm_90": ArchLimits("sm_90", shared_per_block_optin=227 * 1024),
}


@dataclass(frozen=True)
class KernelResources:
    """What one compiled kernel needs per thread and per block."""

    name: str
    registers: int
    shared: int  # static shared memory, bytes
    frame: int  # stack frame (local memory) per thread, bytes
    max_threads: int | None  # from __launch_bounds__, None without


# A section header as kernels() keeps it: (name, type, offset, size, link, info, entsize).
Section = tuple[int, int, int, int, int, int, int]


def architecture(cubin: bytes) -> int:
    """The SM version a cubin is for (80, 90). CUDA 13's ELF ABI (OS ABI 0x41) keeps it in bits 8-15 of
    ``e_flags``; older cubins (OS ABI 0x33) in the low byte."""
    if cubin[:4] != b"\x7fELF":
        raise CubinError("not an ELF file (a cubin is one)")
    flags: int = struct.unpack_from("<I", cubin, 0x30)[0]
    return (flags >> 8) & 0xFF if cubin[7] == 0x41 else flags & 0xFF


def kernels(cubin: bytes) -> dict[str, KernelResources]:
    """Every entry point (global function symbol with a ``.text.NAME`` section) and its resources."""
    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise CubinError("not a 64-bit ELF file (a cubin is one)")
    (shoff,) = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections: list[Section] = []
    for i in range(shnum):
        name, kind, _flags, _addr, offset, size, link, info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", cubin, shoff + i * shentsize
        )
        sections.append((name, kind, offset, size, link, info, entsize))
    names_at = sections[shstrndx][2]

    def cstr(at: int) -> str:
        return cubin[at : cubin.index(b"\x00", at)].decode()

    by_name = {cstr(names_at + s[0]): s for s in sections}
    symbols = _symbols(cubin, by_name, sections, cstr)
    info = by_name.get(".nv.info")
    frames = {symbols.get(i): value for i, value in _info_pairs(cubin, info, EIATTR_FRAME_SIZE)}
    registers = {symbols.get(i): value for i, value in _info_pairs(cubin, info, EIATTR_REGCOUNT)}
    found = {}
    for section_name, (_n, _k, _off, _size, _link, header_info, _e) in by_name.items():
        if not section_name.startswith(".text."):
            continue
        name = section_name[len(".text.") :]
        if name not in symbols.values():
            continue
        shared = by_name.get(f".nv.shared.{name}")
        max_threads = None
        for attr, data in _records(cubin, by_name.get(f".nv.info.{name}")):
            if attr == EIATTR_MAX_THREADS and len(data) == 12:
                x, y, z = struct.unpack("<III", data)
                max_threads = x * y * z
        found[name] = KernelResources(
            name=name,
            registers=registers.get(name, header_info >> 24),
            shared=shared[3] if shared is not None else 0,
            frame=frames.get(name, 0),
            max_threads=max_threads,
        )
    return found


def _symbols(cubin: bytes, by_name: dict[str, Section], sections: list[Section], cstr: Callable[[int], str]) -> dict[int, str]:
    """Symbol index -> name of the function symbols (the entry points and device functions)."""
    table = by_name.get(".symtab")
    if table is None:
        raise CubinError("no .symtab section")
    _n, _k, offset, size, link, _info, entsize = table
    strings = sections[link][2]
    out = {}
    for index in range(size // entsize):
        st_name, st_info, _other, _shndx, _value, _size = struct.unpack_from("<IBBHQQ", cubin, offset + index * entsize)
        if st_info & 0xF == STT_FUNC:
            out[index] = cstr(strings + st_name)
    return out


def _records(cubin: bytes, section: Section | None) -> list[tuple[int, bytes]]:
    """The (attribute, payload) records of an ``.nv.info`` section."""
    if section is None:
        return []
    _n, _k, offset, size, *_ = section
    records, at, end = [], offset, offset + size
    while at + 2 <= end:
        fmt, attr = cubin[at], cubin[at + 1]
        at += 2
        if fmt == EIFMT_SVAL:
            (length,) = struct.unpack_from("<H", cubin, at)
            records.append((attr, cubin[at + 2 : at + 2 + length]))
            at += 2 + length
        elif fmt == EIFMT_HVAL:
            records.append((attr, cubin[at : at + 2]))
            at += 2
        elif fmt == EIFMT_BVAL:
            records.append((attr, cubin[at : at + 1]))
            at += 2  # a byte value is padded to a half-word
        elif fmt == EIFMT_NVAL:
            records.append((attr, b""))
            at += 2
        else:
            raise CubinError(f".nv.info record of unknown format {fmt:#x} at byte {at - 2}")
    return records


def _info_pairs(cubin: bytes, section: Section | None, attribute: int) -> list[tuple[int, int]]:
    """(symbol index, value) of the ``attribute`` records of the global ``.nv.info`` section."""
    return [struct.unpack("<II", data) for attr, data in _records(cubin, section) if attr == attribute and len(data) == 8]


def block_registers(registers: int, threads: int, limits: ArchLimits) -> int:
    """Registers a block of ``threads`` threads occupies (per-warp allocation in units of ``register_unit``)."""
    per_warp = -(-registers * 32 // limits.register_unit) * limits.register_unit
    return per_warp * -(-threads // 32)


def launch_problems(kernel: KernelResources, block: tuple[int, int, int], shared_mem: int, limits: ArchLimits) -> list[str]:
    """Why launching ``kernel`` with ``block`` and ``shared_mem`` dynamic bytes fails on ``limits`` (empty: it fits)."""
    threads = block[0] * block[1] * block[2]
    problems = []
    if threads > limits.threads_per_block:
        problems.append(f"{threads} threads > {limits.threads_per_block} per block")
    if kernel.max_threads is not None and threads > kernel.max_threads:
        problems.append(f"{threads} threads > __launch_bounds__ {kernel.max_threads}")
    if kernel.registers > limits.registers_per_thread:
        problems.append(f"{kernel.registers} registers per thread > {limits.registers_per_thread}")
    used = block_registers(kernel.registers, threads, limits)
    if used > limits.registers_per_block:
        problems.append(f"{kernel.registers} registers x {threads} threads = {used} > {limits.registers_per_block} per block")
    if kernel.shared > limits.static_shared:
        problems.append(f"{kernel.shared} bytes static shared memory > {limits.static_shared}")
    if kernel.shared + shared_mem > limits.shared_per_block_optin:
        problems.append(f"{kernel.shared + shared_mem} bytes shared memory > {limits.shared_per_block_optin} per block")
    return problems
