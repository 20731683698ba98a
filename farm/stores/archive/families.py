"""An archive's nearest-decision index (``farm.nearest``): family digest -> rows, built from its key columns.

Built once per loaded archive, on its first nearest lookup (``ArchiveStore.nearest``): one pass over the key's
columns, a row group at a time (the key's parts, each row's key rebuilt as the record's). Archives carry no index of
their own, so every archive gets one.
"""

from __future__ import annotations

from typing import Any

from farm.encoding import fields
from farm.nearest import FamilyIndex, family_of

NEAR_ROWS = 4  # rows one lookup decodes: the nearest few (a nearer one may be stale, unverified or banned)
_KEY_COLUMNS = ("key_version", "scope", "operation_key", "workload", "execution_context", "reference_index",
                "manifest", "accuracy_key")


def family_index(pf: Any, fingerprint: str) -> FamilyIndex:
    """The family index of a Parquet decisions file (``pf``: its open ParquetFile) of ``fingerprint``."""
    index = FamilyIndex()
    row = 0
    for g in range(pf.num_row_groups):
        group = pf.read_row_group(g, columns=list(_KEY_COLUMNS))
        v = [group.column(i).to_pylist() for i in range(len(_KEY_COLUMNS))]
        keys = [fields([a, b, c, fingerprint, d, e, str(f), m, acc]) for a, b, c, d, e, f, m, acc in zip(*v, strict=True)]
        for key in keys:
            found = family_of(key)
            if found is not None:
                index.add(found.digest, found.dims, row)
            row += 1
    return index
