"""The validated configuration: frozen, keyword-only value objects built once at start.

Nothing here reads files or the environment; ``firstpass.config._build`` does that and hands
these objects out. Every field has the default a user gets when the key is absent from
``firstpass.toml`` (see docs/config.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import socket
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from firstpass.checks import CheckDef, checks_digest
from firstpass.config._certificate import CertificateFile, Licence
from firstpass.errors import ConfigError
from firstpass.sandbox import Limits

FsyncPolicy = Literal["durable", "always", "batch", "never"]
ReceiptSinkKind = Literal["file", "postgresql"]

#: the PostgreSQL sink's spill file bound: past it the server refuses verified traffic (503)
#: until the database is back (docs/database.md, "When the database is away")
SPILL_MAX_BYTES = 256 << 20
#: a replica id: what names its chain in the table and its exported file. Not ending in
#: ``.<digits>``: ``web.000001.jsonl`` would read as a rotated file of ``web.jsonl``
REPLICA_RE = re.compile(r"(?![^\n]*\.[0-9]+$)[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
REPLICA_RULE = (
    "1-128 letters, digits and . _ : @ -, starting with a letter or digit and not ending in "
    "a dot and digits"
)
ProviderKind = Literal["openai", "anthropic", "replay"]
OnExhausted = Literal["unverified", "error"]
#: ``[[provider]] cache_marks``
CacheMarks = Literal["forward", "drop"]
#: what a route does with a turn that ends in tool calls (docs/config.md, ``tool_turns``)
ToolTurns = Literal["pass", "verify"]
OnBudgetExhausted = Literal["serve_best_verified", "error"]
WithoutChecks = Literal["passthrough", "reject", "route_checks"]
ElasticMode = Literal["shadow", "enforce"]
RequestMode = Literal["cascade", "shadow", "enforce", "passthrough"]
#: every mode a request can name (``firstpass.mode`` / ``X-Firstpass-Mode``)
REQUEST_MODES: tuple[str, ...] = ("cascade", "shadow", "enforce", "passthrough")
ProbeScore = Literal["pass_share", "agreement", "unanimous_agreement"]

#: the ``models`` entry that matches any requested model
ANY_MODEL = "*"
#: the largest k (samples per probe) a rung or the elastic block may ask for; OpenAI caps n at 128
MAX_K = 128


@dataclass(frozen=True, kw_only=True)
class ClientKey:
    """One accepted API key (``[[server.client_key]]``, or an entry of ``client_keys_env``,
    named after its variable). Receipts and logs carry ``name``, never ``secret``.

    ``routes``: the routes it may use (None: all); ``daily_usd``: its spend cap per UTC day.
    """

    name: str
    key_env: str
    routes: tuple[str, ...] | None = None
    daily_usd: float | None = None
    secret: str = field(default="", repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """The HTTP listener and its limits; ``client_keys`` are resolved from ``client_keys_env``
    and ``client_key`` (every accepted key, with its name, routes and daily cap)."""

    host: str = "127.0.0.1"
    port: int = 8787
    max_body_bytes: int = 1_048_576
    max_concurrency: int = 256
    client_keys_env: tuple[str, ...] = ()
    client_keys: frozenset[str] = field(default=frozenset(), repr=False)
    #: every accepted key: those of ``client_keys_env`` first, then ``[[server.client_key]]``
    client_key: tuple[ClientKey, ...] = ()
    debug: bool = False
    keepalive_s: float = 5.0
    #: how long a request's body may take to arrive whole; past it, 408 with its receipt.
    #: A request holds no concurrency slot until its body has arrived
    body_read_timeout_s: float = 30.0
    #: how long a connection may go without a whole request head: from connecting, or from its
    #: last response on a kept-alive connection (aiohttp's ``keepalive_timeout``, 3630 s by
    #: default, so clients that never finish their headers held sockets for an hour)
    idle_timeout_s: float = 30.0
    workers: int = 1
    #: one deadline for the whole request (every rung, retry, sandbox run and the gate);
    #: past it the client gets a 504 and the receipt says so
    request_timeout_s: float = 120.0
    #: receipts of served answers the server remembers (by id, whose key, what licence) to
    #: check ``POST /v1/feedback``; older ones are looked up in the log (docs/operations.md)
    feedback_index_size: int = 100_000


@dataclass(frozen=True, kw_only=True)
class SandboxSettings:
    """How the sandbox runs samples; ``concurrency = 0`` means one worker per CPU core.

    The limits' defaults are ``firstpass.sandbox.Limits``'s, written once there: ``serve`` and
    ``check`` run samples under the same limits unless the config says otherwise.
    """

    concurrency: int = 0
    #: samples that may wait for a slot at once; one more fails its request with 503
    max_queue: int = 1024
    #: how long a sample waits for a slot before its request fails with 503
    slot_timeout_s: float = 30.0
    wall_s: float = Limits.wall_s
    cpu_s: float = Limits.cpu_s
    memory_mb: int = Limits.memory_mb
    scratch_mb: int = Limits.scratch_mb
    site_packages: bool = Limits.site_packages

    def limits(self) -> Limits:
        """The sandbox's limits for these settings (validated when the config was built)."""
        return Limits(
            wall_s=self.wall_s,
            cpu_s=self.cpu_s,
            memory_mb=self.memory_mb,
            scratch_mb=self.scratch_mb,
            site_packages=self.site_packages,
        )

    @property
    def resolved_concurrency(self) -> int:
        """The number of samples run at once: ``concurrency``, or the core count when it is 0."""
        return self.concurrency or os.cpu_count() or 1


@dataclass(frozen=True, kw_only=True)
class ReceiptsConfig:
    """Where receipts go and how hard each line is pushed to disk."""

    path: Path = Path("receipts.jsonl")
    fsync: FsyncPolicy = "batch"
    store_content: bool = False
    queue_size: int = 10_000
    #: start a new file (the chain continuing) past this many bytes / this many seconds; off
    #: when ``None`` (docs/receipts.md, "Rotation")
    rotate_bytes: int | None = None
    rotate_s: float | None = None
    #: an Ed25519 private key (``firstpass keygen``): when set, the writer signs the chain head
    #: every ``checkpoint_interval_s`` and at shutdown (docs/receipts.md, "Signed checkpoints")
    signing_key: Path | None = None
    checkpoint_interval_s: float = 60.0
    #: ``"postgresql"``: every replica appends its own chain to one table (docs/database.md)
    sink: ReceiptSinkKind = "file"
    #: the environment variable holding the DSN (never the DSN itself in the file)
    dsn_env: str = "FIRSTPASS_DSN"
    #: this replica's id (``FIRSTPASS_REPLICA`` overrides); ``None``: derived, see ``replica_id``
    replica: str | None = None
    #: where receipts wait while the database is away; ``None``: ``<path stem>.spill.jsonl``
    spill_path: Path | None = None
    spill_max_bytes: int = SPILL_MAX_BYTES

    @property
    def replica_id(self) -> str:
        """``replica``, or one derived from the host name and the absolute receipts path: the
        same on every restart of the same process on the same machine (a container whose host
        name changes on each start should set ``replica`` or ``FIRSTPASS_REPLICA``)."""
        if self.replica is not None:
            return self.replica
        host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()).strip(".-_") or "host"
        where = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:8]
        return f"{host[:100]}-{where}"

    @property
    def resolved_spill_path(self) -> Path:
        """The spill file: ``spill_path``, or ``<path stem>.spill.jsonl`` beside ``path``."""
        if self.spill_path is not None:
            return self.spill_path
        return self.path.with_name(f"{self.path.stem}.spill.jsonl")


@dataclass(frozen=True, kw_only=True)
class ObservabilityConfig:
    """What the server reports about itself; both on by default, off to measure their cost or
    where an operator collects neither (docs/operations.md)."""

    #: ``GET /metrics`` in Prometheus text format
    metrics: bool = True
    #: one structured ``request`` log event per request (ids, verdicts, timings; never text)
    request_log: bool = True


@dataclass(frozen=True, kw_only=True)
class BudgetsConfig:
    """``[budgets]``: USD caps checked before every upstream call (docs/config.md, Budgets).

    ``daily_usd`` caps the whole server per UTC day, ``per_request_usd`` one request; each
    key's own daily cap is its ``daily_usd``. A call's cost is reserved at its worst case
    (prompt size, ``max_tokens`` or ``default_max_tokens``) and settled at its real cost.
    """

    per_request_usd: float | None = None
    daily_usd: float | None = None
    on_exhausted: OnBudgetExhausted = "serve_best_verified"
    #: the output tokens assumed for a call whose request sets no ``max_tokens``
    default_max_tokens: int = 4096
    #: the input tokens a hold assumes for each image part (billed by its pixels, which a URL
    #: does not carry): the most any published model bills one image, OpenAI's gpt-4o-mini,
    #: 2,833 + 5,667 per 512-px tile, at most 8 tiles (platform.openai.com/docs/guides/
    #: images-vision, "Calculating costs"); gpt-4o's is 1,445, the patch-billed gpt-4.1/o4-mini
    #: family at most 3,779, Claude's about 1,600 and at most 4,784 on its high-resolution
    #: models (docs.anthropic.com, "Vision"). Lower it to the ladder's own worst model
    image_tokens: int = 48_169


@dataclass(frozen=True, kw_only=True)
class ProviderConfig:
    """One upstream: an OpenAI-compatible HTTP endpoint, Anthropic's Messages API, or recorded
    samples replayed offline."""

    id: str
    kind: ProviderKind
    base_url: str | None = None
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 60.0
    connect_timeout_s: float = 5.0
    retries: int = 2
    backoff_base_s: float = 0.25
    backoff_max_s: float = 8.0
    honours_n: bool = True
    max_concurrency: int = 64
    samples: Path | None = None
    seed: int = 0
    #: what an OpenAI-compatible provider does with prompt-cache marks (``cache_control``) in
    #: a chat body: send them (OpenRouter, LiteLLM honour them) or take them out (OpenAI)
    cache_marks: CacheMarks = "forward"

    @functools.cached_property
    def endpoint(self) -> str:
        """Which upstream this is, as certificates bind it: the base URL without credentials,
        query or fragment (scheme and host lower-cased, no trailing slash), prefixed
        ``anthropic:`` for the Messages API (one gateway URL can serve both APIs, which draw
        differently: a certificate of one never covers the other); a replay provider is
        ``replay:<sample file name>``."""
        if self.kind == "replay" or self.base_url is None:
            return f"replay:{self.samples.name if self.samples is not None else ''}"
        parts = urllib.parse.urlsplit(self.base_url)
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 literal keeps its brackets
            host = f"[{host}]"
        try:
            port = f":{parts.port}" if parts.port is not None else ""
        except ValueError:  # not a number: kept as written (the call fails, not the binding)
            port = ":" + parts.netloc.rpartition(":")[2]
        url = f"{parts.scheme.lower()}://{host}{port}{parts.path.rstrip('/')}"
        return f"anthropic:{url}" if self.kind == "anthropic" else url


@dataclass(frozen=True, kw_only=True)
class Rung:
    """One step of a ladder: a model at a provider, optionally with its own probe size ``k``."""

    provider: str
    model: str
    k: int | None = None

    @property
    def name(self) -> str:
        """``provider/model``, the key prices and receipts use."""
        return f"{self.provider}/{self.model}"

    @classmethod
    def parse(cls, text: str, *, k: int | None = None) -> Rung:
        """Split ``provider/model`` at the first ``/``: model ids (``org/model``) may hold more."""
        provider, sep, model = text.partition("/")
        if not sep or not provider or not model:
            raise ValueError(f'expected "provider/model", got "{text}"')
        return cls(provider=provider, model=model, k=k)


@dataclass(frozen=True, kw_only=True)
class Price:
    """What one rung costs, in US dollars per million tokens."""

    model: str
    input_per_mtok: float
    output_per_mtok: float
    #: prompt-cache prices (None: the input price). Input tokens read from the provider's cache
    #: (OpenAI ``cached_tokens``, Anthropic ``cache_read_input_tokens``) and written to it
    #: (Anthropic ``cache_creation_input_tokens``, dearer than input there)
    cache_read_per_mtok: float | None = None
    cache_write_per_mtok: float | None = None
    #: the price of a write to a 1-hour cache entry (Anthropic's ``ttl: "1h"``; only tokens an
    #: upstream reports as 1-hour writes are priced at it). None: twice the input price, which is
    #: Anthropic's published multiplier for every model (5-minute writes 1.25x, reads 0.1x),
    #: when the model prices cache writes (``cache_write_per_mtok`` set: an Anthropic model);
    #: else the input price, like every cache price left out
    cache_write_1h_per_mtok: float | None = None

    @property
    def write_1h_per_mtok(self) -> float:
        """The 1-hour cache write price in effect (see ``cache_write_1h_per_mtok``)."""
        if self.cache_write_1h_per_mtok is not None:
            return self.cache_write_1h_per_mtok
        if self.cache_write_per_mtok is not None:
            return max(2.0 * self.input_per_mtok, self.cache_write_per_mtok)
        return self.input_per_mtok

    @property
    def dearest_input_per_mtok(self) -> float:
        """The most one prompt token can cost (plain, cache read, 5-minute or 1-hour write):
        what a budget hold prices every prompt token at."""
        return max(
            self.input_per_mtok,
            self.input_per_mtok if self.cache_read_per_mtok is None else self.cache_read_per_mtok,
            self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok,
            self.write_1h_per_mtok,
        )

    def cost(
        self,
        input_tokens: int,
        output_tokens: int,
        *,
        cache_read_tokens: int = 0,
        cache_write_tokens: int = 0,
        cache_write_1h_tokens: int = 0,
    ) -> float:
        """USD for one call that used these token counts; ``input_tokens`` counts every prompt
        token, cached ones included (the cache counts are parts of it, priced apart), and
        ``cache_write_1h_tokens`` is the part of ``cache_write_tokens`` written for an hour."""
        read = min(cache_read_tokens, input_tokens)
        write = min(cache_write_tokens, input_tokens - read)
        write_1h = min(cache_write_1h_tokens, write)
        plain = input_tokens - read - write
        read_price = (
            self.input_per_mtok if self.cache_read_per_mtok is None else self.cache_read_per_mtok
        )
        write_price = (
            self.input_per_mtok if self.cache_write_per_mtok is None else self.cache_write_per_mtok
        )
        return (
            plain * self.input_per_mtok
            + read * read_price
            + (write - write_1h) * write_price
            + write_1h * self.write_1h_per_mtok
            + output_tokens * self.output_per_mtok
        ) / 1e6


@dataclass(frozen=True, kw_only=True)
class RouteChecks:
    """Checks for requests that bring none: raw test-spec JSON, in the shape the sandbox takes."""

    visible: object | None = None
    hidden: object | None = None
    setup: str | None = None
    entry_point: str | None = None


def _with_route_tests(
    digest: str | None, checks: RouteChecks | None, part: Literal["visible", "hidden"]
) -> str | None:
    """``digest`` folded with the ``part`` tests ``[route.checks]`` lends (and their setup and
    entry point): an operator's own tests are part of the context as their listed checks are.
    Unchanged without route tests, so a route without ``[route.checks]`` keeps its digest."""
    tests = None if checks is None else getattr(checks, part)
    if tests is None or checks is None:
        return digest
    lent = {"checks": digest, part: tests, "setup": checks.setup, "entry": checks.entry_point}
    canonical = json.dumps(lent, sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Revision:
    """``[route.revision]``: when a rung's answer fails its checks, ask the same rung again with
    the reasons, at most ``max_revisions`` times (so at most ``max_revisions + 1`` attempts per
    rung), only while the request's deadline and ``max_cost_usd`` (its whole spend) allow."""

    max_revisions: int = 2
    max_cost_usd: float | None = None
    #: characters of feedback (reasons, failing tests) quoted back to the model, at most
    feedback_chars: int = 4000
    #: quote the gate checks' reasons too (off by default: they can hold the answer)
    gate_reasons: bool = False


@dataclass(frozen=True, kw_only=True)
class RouteConfig:
    """Which requested models a route serves, and the ladder of rungs it climbs, cheapest first."""

    name: str
    models: tuple[str, ...]
    ladder: tuple[Rung, ...]
    temperature: float = 0.8
    on_exhausted: OnExhausted = "unverified"
    without_checks: WithoutChecks = "passthrough"
    checks: RouteChecks | None = None
    #: ``[[route.visible_checks]]``: cheap, deterministic, run on every answer (and every probe
    #: sample: a sample passes when all of them and the visible tests pass)
    visible_checks: tuple[CheckDef, ...] = ()
    #: ``[[route.gate_checks]]``: the expensive gate, beside any hidden tests
    gate_checks: tuple[CheckDef, ...] = ()
    #: ``[route.revision]``; None: no revision loop (a failed answer escalates at once)
    revision: Revision | None = None
    #: the modes a request may ask for besides the configured one (``client_modes``); never
    #: ``enforce`` without a certificate: see ``firstpass.server`` ``resolve_mode``
    client_modes: tuple[str, ...] = ("cascade", "shadow", "passthrough")
    #: ``"pass"``: a turn that ends in tool calls goes to the client as the upstream sent it
    #: (an agent's middle turn: checks and the cascade decide final answers only);
    #: ``"verify"``: checked like a final answer (a route whose tool calls are the answer)
    tool_turns: ToolTurns = "pass"

    @functools.cached_property
    def visible_checks_digest(self) -> str | None:
        """The digest of ``visible_checks`` (``firstpass.checks.checks_digest``) and of the
        visible tests ``[route.checks]`` lends: probes record it, certificates carry it, and a
        certificate made under other visible checks or route tests fails the start."""
        return _with_route_tests(checks_digest(self.visible_checks), self.checks, "visible")

    @functools.cached_property
    def gate_checks_digest(self) -> str | None:
        """The digest of ``gate_checks`` and of the hidden tests ``[route.checks]`` lends: what
        "failure" meant for the labels a certificate was computed from; a certificate labelled
        under another operator gate fails the start."""
        return _with_route_tests(checks_digest(self.gate_checks), self.checks, "hidden")

    def matches(self, model: str) -> bool:
        """True when ``model`` is listed, or the route lists ``*``."""
        return model in self.models or ANY_MODEL in self.models


@dataclass(frozen=True, kw_only=True)
class ElasticConfig:
    """The elastic policy (``[escalation.elastic]``); absent from the file → the plain cascade.

    λ is per (route, rung): the certificate in force there (``licences``, bound once the routes
    are known), else none. Enforce skips the gate only under a certificate; a probed rung
    without one gates. Shadow records its counterfactual at the certificate's λ, else at the
    block's ``lambda_`` (labelled uncertified). ``score`` is the probe score compared with λ
    (``firstpass.policy.SCORES``); anything but ``pass_share`` also runs the probe inputs.
    ``alpha`` and ``delta`` are the risk the operator requires: a certificate promising less is
    refused.
    """

    k: int = 5
    lambda_: float = 1.0
    #: ``lambda`` was written in the block (enforce refuses it where no certificate applies)
    lambda_set: bool = False
    escalate_at: int = 0
    mode: ElasticMode = "shadow"
    calibration: tuple[Path, ...] = ()
    alpha: float | None = None
    delta: float | None = None
    max_gate_candidates: int = 1
    score: ProbeScore = "pass_share"
    #: which guarantee a certificate must give: ``ltt`` (failures among skips ≤ α with
    #: confidence 1 − δ) or, only when asked for, ``crc`` (P(skip and fail) ≤ α in expectation)
    method: Literal["ltt", "crc"] = "ltt"
    #: public keys (``firstpass keygen``'s ``.pub``) whose signature on a calibration file
    #: enforce accepts, besides the public half of ``[receipts] signing_key``
    trusted_keys: tuple[Path, ...] = ()
    #: the share of would-be skips gated anyway under enforce (drawn at random), whose labels
    #: feed the licence monitor (``firstpass.monitor``); 0 turns audits off (warned at start)
    audit_rate: float = 0.05
    #: the licence monitor's level γ: a licence still keeping its promise is revoked with
    #: probability at most γ, ever. None: the certificate's δ (``firstpass.monitor`` holds the
    #: fallback when there is none)
    monitor_level: float | None = None
    #: seconds without a sync of the licence monitor's store after which its licences stop
    #: skipping (fail closed: a revocation could not be seen); the store is polled every
    #: ``firstpass.monitor.POLL_S`` seconds (the monitor's layer is above this one)
    monitor_stale_s: float = 60.0
    #: the calibration files cited that exist (a cited file not written yet is skipped)
    files: tuple[CertificateFile, ...] = field(default=(), repr=False, compare=False)
    #: (route name, rung index) → the certificate in force there, or why there is none
    licences: Mapping[tuple[str, int], Licence] = field(
        default_factory=lambda: MappingProxyType({}), repr=False, compare=False
    )

    def licence(self, route: str, rung: int) -> Licence:
        """What (route, rung) runs under; a rung that was never bound has no certificate."""
        found = self.licences.get((route, rung))
        if found is not None:
            return found
        return Licence(certificate=None, problem=f"route {route!r} rung {rung}: not probed")

    def lambda_for(self, route: str, rung: int, mode: str) -> float | None:
        """λ at (route, rung) in ``mode``: the certificate's; else None under enforce (the rung
        gates), the block's hand-set λ in shadow (a counterfactual, labelled uncertified)."""
        cert = self.licence(route, rung).certificate
        if cert is not None and mode == "enforce" and self.mode != "enforce" and rung > 0:
            # bound for shadow: a higher rung's certificate names the lower rungs' λ as shadow
            # ran them; under enforce an uncertified lower rung gates instead, so who reaches
            # this rung differs and its certificate does not apply
            lower = [r for (name, r) in self.licences if name == route and r < rung]
            if any(self.licence(route, r).certificate is None for r in lower):
                cert = None
        if cert is not None:
            return cert.lambda_
        return None if mode == "enforce" else self.lambda_


@dataclass(frozen=True, kw_only=True)
class Config:
    """The whole effective configuration; ``digest`` identifies it (without secrets) on receipts."""

    server: ServerConfig
    sandbox: SandboxSettings
    receipts: ReceiptsConfig
    providers: tuple[ProviderConfig, ...]
    routes: tuple[RouteConfig, ...]
    prices: Mapping[str, Price] = field(default_factory=lambda: MappingProxyType({}))
    elastic: ElasticConfig | None = None
    #: ``[budgets]``; None: no server-wide or per-request cap (a key may still have its own)
    budgets: BudgetsConfig | None = None
    observability: ObservabilityConfig = field(default_factory=ObservabilityConfig)
    source: Path | None = None
    digest: str = ""

    def route_for(self, model: str) -> RouteConfig | None:
        """The first route listing ``model`` exactly, else the first listing ``*``, else None."""
        for route in self.routes:
            if model in route.models:
                return route
        for route in self.routes:
            if ANY_MODEL in route.models:
                return route
        return None

    def provider(self, provider_id: str) -> ProviderConfig:
        """The provider with this id; ConfigError when there is none (validation rules that out)."""
        for provider in self.providers:
            if provider.id == provider_id:
                return provider
        known = ", ".join(p.id for p in self.providers)
        raise ConfigError("provider", f'unknown provider "{provider_id}" (known: {known})')

    def price(self, rung_name: str) -> Price:
        """The price of ``provider/model``; ConfigError when there is none."""
        try:
            return self.prices[rung_name]
        except KeyError:
            raise ConfigError("price", f'no [[price]] for "{rung_name}"') from None
