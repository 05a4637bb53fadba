"""Rows as columns: each chunk of rows becomes one tuple of arrays, with its routes and level
sets interned as small integers (codes) by the reader that owns them."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from firstpass.calibration._rows import pass_share_levels

__all__ = ["Columns", "LevelSets", "Routes", "concat_columns", "rows_to_columns"]

#: what a ``Routes`` interns: a route name (study rows), or a receipt's slice key
#: (``firstpass.calibration._rows.ContextKey``: the route with its context)
K = TypeVar("K", bound=Hashable)


class LevelSets:
    """Interns level sets so each row stores a small integer."""

    def __init__(self) -> None:
        self.sets: list[tuple[float, ...]] = []
        #: ("k", k) for a pass-share level set, ("levels", *levels) for declared ones
        self.index: dict[tuple[str | float, ...], int] = {}

    def for_k(self, k: int) -> int:
        key = ("k", k)
        if key not in self.index:
            self.index[key] = len(self.sets)
            self.sets.append(pass_share_levels(k))
        return self.index[key]

    def for_levels(self, levels: tuple[float, ...]) -> int:
        key: tuple[str | float, ...] = ("levels", *levels)
        if key not in self.index:
            self.index[key] = len(self.sets)
            self.sets.append(tuple(sorted(set(levels))))
        return self.index[key]

    @property
    def has_declared_levels(self) -> bool:
        """Whether any row gave ``score`` + ``levels`` rather than a pass count."""
        return any(key[0] == "levels" for key in self.index)


class Routes(Generic[K]):
    """Interns route names (or slice keys) so each row stores a small integer."""

    def __init__(self) -> None:
        self.names: list[K] = []
        self.index: dict[K, int] = {}

    def code(self, name: K) -> int:
        if name not in self.index:
            self.index[name] = len(self.names)
            self.names.append(name)
        return self.index[name]


#: per chunk: score, failed, k, pass_count, route code, level-set code
Columns = tuple[
    npt.NDArray[np.float64],
    npt.NDArray[np.bool_],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
    npt.NDArray[np.int64],
]


def concat_columns(chunks: Sequence[Columns]) -> Columns:
    """The chunks' columns, each concatenated (chunks in order)."""
    score, failed, k, c, route, level_set = zip(*chunks, strict=True)
    return (
        np.concatenate(score),
        np.concatenate(failed),
        np.concatenate(k),
        np.concatenate(c),
        np.concatenate(route),
        np.concatenate(level_set),
    )


def rows_to_columns(rows: list[tuple[float, bool, int, int, int, int]]) -> Columns:
    arr = np.asarray(rows, dtype=np.float64)
    return (
        arr[:, 0].copy(),
        arr[:, 1].astype(bool),
        arr[:, 2].astype(np.int64),
        arr[:, 3].astype(np.int64),
        arr[:, 4].astype(np.int64),
        arr[:, 5].astype(np.int64),
    )
