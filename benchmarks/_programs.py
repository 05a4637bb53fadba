"""Per-program sandbox results cached on disk, so that benchmark reruns take seconds.

A result is keyed by (SHA-256 of the answer text, the spec's digest, and the probe
inputs' digest when the run records behaviour) and stored in
``benchmarks/.cache/programs-<fingerprint>.jsonl``; the fingerprint hashes the sandbox's own
source files, its isolation level and its limits, so a change to any of them starts a fresh
cache instead of reusing verdicts the new sandbox might not give. Every verdict comes from the
real :class:`firstpass.sandbox.Sandbox`; the cache only remembers it.

:class:`CachingSandbox` has the sandbox's ``run`` / ``run_many`` / ``resolve`` interface, so the
real ``Pipeline`` can be driven through it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from firstpass.probe import ProbeInputs
from firstpass.sandbox import Limits, NullVerdict, SampleResult, Sandbox

__all__ = [
    "DEFAULT_CACHE_DIR",
    "CacheStats",
    "CachingSandbox",
    "ProgramCache",
    "probe_digest",
    "result_key",
    "run_all",
    "sandbox_fingerprint",
]

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE_DIR = ROOT / "benchmarks" / ".cache"
#: results kept in memory before they are appended to the cache file
_FLUSH_EVERY = 256


def sandbox_fingerprint(isolation: str, limits: Limits) -> str:
    """A digest of what a verdict depends on besides the program and the spec (blocking)."""
    import firstpass.sandbox as pkg

    h = hashlib.sha256()
    for path in sorted(Path(pkg.__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    h.update(isolation.encode())
    h.update(json.dumps(limits.to_wire(), sort_keys=True).encode())
    return h.hexdigest()[:16]


def probe_digest(probe: ProbeInputs) -> str:
    """What a behaviour depends on besides the program: entry point, calls, per-input limit."""
    body = json.dumps([probe.digest, probe.per_input_s], separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def result_key(answer: str, spec: Any, probe: ProbeInputs | None = None) -> str:
    """The cache key of one (answer, spec) pair, and of the probe inputs when there are any.

    Without probe inputs the key is what it always was, so existing caches stay valid.
    """
    key = hashlib.sha256(answer.encode()).hexdigest() + ":" + str(spec.digest)
    return key if probe is None else f"{key}:probe:{probe_digest(probe)}"


def _compact(result: SampleResult) -> dict[str, Any]:
    return {
        "passed": result.passed,
        "n_passed": result.n_passed,
        "n_total": result.n_total,
        "category": result.category,
        "isolation": result.isolation,
        "wall_ms": round(result.wall_ms, 3),
        "extraction": result.extraction,
        "code_sha256": result.code_sha256,
        **({"behaviour": result.behaviour} if result.behaviour is not None else {}),
    }


def _expand(data: dict[str, Any]) -> SampleResult:
    """A ``SampleResult`` from its cached summary (per-test details and per-input probe output
    digests are not kept; the behaviour digest is)."""
    return SampleResult(
        passed=bool(data["passed"]),
        n_passed=int(data["n_passed"]),
        n_total=int(data["n_total"]),
        category=data["category"],
        isolation=str(data["isolation"]),
        tests=(),
        wall_ms=float(data["wall_ms"]),
        extraction=str(data["extraction"]),
        code_sha256=str(data["code_sha256"]),
        behaviour=data.get("behaviour"),
    )


@dataclass(kw_only=True)
class CacheStats:
    """How many lookups the cache answered and how many ran in the sandbox."""

    hits: int = 0
    misses: int = 0
    sandbox_s: float = 0.0


class ProgramCache:
    """An append-only JSONL of results for one sandbox fingerprint (I/O runs off the loop)."""

    def __init__(self, directory: Path, fingerprint: str) -> None:
        self.path = Path(directory) / f"programs-{fingerprint}.jsonl"
        self._data: dict[str, dict[str, Any]] = {}
        self._pending: list[str] = []
        self._lock = asyncio.Lock()

    async def load(self) -> int:
        """Read the file if it exists; returns how many results it holds."""
        self._data = await asyncio.to_thread(self._read)
        return len(self._data)

    def _read(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return out
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a torn last line after a crash: ignore it
                    continue
                out[row.pop("k")] = row
        return out

    def get(self, key: str) -> SampleResult | None:
        data = self._data.get(key)
        return _expand(data) if data is not None else None

    async def put(self, key: str, result: SampleResult) -> None:
        data = _compact(result)
        self._data[key] = data
        self._pending.append(json.dumps({"k": key, **data}, separators=(",", ":")))
        if len(self._pending) >= _FLUSH_EVERY:
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            lines, self._pending = self._pending, []
            if lines:
                await asyncio.to_thread(self._append, lines)

    def _append(self, lines: list[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


class CachingSandbox:
    """A started :class:`Sandbox` behind a :class:`ProgramCache`, with the sandbox's interface.

    ``async with CachingSandbox(isolation=..., cache_dir=...) as sb`` starts both; ``use_cache
    = False`` runs everything in the sandbox (for wall-time measurements) and still records.
    """

    def __init__(
        self,
        *,
        isolation: str = "auto",
        concurrency: int | None = None,
        limits: Limits | None = None,
        cache_dir: Path = DEFAULT_CACHE_DIR,
        use_cache: bool = True,
    ) -> None:
        self.sandbox = Sandbox(concurrency=concurrency, limits=limits, isolation=isolation)
        self.cache_dir = Path(cache_dir)
        self.use_cache = use_cache
        self.cache: ProgramCache | None = None
        self.stats = CacheStats()
        self.fingerprint = ""
        self._inflight: dict[str, asyncio.Future[SampleResult]] = {}

    async def __aenter__(self) -> CachingSandbox:
        await self.sandbox.start()
        fp = await asyncio.to_thread(
            sandbox_fingerprint, self.sandbox.isolation, self.sandbox.limits
        )
        self.fingerprint = fp
        self.cache = ProgramCache(self.cache_dir, fp)
        await self.cache.load()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.cache is not None:
            await self.cache.flush()
        await self.sandbox.aclose()

    @property
    def isolation(self) -> str:
        return self.sandbox.isolation

    @property
    def concurrency(self) -> int:
        return self.sandbox.concurrency

    async def resolve(self, spec: Any, limits: Limits | None = None) -> Any:
        return await self.sandbox.resolve(spec, limits)

    async def run(
        self,
        answer: str,
        spec: Any,
        limits: Limits | None = None,
        entry_point: str | None = None,
        *,
        probe: ProbeInputs | None = None,
    ) -> SampleResult:
        """The cached verdict, else the sandbox's (one sandbox run per key, even if concurrent).

        With ``probe`` the sandbox also records the behaviour on the probe inputs, and the key
        includes their digest.
        """
        assert self.cache is not None, "use 'async with CachingSandbox() as sb'"
        key = result_key(answer, spec, probe)
        if self.use_cache:
            hit = self.cache.get(key)
            if hit is not None:
                self.stats.hits += 1
                return hit
            running = self._inflight.get(key)
            if running is not None:
                self.stats.hits += 1
                return await asyncio.shield(running)
        fut: asyncio.Future[SampleResult] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        self.stats.misses += 1
        t0 = time.perf_counter()
        try:
            if probe is None:
                result = await self.sandbox.run(answer, spec, limits, entry_point)
            else:
                result = await self.sandbox.run(answer, spec, limits, entry_point, probe=probe)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            self._inflight.pop(key, None)
            self.stats.sandbox_s += time.perf_counter() - t0
        fut.set_result(result)
        await self.cache.put(key, result)
        return result

    async def run_many(
        self,
        answers: Sequence[str],
        spec: Any,
        limits: Limits | None = None,
        entry_point: str | None = None,
        *,
        probe: ProbeInputs | None = None,
    ) -> list[SampleResult]:
        return list(
            await asyncio.gather(
                *(self.run(a, spec, limits, entry_point, probe=probe) for a in answers)
            )
        )

    async def null_passes(self, spec: Any, limits: Limits | None = None) -> NullVerdict | None:
        """The sandbox's verdict on the spec's null answers (not cached: it is per spec)."""
        return await self.sandbox.null_passes(spec, limits)


async def run_all(
    sandbox: CachingSandbox,
    jobs: Sequence[tuple[str, Any]] | Sequence[tuple[str, Any, ProbeInputs | None]],
    *,
    progress: Callable[[int, int], None] | None = None,
) -> list[SampleResult]:
    """Run (answer, spec) or (answer, spec, probe) jobs, a bounded number at a time; results in
    input order."""
    limit = asyncio.Semaphore(max(2, 2 * sandbox.concurrency))
    done = 0

    async def one(answer: str, spec: Any, probe: ProbeInputs | None) -> SampleResult:
        nonlocal done
        async with limit:
            result = await sandbox.run(answer, spec, probe=probe)
        done += 1
        if progress is not None:
            progress(done, len(jobs))
        return result

    return list(
        await asyncio.gather(
            *(one(job[0], job[1], job[2] if len(job) > 2 else None) for job in jobs)
        )
    )
