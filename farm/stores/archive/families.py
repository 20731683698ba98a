"""An archive's nearest-decision index (``farm.nearest``): family digest -> rows, built from its key columns.

Built once per loaded archive, on its first nearest lookup (``ArchiveStore.nearest``): one pass over the key's
columns, a row group at a time (schema 2: the key's parts, each row's key rebuilt as the record's; schema 1: its
``cache_key`` column). Archives carry no index of their own, so every archive, old or new, gets one.
"""

from __future__ import annotations

from typing import Any

from farm.encoding import fields
from farm.nearest import FamilyIndex, family_of

NEAR_ROWS = 4  # rows one lookup decodes: the nearest few (a nearer one may be stale, unverified or banned)
_KEY_COLUMNS = ("key_version", "scope", "operation_key", "workload", "execution_context", "reference_index",
                "manifest", "accuracy_key")


def family_index(pf: Any, version: int, fingerprint: str) -> FamilyIndex:
    """The family index of a Parquet decisions file (``pf``: its open ParquetFile) of schema ``version``."""
    index = FamilyIndex()
    row = 0
    for g in range(pf.num_row_groups):
        if version == 1:
            group = pf.read_row_group(g, columns=["cache_key"])
            keys = [str(k) for k in group.column(0).to_pylist()]
        else:
            group = pf.read_row_group(g, columns=list(_KEY_COLUMNS))
            v = [group.column(i).to_pylist() for i in range(len(_KEY_COLUMNS))]
            keys = [fields([a, b, c, fingerprint, d, e, str(f), m, acc])
                    for a, b, c, d, e, f, m, acc in zip(*v, strict=True)]
        for key in keys:
            found = family_of(key)
            if found is not None:
                index.add(found.digest, found.dims, row)
            row += 1
    return index
