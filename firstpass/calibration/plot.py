"""``--plot``: the risk bound and the skip share against λ (matplotlib, an optional extra)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from firstpass.calibration.fit import Calibration
from firstpass.errors import CalibrationError

__all__ = ["plot_calibration"]


def _pyplot() -> ModuleType:
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only; never open a window
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise CalibrationError(
            "--plot needs matplotlib: pip install 'firstpass-verify[plot]'"
        ) from exc
    return plt


def plot_calibration(cal: Calibration, path: Path) -> None:
    """Write a PNG: per level, the bound compared with α and the share of requests skipping the
    gate; α as a line, λ̂ marked. One panel per route with ``--by-route``."""
    plt = _pyplot()
    fits = [cal.overall, *cal.routes]
    fig, axes = plt.subplots(len(fits), 1, figsize=(7, 3.6 * len(fits)), squeeze=False)
    s = cal.settings
    bound_name = "risk bound (1−δ UCB)" if s.method == "ltt" else "CRC bound (m+1)/(N+1)"
    for ax, fit in zip(axes[:, 0], fits, strict=True):
        lams = [lv.lam for lv in fit.levels]
        bounds = [lv.risk_bound for lv in fit.levels]
        ax.plot(
            lams, [lv.skip_share for lv in fit.levels], "o-", color="tab:orange", label="skip share"
        )
        ax.set_ylabel("share of requests skipping the gate")
        ax.set_ylim(0, 1.02)
        risk = ax.twinx()  # the bound lives near α, far below the skip share: its own axis
        risk.plot(lams, bounds, "s-", color="tab:blue", label=bound_name)
        risk.axhline(s.alpha, color="grey", linestyle="--", label=f"α = {s.alpha:g}")
        risk.set_ylabel("risk bound")
        risk.set_ylim(0, min(1.0, max(3 * s.alpha, *(b for b in bounds if b < 1.0), s.alpha) * 1.1))
        if fit.lam is not None:
            ax.axvline(fit.lam, color="green", linestyle=":", label=f"λ̂ = {fit.lam_label}")
        title = "all routes" if fit is cal.overall else f"route {fit.route}"
        guarantee = f"δ = {s.delta:g}" if s.method == "ltt" else "α on P(skip and fail), no δ"
        ax.set_title(f"{title}: {s.method.upper()}, {guarantee}, n = {fit.n}")
        ax.set_xlabel("λ (serve without the gate when score ≥ λ)")
        ax.invert_xaxis()  # strictest on the left, the order levels are tested in
        handles = ax.get_legend_handles_labels()
        extra = risk.get_legend_handles_labels()
        ax.legend(
            handles[0] + extra[0], handles[1] + extra[1], loc="center right", fontsize="small"
        )
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise CalibrationError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        plt.close(fig)
