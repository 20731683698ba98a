"""An archive's fleet-priors index (``farm.priors``): a problem family's id across fingerprints -> rows.

A spaced decision the farm publishes names its family across fingerprints in its meta (``fleet_family``,
``farm_coordinator.aggregate``). Archives carry the meta whole (``meta_json``), so the index is built once per
loaded archive, on its first priors lookup (``ArchiveStore.priors``): one pass over that column, a row group at a
time, the id extracted by Arrow's regex kernel (the meta is canonical JSON: the member reads
``"fleet_family":"<hex>"``). A row it finds is verified when it is read: its record's meta must name the family.
"""

from __future__ import annotations

from typing import Any

FLEET_FAMILY = "fleet_family"
"""The meta member that names a decision's problem family across fingerprints."""
_PATTERN = r'"fleet_family":"(?P<family>[0-9a-f]{1,64})"'


def priors_index(pf: Any) -> dict[str, list[int]]:
    """Family id -> the rows that name it, of a Parquet decisions file (``pf``: its open ParquetFile)."""
    import pyarrow.compute as pc

    column = "meta_json"
    index: dict[str, list[int]] = {}
    row = 0
    for g in range(pf.num_row_groups):
        values = pf.read_row_group(g, columns=[column]).column(0)
        found = pc.struct_field(pc.extract_regex(values, _PATTERN), [0]).to_pylist()
        for i, family in enumerate(found, row):
            if family:
                index.setdefault(family, []).append(i)
        row += len(values)
    return index
