"""The whole loop under its own guarantee: shadow → ``firstpass calibrate`` → enforce.

Each repetition runs the real server: a shadow run on calibration traffic, the CLI's certificate
from its receipts, then an enforce run on fresh traffic citing that file. The requests go over
plain HTTP on kept-alive connections (the openai SDK, whose drop-in use other tests cover, cost
two to three times the CPU of each of these ~3,500 requests; with more of them, the test took
6-22 minutes under load). The upstream draws each request's k samples from a known mixture of
task types (a sample is correct, plausible-but-wrong, or visibly wrong), and the sandbox is a
table that reads the kind off the answer, so the true served-failure rate among skips at any λ is
known exactly.

At α = δ = 0.1 the mixture makes λ = 1 (5/5) safe (true rate 0.074) and λ = 0.8 unsafe (0.109):
a calibration that ignored δ, pooled levels, or used labels of another sample would certify 0.8
and fail the check. Learn-then-Test promises that the certified λ is safe in at least 1 − δ of
repetitions; the test asserts that share, that certificates were issued (it is not vacuous),
and that the realized failure rate among skips in the enforce runs stays near α.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Any

import pytest

from firstpass.cli import main as firstpass_main
from firstpass.errors import ConfigError
from firstpass.receipts import sha256_text
from firstpass.sandbox._spec import CasesSpec
from tests.add_task import GOOD, TESTS
from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

K = 5
ALPHA = DELTA = 0.1
#: (share of traffic, P(sample correct), P(sample passes visible but fails the gate))
TYPES = ((0.6, 0.95, 0.03), (0.3, 0.55, 0.25), (0.1, 0.10, 0.20))
#: 5 repetitions (4 of them certify): each costs ~2 s of CPU, and the test must finish well
#: inside its timeout at load 30; the enforce runs only measure the realized rate among skips,
#: pooled (~65 skips a run at λ = 1): 100 requests a run keep its 2-SE bound under 0.14
REPS, N_CAL, N_ENFORCE = 5, 600, 100


def true_rate_among_skips(lam: float) -> float:
    """P(the served candidate fails the gate | the probe skips the gate at λ), exactly."""
    m = max(1, round(lam * K))
    skip = fail = 0.0
    for share, ok, plausible in TYPES:
        v = ok + plausible
        p_skip = sum(comb(K, c) * v**c * (1 - v) ** (K - c) for c in range(m, K + 1))
        skip += share * p_skip
        fail += share * p_skip * plausible / v  # the candidate is a visible-passing sample
    return fail / skip


def test_the_mixture_makes_one_level_safe_and_the_next_unsafe() -> None:
    """The premise of the simulation: 5/5 is within α, 4/5 is not."""
    assert true_rate_among_skips(1.0) < ALPHA < true_rate_among_skips(0.8)


class TableSandbox:
    """Verdicts read off the answer: ``#bad`` fails the visible tests, ``#plausible`` passes
    them and fails the gate, anything else (the strong model's answer) passes both."""

    async def __aenter__(self) -> TableSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def run(self, text: str, spec: Any, **_: Any) -> Any:
        hidden = isinstance(spec, CasesSpec)
        ok = "#bad" not in text and not (hidden and "#plausible" in text)
        return _Result(passed=ok, n_passed=int(ok), code_sha256=str(hash(text)))

    async def run_many(self, texts: list[str], spec: Any, **kw: Any) -> list[Any]:
        return [await self.run(t, spec, **kw) for t in texts]

    async def null_passes(self, spec: Any) -> str | None:
        return None  # the simulated visible tests carry signal: no null answer passes them


@dataclass(frozen=True)
class _Result:
    passed: bool
    n_passed: int
    code_sha256: str
    n_total: int = 1
    category: str | None = None
    isolation: str = "table"
    wall_ms: float = 0.0
    behaviour: str | None = None


class Traffic:
    """Draws each request's task type, then its k i.i.d. samples."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.serial = itertools.count()
        self.kinds: dict[str, str] = {}  # answer_sha256 → kind, to judge what was served

    def sample(self, ok: float, plausible: float) -> str:
        u = self.rng.random()
        kind = "ok" if u < ok else "plausible" if u < ok + plausible else "bad"
        text = f"```python\ndef add(a, b):\n    return a + b  #{kind} {next(self.serial)}\n```"
        self.kinds[sha256_text(text)] = kind
        return text

    def responder(self, body: dict[str, Any]) -> Reply | None:
        if body.get("model") != CHEAP:
            return Reply.ok(GOOD)
        _, ok, plausible = self.rng.choices(TYPES, weights=[t[0] for t in TYPES])[0]
        return Reply.ok(*(self.sample(ok, plausible) for _ in range(int(body.get("n") or 1))))


def _send(stack: Any, n: int) -> None:
    """``n`` chat requests from 4 threads, each on its own kept-alive connection; each a 200."""
    url = urllib.parse.urlsplit(stack.base_url)
    body = json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "write add"}],
            "firstpass": TESTS,
        }
    )
    local = threading.local()
    opened: list[http.client.HTTPConnection] = []

    def one(_: int) -> None:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
            opened.append(conn)
        conn.request(
            "POST", url.path + "/chat/completions", body, {"Content-Type": "application/json"}
        )
        reply = conn.getresponse()
        text = reply.read()
        assert reply.status == 200, text[:500]

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(one, range(n)))
    finally:
        for conn in opened:
            conn.close()


def _rep(live_stack: Any, tmp_path: Path, rep: int) -> tuple[float | None, int, int]:
    """One repetition: (certified λ or None, skipped requests, failures among them)."""
    shadow = live_stack(
        elastic={"k": K, "escalate_at": 0, "mode": "shadow"},
        sandbox_factory=lambda _c: TableSandbox(),
        timeout_s=60.0,  # the stub answers at once: only a loaded machine is slow
    )
    shadow.stub.responder = Traffic(seed=2 * rep).responder
    _send(shadow, N_CAL)
    shadow.flush()
    cal = tmp_path / f"calibration-{rep}.json"
    argv = ["calibrate", "--receipts", str(shadow.receipts), "--alpha", str(ALPHA)]
    argv += ["--delta", str(DELTA), "--out", str(cal)]
    assert firstpass_main(argv) == 0
    doc = json.loads(cal.read_text())
    if not doc["certificates"]:
        return None, 0, 0
    (cert,) = doc["certificates"]
    assert (cert["route"], cert["rung"], cert["k"], cert["score"]) == ("code", 0, K, "pass_share")
    block = {"k": K, "escalate_at": 0, "mode": "enforce", "calibration": str(cal)}
    try:
        # the same upstream the shadow receipts were drawn from: a certificate is bound to it
        enforce = live_stack(
            elastic=block,
            sandbox_factory=lambda _c: TableSandbox(),
            upstream=shadow.stub.url,
            timeout_s=60.0,
        )
    except ConfigError as exc:  # pragma: no cover - a certificate must be usable as written
        pytest.fail(f"the certificate calibrate wrote was refused: {exc}")
    traffic = Traffic(seed=2 * rep + 1)
    shadow.stub.responder = traffic.responder
    _send(enforce, N_ENFORCE)
    skipped = fails = 0
    for receipt in enforce.receipts_list():
        served = receipt["served"]
        if served and served["verification"] == "gate_skipped":
            skipped += 1
            assert receipt["probe"]["certificate"] == doc["id"]
            fails += traffic.kinds[served["answer_sha256"]] == "plausible"
        elif served:  # everything else served went through the gate (or is the strong answer)
            assert traffic.kinds.get(served["answer_sha256"]) != "plausible"
    return cert["lambda"], skipped, fails


@pytest.mark.timeout(600)  # ~8 s of CPU alone: a few minutes on a machine at load 30
@pytest.mark.e2e
@pytest.mark.slow
def test_enforcing_what_calibrate_certified_keeps_served_failure_among_skips_within_alpha(
    live_stack: Any, tmp_path: Path
) -> None:
    """In at least 1 − δ of repetitions the certified λ has a true failure rate among skips
    ≤ α, certificates are issued, and the enforce runs' realized rate among skips is near α."""
    results = [_rep(live_stack, tmp_path, rep) for rep in range(REPS)]
    print("repetitions (λ, skipped, failures):", results)
    certified = [lam for lam, _, _ in results if lam is not None]
    assert len(certified) >= REPS // 2, f"too few certificates to test anything: {results}"
    unsafe = [lam for lam in certified if true_rate_among_skips(lam) > ALPHA]
    assert len(unsafe) <= DELTA * REPS, f"certified unsafe levels: {unsafe}"
    skipped = sum(s for _, s, _ in results)
    fails = sum(f for _, _, f in results)
    assert skipped > 0
    # realized: the pooled rate among skips, within two binomial standard errors of α
    assert fails / skipped <= ALPHA + 2 * (ALPHA * (1 - ALPHA) / skipped) ** 0.5, (fails, skipped)


def test_a_threshold_chosen_without_confidence_would_fail_this_check() -> None:
    """The check above can fail: picking the loosest level whose observed failure rate among
    skips is ≤ α (no δ) on the same amount of shadow data certifies an unsafe level far more
    often than δ allows."""
    rng = random.Random(7)
    unsafe = 0
    trials = 200
    for _ in range(trials):
        rows = []  # (pass count, candidate fails the gate)
        for _ in range(N_CAL):
            _, ok, plausible = rng.choices(TYPES, weights=[t[0] for t in TYPES])[0]
            kinds = [rng.random() for _ in range(K)]
            passing = [u for u in kinds if u < ok + plausible]
            c = len(passing)
            rows.append((c, bool(passing) and passing[0] >= ok))
        chosen = None
        for m in range(K, 0, -1):  # strictest first, stop at the first level that looks bad
            skipped = [fail for c, fail in rows if c >= m]
            if skipped and sum(skipped) / len(skipped) <= ALPHA:
                chosen = m / K
            else:
                break
        unsafe += chosen is not None and true_rate_among_skips(chosen) > ALPHA
    assert unsafe / trials > DELTA, unsafe
