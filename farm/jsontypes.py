"""The types of JSON data as the farm's records hold it: a workload spec, an archive row, a report's fields.

``JSONValue`` is what ``json.loads`` can return; records type such fields with these, never ``Any``."""

from __future__ import annotations

from typing import TypeAlias

JSONScalar: TypeAlias = "str | int | float | bool | None"
JSONValue: TypeAlias = "JSONScalar | list[JSONValue] | dict[str, JSONValue]"
JSONObject: TypeAlias = "dict[str, JSONValue]"

__all__ = ["JSONObject", "JSONScalar", "JSONValue"]
