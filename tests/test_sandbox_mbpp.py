"""Correctness on real data: MBPP+ canonical solutions pass, broken variants fail as they should."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from firstpass.sandbox import CasesSpec, Limits, Sandbox, parse_spec
from tests.sandbox_helpers import data_dir

pytestmark = [pytest.mark.data, pytest.mark.slow]  # every MBPP+ task in the sandbox

MBPPPLUS = data_dir() / "mbppplus" / "MbppPlus.jsonl.gz"
#: NOTES.md: the reference raises, returns re.Match or depends on set order; and (measured
#: here) 164/295 fail their own asserts, 603 is too slow for a test, 793 has dict inputs
ODD = {2, 106, 124, 164, 252, 295, 579, 580, 603, 720, 737, 769, 787, 793, 794}
N_TASKS = 30


def _tasks() -> list[dict[str, Any]]:
    if not MBPPPLUS.exists():
        pytest.skip(
            f"MBPP+ data not found at {MBPPPLUS}: set FIRSTPASS_DATA to the shared data dir"
        )
    rows = []
    with gzip.open(MBPPPLUS, "rt", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if int(row["task_id"].split("/")[1]) not in ODD:
                rows.append(row)
    return rows[:: max(1, len(rows) // N_TASKS)][:N_TASKS]


def _broken(row: dict[str, Any]) -> str:
    """The canonical solution, wrapped so that outside calls get a wrong answer.

    The wrapped function gets its own copy of the globals in which its name is itself, so
    recursive solutions keep working inside.
    """
    ep = row["entry_point"]
    solution: str = row["canonical_solution"]
    return solution + (
        "\nimport types as _types\n_g = dict(globals())\n"
        f"_real = _types.FunctionType({ep}.__code__, _g, '{ep}', "
        f"{ep}.__defaults__, {ep}.__closure__)\n_g['{ep}'] = _real\n"
        f"def {ep}(*args):\n    return ['broken', _real(*args)]\n"
    )


@pytest.fixture(scope="module")
def tasks() -> list[dict[str, Any]]:
    return _tasks()


@pytest.fixture
async def sb() -> AsyncIterator[Sandbox]:
    # generous: slow reference solutions and a loaded CI machine must not turn into timeouts
    async with Sandbox(limits=Limits(cpu_s=20, wall_s=60)) as sandbox:
        yield sandbox


async def test_canonical_passes_base_and_plus_inputs_and_broken_fails(
    sb: Sandbox, tasks: list[dict[str, Any]]
) -> None:
    """Each canonical solution passes its base+plus inputs; the broken variant is wrong_output."""
    assert len(tasks) == N_TASKS

    async def check(row: dict[str, Any]) -> None:
        inputs = row["base_input"] + row["plus_input"]
        spec = parse_spec(
            {
                "entry_point": row["entry_point"],
                "reference": row["canonical_solution"],
                "atol": row["atol"] or 0,
                "cases": [{"args": a} for a in inputs],
            }
        )
        assert isinstance(spec, CasesSpec)
        resolved = await sb.resolve(spec)
        assert resolved.n_tests >= len(inputs) * 0.9, (row["task_id"], resolved.dropped)
        good, bad = await sb.run_many([row["canonical_solution"], _broken(row)], resolved)
        assert good.passed, (row["task_id"], good.tests)
        assert (bad.passed, bad.category) == (False, "wrong_output"), row["task_id"]

    await asyncio.gather(*(check(row) for row in tasks))


async def test_canonical_passes_its_asserts_and_broken_fails_them(
    sb: Sandbox, tasks: list[dict[str, Any]]
) -> None:
    """Each canonical solution passes MBPP+'s assert lines; the broken variant fails them."""

    async def check(row: dict[str, Any]) -> None:
        lines = row["assertion"].splitlines()
        spec = parse_spec(
            {
                "asserts": [ln.strip() for ln in lines if ln.strip().startswith("assert")],
                "setup": "import math",
            }
        )
        good, bad = await sb.run_many([row["canonical_solution"], _broken(row)], spec)
        assert good.passed, (row["task_id"], good.tests)
        assert (bad.passed, bad.category) == (False, "assertion_failed"), (
            row["task_id"],
            bad.tests,
        )

    await asyncio.gather(*(check(row) for row in tasks))
