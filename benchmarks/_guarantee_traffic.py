"""The scripted task stream of ``benchmarks.guarantee_field``: three task kinds, a known mixture.

Every request asks for ``add(a, b)`` (``tests.add_task``: one visible assert, two hidden cases)
and names its serial in the prompt (``[task N]``); the stub upstream draws that task's kind and
its k samples from a generator seeded by (seed, N), so a run's data does not depend on the order
the concurrent requests arrive in. The kinds:

- **easy**: all k samples are correct (pass the visible test and the gate);
- **hard**: all k samples pass the visible test and fail the gate (``return 3``): the would-be
  skip that fails;
- **mixed**: c ~ Uniform{1, ..., k-1} samples pass the visible test, the others fail it; each
  passing sample fails the gate with probability ``plausible`` (the gate regime).

Because a mixed task never reaches k/k, the failure rate among skips at λ = 1 is exactly
``hard / (hard + easy)``; :func:`true_rate_among_skips` gives it at every level.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Literal

from firstpass.receipts import sha256_text
from tests.add_task import GOOD
from tests.server_harness import CHEAP
from tests.stub_upstream import Reply

__all__ = ["Kind", "Mixture", "SampleKind", "Traffic", "prompt", "true_rate_among_skips"]

Kind = Literal["easy", "hard", "mixed"]
SampleKind = Literal["ok", "plausible", "bad"]

_CODE: dict[SampleKind, str] = {
    "ok": "return a + b",
    "plausible": "return 3",  # add(1, 2) == 3 holds; the hidden cases do not
    "bad": "return a - b",
}
_SERIAL = re.compile(r"\[task (\d+)\]")


@dataclass(frozen=True, kw_only=True)
class Mixture:
    """Shares of the task kinds (easy is the rest) and the mixed kind's gate-failure chance."""

    hard: float
    mixed: float = 0.2
    plausible: float = 0.75

    @property
    def easy(self) -> float:
        return 1.0 - self.hard - self.mixed

    def with_rate_at_full_pass(self, rate: float) -> Mixture:
        """The mixture whose failure rate among skips at λ = 1 is exactly ``rate``."""
        return Mixture(hard=rate * (1.0 - self.mixed), mixed=self.mixed, plausible=self.plausible)


def true_rate_among_skips(mix: Mixture, lam: float, k: int) -> float:
    """P(the served candidate fails the gate | the probe skips at λ), exactly, for this stream.

    A mixed task with c passing samples (c uniform on 1..k-1) skips when c ≥ ⌈λk⌉, and its
    candidate (a passing sample) fails with probability ``plausible``.
    """
    need = max(1, round(lam * k))
    mixed_skip = mix.mixed * sum(1 for c in range(1, k) if c >= need) / (k - 1)
    skip = mix.easy + mix.hard + mixed_skip
    return (mix.hard + mixed_skip * mix.plausible) / skip


def prompt(serial: int) -> str:
    """The user message of request ``serial`` (the stub reads the serial back from it)."""
    return f"Write add(a, b). [task {serial}]"


class Traffic:
    """The stub's responder: rung 0 answers from the task's kind, the strong rung correctly.

    ``kinds`` maps each served answer's SHA-256 to its sample kind, to judge what was served.
    """

    def __init__(self, mix: Mixture, *, seed: str, k: int) -> None:
        self.mix = mix
        self.seed = seed
        self.k = k
        self.sample_kinds: dict[str, SampleKind] = {}
        self.task_kinds: dict[int, Kind] = {}

    def task(self, serial: int) -> tuple[Kind, list[str]]:
        """Task ``serial``'s kind and its k sample texts (deterministic in (seed, serial))."""
        rng = random.Random(f"{self.seed}:{serial}:{self.mix}")
        u = rng.random()
        kind: Kind = (
            "hard"
            if u < self.mix.hard
            else "mixed"
            if u < self.mix.hard + self.mix.mixed
            else "easy"
        )
        if kind == "easy":
            kinds: list[SampleKind] = ["ok"] * self.k
        elif kind == "hard":
            kinds = ["plausible"] * self.k
        else:
            c = rng.randint(1, self.k - 1)
            kinds = [
                ("plausible" if rng.random() < self.mix.plausible else "ok") if i < c else "bad"
                for i in range(self.k)
            ]
            rng.shuffle(kinds)
        texts = [self._text(sk, serial, i) for i, sk in enumerate(kinds)]
        self.task_kinds[serial] = kind
        return kind, texts

    def _text(self, kind: SampleKind, serial: int, index: int) -> str:
        text = f"```python\ndef add(a, b):\n    {_CODE[kind]}  # {serial}.{index}\n```"
        self.sample_kinds[sha256_text(text)] = kind
        return text

    def responder(self, body: dict[str, object]) -> Reply | None:
        """Rung 0: the task's k samples (its first ``n``); any other model: a correct answer."""
        if body.get("model") != CHEAP:
            return Reply.ok(GOOD)
        messages = body.get("messages")
        found = _SERIAL.search(str(messages))
        if found is None:
            return Reply.ok(GOOD)
        _, texts = self.task(int(found.group(1)))
        n = body.get("n")
        return Reply.ok(*texts[: n if isinstance(n, int) and n > 0 else 1])

    def served_kind(self, answer_sha256: str) -> SampleKind | None:
        """What a served answer was (None: not a rung-0 sample, i.e. the strong rung's)."""
        return self.sample_kinds.get(answer_sha256)
