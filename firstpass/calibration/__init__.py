"""Calibrate the elastic threshold λ from labelled probe outcomes, with a stated guarantee.

    data    = read_study("study.jsonl")                # or read_receipts([...])
    result  = calibrate(data, Settings(alpha=0.05, delta=0.05))
    doc     = to_json_dict(result)                     # the calibration JSON
    print(toml_block(result, out_path="calibration.json"))

The statistics live in ``firstpass.calibration.stats`` (pure functions, each naming its bound
and source). Names are imported on first use so that ``firstpass --help`` does not pay for numpy
and scipy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from firstpass.calibration.data import Labelled, Source, read_receipts, read_study
    from firstpass.calibration.fit import Calibration, Fit, HoldoutReport, LevelResult, calibrate
    from firstpass.calibration.report import text_report, to_json_dict, toml_block
    from firstpass.calibration.settings import Settings

__all__ = [
    "Calibration",
    "Fit",
    "HoldoutReport",
    "Labelled",
    "LevelResult",
    "Settings",
    "Source",
    "calibrate",
    "read_receipts",
    "read_study",
    "text_report",
    "to_json_dict",
    "toml_block",
]

_HOME = {
    "Labelled": "data",
    "Source": "data",
    "read_receipts": "data",
    "read_study": "data",
    "Calibration": "fit",
    "Fit": "fit",
    "HoldoutReport": "fit",
    "LevelResult": "fit",
    "Settings": "settings",
    "calibrate": "fit",
    "text_report": "report",
    "to_json_dict": "report",
    "toml_block": "report",
}


def __getattr__(name: str) -> object:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'firstpass.calibration' has no attribute {name!r}")
    return getattr(importlib.import_module(f"firstpass.calibration.{module}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
