"""A column of texts held as Arrow arrays: what an archive import publishes without a Python object per value.

An import verifies an archive's decisions column-wise, and the texts it publishes (record texts, trial rows) come
out of that as Arrow arrays. :class:`TextColumn` keeps them so: Redis packing (``farm_archives.redis_import``) takes a
range of rows as one Arrow array and sends its data as it is; the local cache takes a range as Python strings, a
part at a time. Everywhere else it is an ordinary sequence of ``str``. pyarrow is imported lazily.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload


class TextColumn(Sequence[str]):
    """Texts in order, as Arrow string arrays (chunks) and Python strings appended one by one (kept aside and
    turned into a chunk when the column is read). No value is null."""

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._chunks: list[Any] = []  # Arrow string or large_string arrays
        self._ends: list[int] = []  # the row after each chunk's last
        self._pending: list[str] = []
        self.extend(values)

    # -- building -----------------------------------------------------------------------------------------------

    def append_array(self, array: Any) -> None:
        """Append the rows of an Arrow string array (no nulls)."""
        self._flush()
        if len(array):
            if array.null_count:
                raise ValueError("a text column holds no nulls")
            self._chunks.append(array)
            self._ends.append(len(self) + len(array))

    def append(self, value: str) -> None:
        self._pending.append(value)

    def extend(self, values: Iterable[str]) -> None:
        if isinstance(values, TextColumn):
            for chunk in values._chunks:
                self.append_array(chunk)
            self._pending += values._pending
        else:
            self._pending += values

    def _flush(self) -> None:
        if self._pending:
            import pyarrow as pa

            pending, self._pending = self._pending, []
            self._chunks.append(pa.array(pending, pa.large_string()))
            self._ends.append((self._ends[-1] if self._ends else 0) + len(pending))

    # -- reading ------------------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return (self._ends[-1] if self._ends else 0) + len(self._pending)

    def arrow(self, start: int = 0, stop: int | None = None) -> Any:
        """Rows ``start`` to ``stop`` as one Arrow large_string array (no copy of the data when they lie in one
        chunk)."""
        import pyarrow as pa

        self._flush()
        stop = len(self) if stop is None else min(stop, len(self))
        if start >= stop:
            return pa.array([], pa.large_string())
        pieces = []
        c = bisect.bisect_right(self._ends, start)
        while start < stop:
            begin = self._ends[c - 1] if c else 0
            end = min(self._ends[c], stop)
            pieces.append(self._chunks[c].slice(start - begin, end - start).cast(pa.large_string()))
            start, c = end, c + 1
        return pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            start, stop, step = i.indices(len(self))
            values = self.arrow(start, stop).to_pylist() if stop > start else []
            return values if step == 1 else list(self)[i]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("text column index out of range")
        self._flush()
        c = bisect.bisect_right(self._ends, i)
        return str(self._chunks[c][i - (self._ends[c - 1] if c else 0)].as_py())

    def __iter__(self) -> Iterator[str]:
        self._flush()
        for chunk in self._chunks:
            yield from chunk.to_pylist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TextColumn | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"TextColumn({len(self)} texts in {len(self._chunks)} chunks)"


def arrow_texts(values: Sequence[str | None], start: int, stop: int) -> Any:
    """Rows ``start`` to ``stop`` of a sequence of texts (None: null) as an Arrow large_string array: straight
    from a :class:`TextColumn`'s arrays, else built from the Python values."""
    import pyarrow as pa

    if isinstance(values, TextColumn):
        return values.arrow(start, stop)
    return pa.array(values[start:stop], pa.large_string())
