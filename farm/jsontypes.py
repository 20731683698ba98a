"""The types of JSON data as the farm's records hold it: a workload spec, an archive row, a report's fields.

``JSONValue`` is what ``json.loads`` can return; ``JSONObject`` a JSON object. Records that carry such data type
their fields with these, never ``Any``: what a field may hold is then checked where it is built."""

from __future__ import annotations

from typing import TypeAlias

JSONScalar: TypeAlias = "str | int | float | bool | None"
JSONValue: TypeAlias = "JSONScalar | list[JSONValue] | dict[str, JSONValue]"
JSONObject: TypeAlias = "dict[str, JSONValue]"

__all__ = ["JSONObject", "JSONScalar", "JSONValue"]
