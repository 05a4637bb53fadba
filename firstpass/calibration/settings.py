"""What a calibration is asked for, validated before any data is read.

Kept apart from ``firstpass.calibration.fit`` (which imports scipy) so that the command line can
check its flags, and start reading a large log, before paying for the statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

from firstpass.errors import CalibrationError

__all__ = ["METHODS", "Settings"]

#: threshold rules: Learn then Test (high-probability bound), conformal risk control (expectation)
METHODS = ("ltt", "crc")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """What to calibrate for; validated on construction (``CalibrationError`` names the flag)."""

    method: str = "ltt"
    alpha: float = 0.05
    delta: float = 0.05
    holdout: float | None = None
    seed: int = 0
    escalate_at: int = 0
    by_route: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise CalibrationError(
                f"unknown method {self.method!r}: use one of {', '.join(METHODS)}"
            )
        for name in ("alpha", "delta"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 < float(value) < 1.0:
                raise CalibrationError(f"--{name} must be strictly between 0 and 1, got {value!r}")
        if self.holdout is not None and not 0.0 < self.holdout < 1.0:
            raise CalibrationError(
                f"--holdout must be a fraction strictly between 0 and 1, got {self.holdout!r}"
            )
        if not isinstance(self.seed, int) or self.seed < 0:
            raise CalibrationError(f"--seed must be an integer >= 0, got {self.seed!r}")
        if self.escalate_at < -1:
            raise CalibrationError(f"--escalate-at must be >= -1, got {self.escalate_at!r}")
