"""`firstpass demo` runs the real proxy offline and shows every outcome, with a valid chain."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from firstpass.demo.runner import run_demo
from firstpass.receipts import iter_receipts, verify_chain


def test_demo_shows_serve_escalate_and_exhaustion_with_a_verified_chain(tmp_path: Path) -> None:
    """The cascade demo serves cheap answers, escalates, exhausts once, and its chain verifies."""
    out = io.StringIO()
    receipts = tmp_path / "demo.jsonl"
    assert run_demo(receipts=receipts, out=out) == 0
    text = out.getvalue()
    for action in ("served", "escalated", "exhausted_unverified"):
        assert f" {action} " in text
    assert "receipt chain: ok, 12 receipts" in text
    assert verify_chain(receipts).ok
    assert {r["mode"] for r in iter_receipts(receipts)} == {"cascade"}


@pytest.mark.parametrize("mode", ["shadow", "enforce"])
def test_demo_with_the_elastic_policy_prints_each_regime(tmp_path: Path, mode: str) -> None:
    """Shadow shows every regime and labels every receipt; enforce, with no certificate in the
    demo, never skips the gate (0/k escalates at once, the rest is gated)."""
    out = io.StringIO()
    receipts = tmp_path / f"{mode}.jsonl"
    assert run_demo(receipts=receipts, mode=mode, out=out) == 0
    rows: list[dict[str, Any]] = list(iter_receipts(receipts))
    if mode == "shadow":
        assert {r["probe"]["regime"] for r in rows} == {"escalate", "gate", "serve"}
        assert all(r["decision"]["gate_label"] in (True, False) for r in rows)
        assert "elastic would" in out.getvalue()
    else:
        assert {r["probe"]["regime"] for r in rows} == {"escalate", "gate"}
        assert "served_without_gate" not in out.getvalue()
        assert all((r["served"] or {}).get("verification") != "gate_skipped" for r in rows)


def test_a_relative_receipts_path_is_where_the_user_typed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`firstpass demo --receipts shadow.jsonl` writes ./shadow.jsonl, not into the package."""
    monkeypatch.chdir(tmp_path)
    assert run_demo(receipts=Path("shadow.jsonl"), mode="shadow", out=io.StringIO()) == 0
    assert (tmp_path / "shadow.jsonl").stat().st_size > 0
