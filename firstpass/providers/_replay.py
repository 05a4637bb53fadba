"""Replay recorded samples as if a model had just produced them: offline runs, the demo, benchmarks.

A *sample set* is JSONL, one row per (model, task)::

    {"task_id": "Mbpp/2", "model": "qwen-7b", "samples": ["def f(): ...", "..."],
     "prompt_sha256": "<hex>", "input_tokens": 212, "output_tokens": [80, 95]}

``task_id`` (string or integer) or ``prompt_sha256`` (hex, ``sha256:`` prefix allowed) must be
present; ``input_tokens`` and ``output_tokens`` are optional, each an integer for every sample of
the row or a list with one per sample. ``.jsonl.gz`` files are read through gzip.

A request finds its row by ``request_key`` (the server passes ``firstpass.task_id``) as a task id,
else by :func:`~firstpass.providers.prompt_sha256` of its body. Draws are without replacement
from a seeded permutation per (seed, model, row); when a row is used up a fresh permutation
starts, so a call for more samples than the row holds repeats some. The file is read off the
event loop at :meth:`ReplayProvider.start` (or the first request).
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from firstpass.errors import ConfigError, UpstreamError
from firstpass.providers._base import Completion
from firstpass.providers._prompt import message_text, prompt_sha256

if TYPE_CHECKING:
    from firstpass.config import ProviderConfig

__all__ = ["ReplayProvider", "SampleRow", "SampleSet", "estimate_tokens", "load_sample_set"]

#: key path for errors about the sample file (the config names the provider in the message)
_KEY_PATH = "provider.samples"


def estimate_tokens(text: str) -> int:
    """A deterministic token estimate when the file gives none: 4 characters a token, at least 1."""
    return max(1, len(text) // 4)


@dataclass(frozen=True, kw_only=True)
class SampleRow:
    """The recorded samples for one (model, task), with token counts resolved per sample."""

    model: str
    task_id: str | None
    prompt_sha256: str | None
    samples: tuple[str, ...]
    input_tokens: tuple[int | None, ...]
    output_tokens: tuple[int, ...]
    line: int

    @property
    def key(self) -> str:
        """The row's identity for draw state: its task id, else its prompt hash."""
        return (
            f"task:{self.task_id}" if self.task_id is not None else f"prompt:{self.prompt_sha256}"
        )


@dataclass(frozen=True, kw_only=True)
class SampleSet:
    """A loaded sample file, indexed by (model, task id) and (model, prompt hash)."""

    path: Path
    by_task: Mapping[tuple[str, str], SampleRow]
    by_prompt: Mapping[tuple[str, str], SampleRow]
    models: frozenset[str]

    def find(self, model: str, task_id: str | None, prompt_hash: str | None) -> SampleRow | None:
        """The row for ``task_id`` if given and present, else for ``prompt_hash``."""
        if task_id is not None and (row := self.by_task.get((model, task_id))) is not None:
            return row
        if prompt_hash is not None:
            return self.by_prompt.get((model, prompt_hash))
        return None


def _tokens(value: object, count: int, name: str, where: str) -> tuple[int | None, ...]:
    """A per-sample token tuple from an integer, a list, or nothing."""
    if value is None:
        return (None,) * count
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return (value,) * count
    if (
        isinstance(value, list)
        and len(value) == count
        and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
    ):
        return tuple(value)
    raise ConfigError(
        _KEY_PATH,
        f"{where}: `{name}` must be a non-negative integer or a list of {count} of them",
    )


def _normalise_hash(value: str) -> str:
    text = value.strip().lower()
    return text.removeprefix("sha256:")


def _parse_row(obj: object, where: str, line: int) -> SampleRow:
    if not isinstance(obj, dict):
        raise ConfigError(_KEY_PATH, f"{where}: expected a JSON object")
    model = obj.get("model")
    if not isinstance(model, str) or not model:
        raise ConfigError(_KEY_PATH, f"{where}: `model` must be a non-empty string")
    samples = obj.get("samples")
    if not isinstance(samples, list) or not samples or not all(isinstance(s, str) for s in samples):
        raise ConfigError(_KEY_PATH, f"{where}: `samples` must be a non-empty list of strings")
    task_id = obj.get("task_id")
    if isinstance(task_id, bool) or not isinstance(task_id, str | int | None):
        raise ConfigError(_KEY_PATH, f"{where}: `task_id` must be a string or an integer")
    digest = obj.get("prompt_sha256")
    if digest is not None and not isinstance(digest, str):
        raise ConfigError(_KEY_PATH, f"{where}: `prompt_sha256` must be a hex string")
    if task_id is None and digest is None:
        raise ConfigError(_KEY_PATH, f"{where}: needs `task_id` or `prompt_sha256`")
    count = len(samples)
    output = _tokens(obj.get("output_tokens"), count, "output_tokens", where)
    return SampleRow(
        model=model,
        task_id=str(task_id) if task_id is not None else None,
        prompt_sha256=_normalise_hash(digest) if digest is not None else None,
        samples=tuple(samples),
        input_tokens=_tokens(obj.get("input_tokens"), count, "input_tokens", where),
        output_tokens=tuple(
            given if given is not None else estimate_tokens(text)
            for given, text in zip(output, samples, strict=True)
        ),
        line=line,
    )


def load_sample_set(path: Path) -> SampleSet:
    """Read and index a sample-set JSONL (blocking: call it off the event loop).

    Raises ``ConfigError`` naming the file and line for anything malformed, including the same
    (model, task id) twice. A prompt hash seen twice for one model keeps its first row.
    """
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8") as handle:
            text = handle.read()
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
        raise ConfigError(_KEY_PATH, f"{path} is not UTF-8 JSONL: {exc}") from exc
    except OSError as exc:
        raise ConfigError(_KEY_PATH, f"cannot read sample set {path}: {exc}") from exc
    by_task: dict[tuple[str, str], SampleRow] = {}
    by_prompt: dict[tuple[str, str], SampleRow] = {}
    # split on "\n" only: str.splitlines() would also split inside JSON strings holding raw
    # U+2028 or U+0085, which json.dumps(ensure_ascii=False) writes unescaped
    for line_no, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path} line {line_no}"
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ConfigError(_KEY_PATH, f"{where}: not JSON ({exc})") from exc
        row = _parse_row(obj, where, line_no)
        if row.task_id is not None:
            earlier = by_task.get((row.model, row.task_id))
            if earlier is not None:
                raise ConfigError(
                    _KEY_PATH,
                    f"{where}: model {row.model!r} task {row.task_id!r} "
                    f"already given on line {earlier.line}",
                )
            by_task[(row.model, row.task_id)] = row
        if row.prompt_sha256 is not None:
            by_prompt.setdefault((row.model, row.prompt_sha256), row)
    models = frozenset(m for m, _ in by_task) | frozenset(m for m, _ in by_prompt)
    return SampleSet(path=path, by_task=by_task, by_prompt=by_prompt, models=models)


@dataclass(kw_only=True)
class _Cycle:
    """Draw state of one (model, row): a seeded RNG and the current permutation."""

    rng: random.Random
    size: int
    order: list[int] = field(default_factory=list)
    pos: int = 0

    def take(self) -> int:
        if self.pos >= len(self.order):
            self.order = self.rng.sample(range(self.size), self.size)
            self.pos = 0
        index = self.order[self.pos]
        self.pos += 1
        return index


def _cycle_seed(seed: int, model: str, key: str) -> int:
    """A seed stable across processes (unlike ``hash()``) for one (seed, model, row)."""
    digest = hashlib.sha256(f"{seed}\x00{model}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _estimate_prompt_tokens(body: Mapping[str, object]) -> int:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return 1
    text = "".join(message_text(m.get("content")) for m in messages if isinstance(m, Mapping))
    return estimate_tokens(text)


class ReplayProvider:
    """Serves recorded samples from a sample-set JSONL; no network, latency 0."""

    def __init__(self, cfg: ProviderConfig) -> None:
        if cfg.samples is None:
            raise ConfigError(_KEY_PATH, f"provider {cfg.id!r}: required for kind 'replay'")
        self._cfg = cfg
        self._path = Path(cfg.samples)
        self._set: SampleSet | None = None
        self._lock = asyncio.Lock()
        self._cycles: dict[tuple[str, str], _Cycle] = {}

    @property
    def id(self) -> str:
        return self._cfg.id

    @property
    def honours_n(self) -> bool:
        return self._cfg.honours_n

    @property
    def sample_set(self) -> SampleSet:
        """The loaded file (after :meth:`start`)."""
        if self._set is None:
            raise RuntimeError("ReplayProvider.start() has not run")
        return self._set

    async def start(self) -> None:
        """Read and index the sample file in a worker thread, once."""
        if self._set is not None:
            return
        async with self._lock:
            if self._set is None:
                self._set = await asyncio.to_thread(load_sample_set, self._path)

    async def aclose(self) -> None:
        """Nothing to release."""

    async def complete(
        self,
        model: str,
        body: Mapping[str, object],
        *,
        n: int = 1,
        request_key: str | None = None,
    ) -> Completion:
        """``n`` recorded samples for this request, drawn without replacement.

        With ``honours_n = false`` the result is accounted as ``n`` calls (prompt tokens ``n``
        times), as the HTTP client would be; the draws are the same either way.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if self._set is None:
            await self.start()
        sample_set = self.sample_set
        digest = prompt_sha256(body)
        row = sample_set.find(model, request_key, digest)
        if row is None:
            raise UpstreamError(
                self._missing_message(model, request_key, digest),
                provider=self.id,
                status=404,
                attempts=1,
            )
        cycle = self._cycles.get((model, row.key))
        if cycle is None:
            cycle = _Cycle(
                rng=random.Random(_cycle_seed(self._cfg.seed, model, row.key)),
                size=len(row.samples),
            )
            self._cycles[(model, row.key)] = cycle
        drawn = [cycle.take() for _ in range(n)]
        calls = 1 if (n == 1 or self.honours_n) else n
        per_call_input = [row.input_tokens[i] for i in drawn[:calls]]
        estimate = _estimate_prompt_tokens(body)
        return Completion(
            texts=tuple(row.samples[i] for i in drawn),
            finish_reasons=("stop",) * n,
            input_tokens=sum(t if t is not None else estimate for t in per_call_input),
            output_tokens=sum(row.output_tokens[i] for i in drawn),
            latency_ms=0.0,
            attempts=calls,
            status=200,
            calls=calls,
            model=model,
            raw=None,
        )

    def _missing_message(self, model: str, task_id: str | None, digest: str | None) -> str:
        sample_set = self.sample_set
        where = f"replay provider {self.id!r} ({sample_set.path})"
        if model not in sample_set.models:
            known = ", ".join(sorted(sample_set.models)) or "none"
            return f"{where}: no samples for model {model!r} (models in the file: {known})"
        tried = []
        if task_id is not None:
            tried.append(f"task_id {task_id!r}")
        tried.append(f"prompt_sha256 {digest}" if digest else "no user message to hash")
        return (
            f"{where}: no samples for model {model!r} with {' or '.join(tried)}. "
            "A replay upstream answers only what it recorded: send a recorded prompt verbatim "
            'or name a recorded task in the request, "firstpass": {"task_id": ...}'
            f"{_known_tasks(sample_set, model)}"
        )


#: how many task ids a "no samples" message lists before it says how many more there are
_LISTED_TASKS = 12


def _known_tasks(sample_set: SampleSet, model: str) -> str:
    """`` (task ids for 'm': a, b, ...)`` for the message, or nothing when rows have none."""
    ids = sorted({t for m, t in sample_set.by_task if m == model}, key=_natural_key)
    if not ids:
        return ""
    shown = ", ".join(ids[:_LISTED_TASKS])
    more = f", … ({len(ids)} in all)" if len(ids) > _LISTED_TASKS else ""
    return f" (task ids for {model!r}: {shown}{more})"


def _natural_key(text: str) -> list[tuple[int, int | str]]:
    """Sort "demo/2" before "demo/10": digit runs compare as numbers."""
    parts = re.split(r"(\d+)", text)  # the digit runs are at the odd indices
    return [(0, int(p)) if i % 2 else (1, p) for i, p in enumerate(parts) if p]
