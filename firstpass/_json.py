"""JSON as ``json.loads`` (or msgspec) gives it: the one recursive alias for decoded data.

A value read from a JSON document (a receipt line, a calibration file, a request body) is
``JSON`` until it is validated; ``isinstance`` then narrows it to what the code checked
(``dict[str, JSON]``, ``list[JSON]``, ``str``...), never to ``Any``. TOML values are not JSON
(``tomllib`` gives dates and times too): the config loader reads them as ``object``.
Standard library only: the bottom of the import graph, importable from every subpackage.
"""

from __future__ import annotations

from typing import TypeAlias

__all__ = ["JSON", "JSONObject"]

#: any JSON value as Python holds it once decoded
JSON: TypeAlias = bool | int | float | str | list["JSON"] | dict[str, "JSON"] | None
#: a JSON object (what most documents here are at the top)
JSONObject: TypeAlias = dict[str, JSON]
