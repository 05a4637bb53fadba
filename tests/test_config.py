"""firstpass.toml → validated, frozen config; every mistake fails at start naming its key path."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

import pytest

import firstpass.config
from firstpass.config import (
    Config,
    ElasticConfig,
    Price,
    ReceiptsConfig,
    Rung,
    SandboxSettings,
    ServerConfig,
    _checks,
    config_from_dict,
    load_config,
    public_dict,
)
from firstpass.errors import ConfigError
from tests.certificates import certificate, file_id, write_calibration


class _Context(TypedDict):
    """A certificate's sampling context (keyword arguments of ``certificate``)."""

    model: str
    temperature: float
    endpoint: str


#: the base config's rung 0, as a certificate records it
REPLAY: _Context = {
    "model": "replay/cheap",
    "temperature": 0.8,
    "endpoint": "replay:samples.jsonl",
}

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TOML = REPO / "firstpass.toml"
FAKE_KEYS = {
    "OPENAI_API_KEY": "sk-test-not-a-key",
    "GROQ_API_KEY": "gsk-test-not-a-key",
    "ANTHROPIC_API_KEY": "sk-ant-test-not-a-key",
}
_EXAMPLE = re.compile(r"^# ---- example: (.*?) -+\n(.*?)^# ---- end -+$", re.M | re.S)


def example_blocks() -> dict[str, str]:
    """The commented example blocks of the default file, uncommented (one leading "#" removed)."""
    blocks = {}
    for name, body in _EXAMPLE.findall(DEFAULT_TOML.read_text("utf-8")):
        lines = [line[2:] if line.startswith("# ") else line[1:] for line in body.splitlines()]
        blocks[name.split(" (")[0]] = "\n".join(lines) + "\n"
    return blocks


@pytest.fixture
def samples(tmp_path: Path) -> Path:
    path = tmp_path / "samples.jsonl"
    path.write_text('{"task_id": "t", "model": "m", "samples": ["x"]}\n', encoding="utf-8")
    return path


@pytest.fixture
def base(samples: Path) -> dict[str, Any]:
    """A small valid config: a replay provider and an OpenAI one, one two-rung route, prices."""
    return {
        "provider": [
            {"id": "replay", "kind": "replay", "samples": samples.name},
            {
                "id": "openai",
                "kind": "openai",
                "base_url": "https://api.openai.com/v1",
                "api_key_env": "OPENAI_API_KEY",
            },
        ],
        "route": [
            {"name": "code", "models": ["code"], "ladder": ["replay/cheap", "openai/gpt-4o"]}
        ],
        "price": [
            {"model": "replay/cheap", "input_per_mtok": 0.1, "output_per_mtok": 0.4},
            {"model": "openai/gpt-4o", "input_per_mtok": 2.5, "output_per_mtok": 10},
        ],
    }


def build(data: dict[str, Any], tmp_path: Path, env: dict[str, str] | None = None) -> Config:
    return config_from_dict(data, base_dir=tmp_path, env=FAKE_KEYS if env is None else env)


def error_of(data: dict[str, Any], tmp_path: Path, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        build(data, tmp_path, env)
    return str(info.value)


# --- the shipped default -----------------------------------------------------------------------


def test_default_toml_serves_the_demo_offline_without_keys() -> None:
    """The shipped firstpass.toml loads with an empty environment and routes to the replay demo."""
    config = load_config(DEFAULT_TOML, env={})
    route = config.route_for("firstpass-demo")
    assert route is not None
    assert [r.name for r in route.ladder] == ["replay/demo-cheap", "replay/demo-strong"]
    provider = config.provider("replay")
    assert provider.kind == "replay" and provider.samples is not None
    assert provider.samples.is_file()
    assert all(config.price(r.name).output_per_mtok > 0 for r in route.ladder)
    assert config.elastic is None and config.source == DEFAULT_TOML
    assert config.receipts.path == REPO / "receipts.jsonl"


def test_default_toml_labels_demo_prices_as_made_up() -> None:
    """The demo prices are labelled made up, the demo data as written by Firstpass."""
    text = DEFAULT_TOML.read_text("utf-8")
    assert "Made-up prices" in text and "DEMO DATA written by Firstpass" in text


def test_default_toml_shows_every_promised_example() -> None:
    """Commented examples exist for elastic, OpenAI, Anthropic, vLLM, Ollama, Groq, route checks
    and listed checks with revision."""
    names = set(example_blocks())
    assert names == {
        "elastic verification", "OpenAI", "Anthropic", "a local vLLM server", "Ollama", "Groq",
        "a route with its own checks", "a route with listed checks and revision",
    }  # fmt: skip
    assert 'base_url = "http://127.0.0.1:11434/v1"' in example_blocks()["Ollama"]
    assert "honours_n = false" in example_blocks()["Ollama"]


def default_toml_in(directory: Path) -> Path:
    """A copy of the default file in ``directory``, its demo samples path made absolute.

    Relative paths (receipts, calibration) then resolve inside ``directory``, so nothing lying
    around the repository root (a calibration.json from a real run) changes the result.
    """
    samples = (REPO / "firstpass" / "demo" / "samples.jsonl").as_posix()
    text = DEFAULT_TOML.read_text("utf-8").replace(
        'samples = "firstpass/demo/samples.jsonl"', f'samples = "{samples}"'
    )
    path = directory / "firstpass.toml"
    path.write_text(text, "utf-8")
    return path


def with_examples(tmp_path: Path, names: list[str], env: dict[str, str]) -> Config:
    """Load the default file with these example blocks uncommented."""
    path = default_toml_in(tmp_path)
    blocks = example_blocks()
    text = path.read_text("utf-8") + "\n" + "\n".join(blocks[name] for name in names)
    return config_from_dict(tomllib.loads(text), base_dir=tmp_path, env=env)


@pytest.mark.parametrize("name", sorted(example_blocks()))
def test_each_example_block_is_valid_once_uncommented(name: str, tmp_path: Path) -> None:
    """Uncommenting one example (with fake keys in the environment) still gives a valid config."""
    config = with_examples(tmp_path, [name], FAKE_KEYS)
    if name == "elastic verification":
        assert config.elastic == ElasticConfig(
            k=5,
            lambda_=0.9,
            lambda_set=True,
            mode="shadow",
            calibration=(tmp_path / "calibration.json",),
        )
        assert len(config.routes) == 1
    else:
        assert config.elastic is None and len(config.routes) == 2


def test_all_example_blocks_together_are_valid(tmp_path: Path) -> None:
    """The examples do not clash with each other (ids, route names, models)."""
    config = with_examples(tmp_path, list(example_blocks()), FAKE_KEYS)
    assert [p.id for p in config.providers] == [
        "replay", "openai", "claude", "vllm", "ollama", "groq",
    ]  # fmt: skip
    assert config.provider("claude").honours_n is False
    assert config.provider("ollama").honours_n is False
    assert config.route_for("gpt-4o").name == "code"  # type: ignore[union-attr]


def test_the_openai_example_needs_its_key_in_the_environment(tmp_path: Path) -> None:
    """Without OPENAI_API_KEY the OpenAI example fails, naming the key path and the variable."""
    with pytest.raises(ConfigError) as info:
        with_examples(tmp_path, ["OpenAI"], {})
    assert str(info.value) == (
        "provider[1].api_key_env: environment variable OPENAI_API_KEY is not set"
    )


# --- loading -----------------------------------------------------------------------------------


def test_absent_sections_take_the_documented_defaults(base: dict[str, Any], tmp_path: Path) -> None:
    """Only providers, routes and prices are needed; everything else has its default."""
    config = build(base, tmp_path)
    assert config.server == ServerConfig()
    assert config.sandbox == SandboxSettings()
    assert config.receipts == ReceiptsConfig(path=tmp_path / "receipts.jsonl")
    route = config.routes[0]
    assert (route.temperature, route.on_exhausted, route.without_checks) == (
        0.8, "unverified", "passthrough"
    )  # fmt: skip
    openai = config.provider("openai")
    assert (openai.timeout_s, openai.retries, openai.honours_n, openai.max_concurrency) == (
        60.0, 2, True, 64
    )  # fmt: skip
    assert openai.api_key == FAKE_KEYS["OPENAI_API_KEY"]


def test_sandbox_concurrency_zero_means_one_per_core(base: dict[str, Any], tmp_path: Path) -> None:
    """concurrency = 0 resolves to the core count; a positive value is kept."""
    import os

    assert build(base, tmp_path).sandbox.resolved_concurrency == (os.cpu_count() or 1)
    base["sandbox"] = {"concurrency": 3}
    assert build(base, tmp_path).sandbox.resolved_concurrency == 3


def test_load_config_finds_the_file_by_argument_then_env_then_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explicit path wins, then FIRSTPASS_CONFIG, then ./firstpass.toml."""
    text = default_toml_in(tmp_path).read_text("utf-8")
    for name, port in (("a.toml", 1001), ("b.toml", 1002), ("firstpass.toml", 1003)):
        (tmp_path / name).write_text(text.replace("port = 8787", f"port = {port}"), "utf-8")
    monkeypatch.chdir(tmp_path)
    env = {"FIRSTPASS_CONFIG": str(tmp_path / "b.toml")}
    assert load_config(tmp_path / "a.toml", env=env).server.port == 1001
    assert load_config(env=env).server.port == 1002
    assert load_config(env={}).server.port == 1003


def test_paths_resolve_against_the_config_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """receipts.path and provider samples are relative to the file, not the working directory."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "s.jsonl").write_text("", "utf-8")
    (conf / "f.toml").write_text(
        '[receipts]\npath = "out/r.jsonl"\n[[provider]]\nid = "r"\nkind = "replay"\n'
        'samples = "s.jsonl"\n[[route]]\nname = "x"\nladder = ["r/m"]\n'
        '[[price]]\nmodel = "r/m"\ninput_per_mtok = 0\noutput_per_mtok = 0\n',
        "utf-8",
    )
    monkeypatch.chdir(tmp_path)
    config = load_config("conf/f.toml", env={})
    assert config.receipts.path == conf / "out" / "r.jsonl"
    assert config.provider("r").samples == conf / "s.jsonl"
    assert config.routes[0].models == ("x",)


def test_a_missing_file_names_the_file(tmp_path: Path) -> None:
    """A config path that does not exist fails with the path in the message."""
    with pytest.raises(ConfigError, match=r"nope\.toml: config file not found"):
        load_config(tmp_path / "nope.toml", env={})
    with pytest.raises(ConfigError, match=r"from FIRSTPASS_CONFIG"):
        load_config(env={"FIRSTPASS_CONFIG": str(tmp_path / "nope.toml")})


def test_invalid_toml_names_the_file_line_and_column(tmp_path: Path) -> None:
    """A syntax error reports the file, line and column."""
    path = tmp_path / "bad.toml"
    path.write_text('[server]\nport = 80\nhost = "x\n', "utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert message.startswith(f"{path}: invalid TOML: line 3, column ")
    assert info.value.__cause__ is not None


@pytest.mark.parametrize(
    "value", ["[" * 2000 + "]" * 2000, "{a = " * 600 + "1" + "}" * 600], ids=["array", "table"]
)
def test_values_nested_too_deeply_are_a_config_error_not_a_recursion_traceback(
    tmp_path: Path, value: str
) -> None:
    path = tmp_path / "deep.toml"
    path.write_text(f"x = {value}\n", "utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert str(info.value).startswith(f"{path}: invalid TOML: arrays or inline tables are nested")


def test_valid_toml_nested_too_deeply_is_said_so_without_blaming_a_bracket(tmp_path: Path) -> None:
    """Dotted keys thousands of levels deep are valid TOML: the error says they are too deep to
    check, not that a bracket ran away (from an attack review)."""
    root = Path(__file__).parent.parent  # the shipped config, its demo samples found by path
    shipped = (
        (root / "firstpass.toml")
        .read_text("utf-8")
        .replace('"firstpass/demo/samples.jsonl"', f'"{root / "firstpass/demo/samples.jsonl"}"')
    )
    path = tmp_path / "dotted.toml"
    deep = "visible." + ".".join(["x"] * 5000)
    path.write_text(f"{shipped}\n[route.checks]\n{deep} = 1\n", "utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    message = str(info.value)
    assert message.startswith(f"{path}: tables or values are nested too deeply to check")
    assert "invalid TOML" not in message


# --- validation messages -----------------------------------------------------------------------

Patch = Callable[[dict[str, Any]], None]


def _set(path: str, value: object) -> Patch:
    """A patch setting ``a.b[0].c`` (creating tables as needed) to ``value``."""

    def patch(data: dict[str, Any]) -> None:
        parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
        node: Any = data
        for part, nxt in zip(parts, [*parts[1:], None], strict=True):
            key: Any = int(part[1:-1]) if part.startswith("[") else part
            if nxt is None:
                node[key] = value
            else:
                if isinstance(key, str) and key not in node:
                    node[key] = {}
                node = node[key]

    return patch


def _delete(path: str, key: str) -> Patch:
    def patch(data: dict[str, Any]) -> None:
        _get: Any = data  # a table or an array, as the path goes
        for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
            _get = _get[int(part[1:-1])] if part.startswith("[") else _get[part]
        del _get[key]

    return patch


EXACT_ERRORS: list[tuple[str, Patch, str]] = [
    ("typo key", _set("server.prot", 80), 'server.prot: unknown key (did you mean "port"?)'),
    ("typo section", _set("serve", {}), 'serve: unknown key (did you mean "server"?)'),
    ("string port", _set("server.port", "80"), 'server.port: expected an integer, got "80"'),
    ("bool port", _set("server.port", True), "server.port: expected an integer, got true"),
    (
        "float int",
        _set("server.max_concurrency", 1.5),
        "server.max_concurrency: expected an integer, got 1.5",
    ),
    (
        "port range",
        _set("server.port", 70000),
        "server.port: must be between 0 and 65535, got 70000",
    ),
    (
        "zero body deadline",
        _set("server.body_read_timeout_s", 0),
        "server.body_read_timeout_s: must be greater than 0, got 0",
    ),
    (
        "negative idle timeout",
        _set("server.idle_timeout_s", -1),
        "server.idle_timeout_s: must be greater than 0, got -1",
    ),
    (
        "unknown provider",
        _set("route[0].ladder[1]", "opnai/gpt-4o"),
        'route[0].ladder[1]: unknown provider "opnai" (known: replay, openai)',
    ),
    (
        "missing price",
        _set("price", [{"model": "replay/cheap", "input_per_mtok": 0, "output_per_mtok": 0}]),
        'route[0].ladder[1]: no [[price]] for "openai/gpt-4o"',
    ),
    (
        "rung shape",
        _set("route[0].ladder[0]", "gpt-4o"),
        'route[0].ladder[0]: expected "provider/model", got "gpt-4o"',
    ),
    (
        "rung k",
        _set("route[0].ladder[0]", {"rung": "replay/cheap", "k": 0}),
        "route[0].ladder[0].k: must be between 1 and 128, got 0",
    ),
    (
        "empty ladder",
        _set("route[0].ladder", []),
        'route[0].ladder: expected a non-empty array of "provider/model" rungs, got an array',
    ),
    (
        "repeated rung",
        _set("route[0].ladder", ["replay/cheap", "replay/cheap"]),
        'route[0].ladder[1]: "replay/cheap" is already rung 0',
    ),
    (
        "no base_url",
        _delete("provider[1]", "base_url"),
        "provider[1].base_url: missing required key",
    ),
    (
        "bad base_url",
        _set("provider[1].base_url", "api.openai.com"),
        'provider[1].base_url: expected an http(s) URL, got "api.openai.com"',
    ),
    (
        "kind",
        _set("provider[0].kind", "bedrock"),
        'provider[0].kind: expected one of "openai", "anthropic", "replay", got "bedrock"',
    ),
    (
        "samples on openai",
        _set("provider[1].samples", "x.jsonl"),
        "provider[1].samples: unknown key",
    ),
    (
        "dup provider",
        _set("provider[1].id", "replay"),
        'provider[1].id: duplicate provider id "replay" (also provider[0])',
    ),
    (
        "dup route",
        _set(
            "route",
            [
                {"name": "a", "ladder": ["replay/cheap"]},
                {"name": "a", "models": ["b"], "ladder": ["replay/cheap"]},
            ],
        ),
        'route[1].name: duplicate route name "a" (also route[0])',
    ),
    (
        "model claimed twice",
        _set(
            "route",
            [
                {"name": "a", "models": ["m"], "ladder": ["replay/cheap"]},
                {"name": "b", "models": ["m"], "ladder": ["replay/cheap"]},
            ],
        ),
        'route[1].models[0]: model "m" is already matched by route[0]',
    ),
    (
        "two catch-alls",
        _set(
            "route",
            [
                {"name": "a", "models": ["*"], "ladder": ["replay/cheap"]},
                {"name": "b", "models": ["*"], "ladder": ["replay/cheap"]},
            ],
        ),
        "route[1].models[0]: the catch-all is already matched by route[0]",
    ),
    (
        "temperature",
        _set("route[0].temperature", 3),
        "route[0].temperature: must be between 0 and 2, got 3",
    ),
    (
        "on_exhausted",
        _set("route[0].on_exhausted", "retry"),
        'route[0].on_exhausted: expected one of "unverified", "error", got "retry"',
    ),
    (
        "route_checks without checks",
        _set("route[0].without_checks", "route_checks"),
        'route[0].without_checks: "route_checks" needs a [route.checks] table',
    ),
    (
        "fsync",
        _set("receipts.fsync", "sometimes"),
        'receipts.fsync: expected one of "durable", "always", "batch", "never", got "sometimes"',
    ),
    ("queue", _set("receipts.queue_size", 0), "receipts.queue_size: must be at least 1, got 0"),
    (
        "rotate_bytes",
        _set("receipts.rotate_bytes", 100),
        "receipts.rotate_bytes: must be at least 4096, got 100",
    ),
    ("rotate_s", _set("receipts.rotate_s", 0), "receipts.rotate_s: must be at least 1, got 0"),
    (
        "sandbox",
        _set("sandbox.concurrency", -1),
        "sandbox.concurrency: must be between 0 and 1024, got -1",
    ),
    (
        "timeout",
        _set("provider[1].timeout_s", 0),
        "provider[1].timeout_s: must be greater than 0, got 0",
    ),
    (
        "negative price",
        _set("price[0].input_per_mtok", -1),
        "price[0].input_per_mtok: must be at least 0, got -1",
    ),
    (
        "dup price",
        _set("price[1].model", "replay/cheap"),
        'price[1].model: duplicate [[price]] for "replay/cheap"',
    ),
    (
        "provider table",
        _set("provider", {"id": "x"}),
        "provider: expected an array of tables [[provider]], got a table",
    ),
    ("no routes", _set("route", []), "route: at least one [[route]] is required"),
    (
        "client keys",
        _set("server.client_keys_env", ["FP_CLIENT_KEY"]),
        "server.client_keys_env[0]: environment variable FP_CLIENT_KEY is not set",
    ),
    (
        "elastic k",
        _set("escalation.elastic.k", 0),
        "escalation.elastic.k: must be between 1 and 128, got 0",
    ),
    (
        "elastic lambda",
        _set("escalation.elastic.lambda", 1.5),
        "escalation.elastic.lambda: must be between 0 and 1, got 1.5",
    ),
    (
        "elastic lambda neg",
        _set("escalation.elastic.lambda", -0.1),
        "escalation.elastic.lambda: must be between 0 and 1, got -0.1",
    ),
    (
        "elastic escalate_at",
        _set("escalation.elastic.escalate_at", 5),
        "escalation.elastic.escalate_at: must be between 0 and 4, got 5",
    ),
    (
        "elastic mode",
        _set("escalation.elastic.mode", "yolo"),
        'escalation.elastic.mode: expected one of "shadow", "enforce", got "yolo"',
    ),
    (
        "elastic candidates",
        _set("escalation.elastic.max_gate_candidates", 0),
        "escalation.elastic.max_gate_candidates: must be between 1 and 5, got 0",
    ),
    (
        "elastic typo",
        _set("escalation.elastic.lamda", 0.9),
        'escalation.elastic.lamda: unknown key (did you mean "lambda"?)',
    ),
    (
        "escalation typo",
        _set("escalation.elastc", {}),
        'escalation.elastc: unknown key (did you mean "elastic"?)',
    ),
]


@pytest.mark.parametrize(
    ("patch", "message"), [(p, m) for _, p, m in EXACT_ERRORS], ids=[i for i, _, _ in EXACT_ERRORS]
)
def test_a_bad_value_fails_with_its_key_path(
    base: dict[str, Any], tmp_path: Path, patch: Patch, message: str
) -> None:
    """Each kind of mistake fails at start with one message that starts with the key path."""
    data = copy.deepcopy(base)
    patch(data)
    with pytest.raises(ConfigError) as info:
        build(data, tmp_path)
    assert str(info.value) == message
    assert info.value.key_path == message.split(":")[0]


def test_a_missing_api_key_variable_is_named(base: dict[str, Any], tmp_path: Path) -> None:
    """A provider's api_key_env that is unset (or empty) fails naming the variable."""
    expected = "provider[1].api_key_env: environment variable OPENAI_API_KEY is not set"
    assert error_of(base, tmp_path, env={}) == expected
    assert error_of(base, tmp_path, env={"OPENAI_API_KEY": ""}) == expected


def test_a_replay_provider_needs_an_existing_sample_file(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A missing samples file fails naming the resolved path."""
    base["provider"][0]["samples"] = "gone.jsonl"
    assert error_of(base, tmp_path) == (
        f"provider[0].samples: sample file {tmp_path / 'gone.jsonl'} does not exist"
    )


# --- values ------------------------------------------------------------------------------------


def test_a_rung_splits_at_the_first_slash(base: dict[str, Any], tmp_path: Path) -> None:
    """Model ids with "/" (Qwen/Qwen2.5-Coder-7B-Instruct) stay whole; `name` round-trips."""
    base["route"][0]["ladder"] = [
        "replay/Qwen/Qwen2.5-Coder-7B-Instruct",
        {"rung": "openai/gpt-4o", "k": 3},
    ]
    base["price"][0]["model"] = "replay/Qwen/Qwen2.5-Coder-7B-Instruct"
    ladder = build(base, tmp_path).routes[0].ladder
    assert ladder == (
        Rung(provider="replay", model="Qwen/Qwen2.5-Coder-7B-Instruct"),
        Rung(provider="openai", model="gpt-4o", k=3),
    )
    assert ladder[0].name == "replay/Qwen/Qwen2.5-Coder-7B-Instruct"


def test_route_for_prefers_an_exact_model_over_a_catch_all(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """An exact `models` entry wins even over an earlier "*" route; "*" catches the rest."""
    base["route"] = [
        {"name": "any", "models": ["*"], "ladder": ["replay/cheap"]},
        {"name": "code", "models": ["code", "gpt-4o"], "ladder": ["openai/gpt-4o"]},
    ]
    config = build(base, tmp_path)
    assert config.route_for("gpt-4o").name == "code"  # type: ignore[union-attr]
    assert config.route_for("other").name == "any"  # type: ignore[union-attr]
    base["route"] = base["route"][1:]
    assert build(base, tmp_path).route_for("other") is None


def test_prices_give_the_cost_of_a_call(base: dict[str, Any], tmp_path: Path) -> None:
    """Price.cost is USD for the token counts at the per-million rates."""
    config = build(base, tmp_path)
    price = config.price("openai/gpt-4o")
    assert price == Price(model="openai/gpt-4o", input_per_mtok=2.5, output_per_mtok=10.0)
    assert price.cost(1_000_000, 0) == pytest.approx(2.5)
    assert price.cost(2_000, 500) == pytest.approx(0.005 + 0.005)
    with pytest.raises(ConfigError, match='no \\[\\[price\\]\\] for "replay/other"'):
        config.price("replay/other")
    with pytest.raises(ConfigError, match='unknown provider "nope"'):
        config.provider("nope")


def test_numbers_accept_integers_where_floats_are_expected(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """`timeout_s = 5` is 5.0; `debug = 1` is not a bool."""
    base["provider"][1]["timeout_s"] = 5
    assert build(base, tmp_path).provider("openai").timeout_s == 5.0
    base["server"] = {"debug": 1}
    assert error_of(base, tmp_path) == "server.debug: expected true or false, got 1"


def test_the_config_is_frozen(base: dict[str, Any], tmp_path: Path) -> None:
    """Nothing can change the config after start: fields, prices, keyword-only construction."""
    config = build(base, tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.server.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.prices["x"] = config.prices["replay/cheap"]  # type: ignore[index]
    with pytest.raises(TypeError):
        ServerConfig("0.0.0.0")  # type: ignore[call-arg]


def test_secrets_stay_out_of_repr_and_digest(base: dict[str, Any], tmp_path: Path) -> None:
    """API keys and client keys stay out of repr and the digest input; the digest ignores them."""
    base["server"] = {"client_keys_env": ["FP_CLIENT"]}
    env = {**FAKE_KEYS, "FP_CLIENT": "client-secret-123"}
    config = build(base, tmp_path, env)
    assert config.server.client_keys == frozenset({"client-secret-123"})
    for text in (repr(config), json.dumps(public_dict(config))):
        assert "client-secret-123" not in text and FAKE_KEYS["OPENAI_API_KEY"] not in text
    other = build(base, tmp_path, {"OPENAI_API_KEY": "other", "FP_CLIENT": "other"})
    assert other.digest == config.digest


def test_the_digest_is_sha256_of_the_canonical_public_config(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """digest = "sha256:" + hex over sorted, compact JSON of the public config; values change it."""
    config = build(base, tmp_path)
    canonical = json.dumps(public_dict(config), sort_keys=True, separators=(",", ":"))
    assert config.digest == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    base["route"][0]["temperature"] = 0.7
    assert build(base, tmp_path).digest != config.digest


def test_receipt_keys_at_their_defaults_leave_the_digest_as_it_was(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """Rotation and signing keys written at their defaults keep a config's digest (receipts made
    before they existed stay comparable); set to something else, they change it."""
    config = build(base, tmp_path)
    public: dict[str, Any] = public_dict(config)  # JSON-ready data
    assert "rotate_bytes" not in public["receipts"]
    base["receipts"] = {"checkpoint_interval_s": 60.0}
    assert build(base, tmp_path).digest == config.digest
    base["receipts"] = {"rotate_bytes": 1 << 20}
    assert build(base, tmp_path).digest != config.digest


def test_a_probe_the_sandbox_could_never_hold_is_refused_at_load(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """k = 5 samples into 1 slot + 2 queued: every probe would be a 503 on an idle server, so
    the config is refused naming sandbox.max_queue and the smallest value that works."""
    base["escalation"] = {"elastic": {"mode": "shadow", "k": 5, "lambda": 0.8}}
    base["sandbox"] = {"concurrency": 1, "max_queue": 2}
    with pytest.raises(ConfigError) as info:
        build(base, tmp_path)
    assert info.value.key_path == "sandbox.max_queue" and "at least 4" in str(info.value)
    base["sandbox"]["max_queue"] = 4
    assert build(base, tmp_path).sandbox.max_queue == 4


# --- environment overrides ---------------------------------------------------------------------


def test_environment_overrides_host_port_receipts_and_mode(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """FIRSTPASS_HOST/_PORT/_RECEIPTS/_ELASTIC_MODE replace the file's values and the digest."""
    env = {
        **FAKE_KEYS,
        "FIRSTPASS_HOST": "0.0.0.0",
        "FIRSTPASS_PORT": "9000",
        "FIRSTPASS_RECEIPTS": "/tmp/r.jsonl",
        "FIRSTPASS_ELASTIC_MODE": "enforce",
    }
    base["escalation"] = {"elastic": {"mode": "shadow", "calibration": "cal.json"}}
    write_calibration(tmp_path / "cal.json", certificate(lam=0.8, **REPLAY))
    config = build(base, tmp_path, env)
    assert (config.server.host, config.server.port) == ("0.0.0.0", 9000)
    assert config.receipts.path == Path("/tmp/r.jsonl")
    assert config.elastic is not None and config.elastic.mode == "enforce"
    assert config.digest != build(base, tmp_path).digest


def test_elastic_mode_override_keeps_the_block_and_off_removes_it(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """FIRSTPASS_ELASTIC_MODE changes only the mode of a configured block; "off" removes it."""
    write_calibration(tmp_path / "cal.json", certificate(lam=0.8, k=7, **REPLAY))
    base["escalation"] = {"elastic": {"k": 7, "mode": "shadow", "calibration": "cal.json"}}
    config = build(base, tmp_path, {**FAKE_KEYS, "FIRSTPASS_ELASTIC_MODE": "enforce"})
    assert config.elastic == ElasticConfig(
        k=7, mode="enforce", calibration=(tmp_path / "cal.json",)
    )
    assert config.elastic.lambda_for("code", 0, "enforce") == 0.8
    assert build(base, tmp_path, {**FAKE_KEYS, "FIRSTPASS_ELASTIC_MODE": "off"}).elastic is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("FIRSTPASS_PORT", "eighty", 'FIRSTPASS_PORT: expected an integer, got "eighty"'),
        ("FIRSTPASS_PORT", "99999", "FIRSTPASS_PORT: must be between 0 and 65535, got 99999"),
        ("FIRSTPASS_HOST", " ", "FIRSTPASS_HOST: must not be empty"),
        ("FIRSTPASS_RECEIPTS", "", "FIRSTPASS_RECEIPTS: must not be empty"),
        (
            "FIRSTPASS_ELASTIC_MODE",
            "fast",
            'FIRSTPASS_ELASTIC_MODE: expected one of "shadow", "enforce", "off", got "fast"',
        ),
    ],
)
def test_a_bad_override_names_the_variable(
    base: dict[str, Any], tmp_path: Path, name: str, value: str, message: str
) -> None:
    """An environment override with a bad value fails naming the variable."""
    assert error_of(base, tmp_path, {**FAKE_KEYS, name: value}) == message


# --- elastic and calibration -------------------------------------------------------------------


def test_elastic_block_takes_lambda_per_route_and_rung_from_its_certificates(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """λ comes from the certificate for (route, rung); the block's "lambda" is only shadow's
    counterfactual where no certificate applies, and enforce gates there."""
    cal = write_calibration(tmp_path / "cal.json", certificate(lam=0.8, **REPLAY))
    base["escalation"] = {"elastic": {"calibration": "cal.json", "mode": "enforce"}}
    elastic = build(base, tmp_path).elastic
    assert elastic is not None
    cert = elastic.licence("code", 0).certificate
    assert cert is not None and (cert.id, cert.alpha, cert.delta) == (file_id(cal), 0.1, 0.05)
    assert elastic.lambda_for("code", 0, "enforce") == 0.8
    assert elastic.lambda_for("other", 0, "enforce") is None
    base["escalation"]["elastic"]["lambda"] = 0.8  # the same λ by hand: allowed
    assert build(base, tmp_path).elastic.lambda_for("code", 0, "enforce") == 0.8  # type: ignore[union-attr]


def test_a_missing_calibration_file_certifies_nothing_yet(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """calibration names a file not written yet: allowed in shadow, which records at λ."""
    base["escalation"] = {"elastic": {"lambda": 0.9, "calibration": "later.json"}}
    elastic = build(base, tmp_path).elastic
    assert elastic is not None and elastic.licence("code", 0).certificate is None
    assert elastic.lambda_for("code", 0, "shadow") == 0.9
    assert elastic.lambda_for("code", 0, "enforce") is None


def test_an_old_calibration_file_without_certificates_fails_at_start(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A calibration JSON from before certificates names no route, rung or context: refused,
    saying to calibrate again."""
    (tmp_path / "cal.json").write_text(json.dumps({"id": "c", "lambda": 0.8}), "utf-8")
    base["escalation"] = {"elastic": {"calibration": "cal.json"}}
    error = error_of(base, tmp_path)
    assert error.startswith("escalation.elastic.calibration: ")
    assert "certificates" in error and "calibrate" in error


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"id": 7}', '"id" must be a non-empty string'),
        (
            '{"id": "c", "certificates": [{"method": "ltt", "delta": 0.05, "rung": 0, "lambda": 1, "alpha": 2}]}',
            "certificates[0].alpha must be a number in [0, 1]",
        ),
        (
            '{"id": "c", "certificates": [{"method": "crc", "delta": 0.05}]}',
            "certificates[0].delta must be null under conformal risk control",
        ),
    ],
)
def test_an_unusable_calibration_file_fails_at_start(
    base: dict[str, Any], tmp_path: Path, content: str, message: str
) -> None:
    """A calibration file that is not a calibration JSON object fails naming the key."""
    (tmp_path / "cal.json").write_text(content, "utf-8")
    base["escalation"] = {"elastic": {"calibration": "cal.json"}}
    error = error_of(base, tmp_path)
    assert error.startswith("escalation.elastic.calibration: ") and message in error


def test_an_unreadable_calibration_file_fails_at_start(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A calibration path that cannot be read (here: a directory) fails naming the key."""
    (tmp_path / "cal.json").mkdir()
    base["escalation"] = {"elastic": {"calibration": "cal.json"}}
    assert error_of(base, tmp_path).startswith("escalation.elastic.calibration: cannot read ")


def test_a_hand_set_lambda_applies_only_where_no_certificate_does(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """The block's λ is shadow's counterfactual where nothing is certified; where a certificate
    applies its λ is in force, in both modes, and the block's λ does not turn it off."""
    write_calibration(tmp_path / "cal.json", certificate(lam=0.8, **REPLAY))
    for mode in ("shadow", "enforce"):
        base["escalation"] = {"elastic": {"lambda": 0.6, "calibration": "cal.json", "mode": mode}}
        elastic = build(base, tmp_path).elastic
        assert elastic is not None and elastic.lambda_for("code", 0, mode) == 0.8


def test_a_route_temperature_other_than_the_certificates_fails_naming_it(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """The certificate was computed on probes drawn at 0.8; the route now draws at 0.5."""
    write_calibration(tmp_path / "cal.json", certificate(lam=0.8, **REPLAY))
    base["escalation"] = {"elastic": {"calibration": "cal.json", "mode": "enforce"}}
    base["route"][0]["temperature"] = 0.5
    error = error_of(base, tmp_path)
    assert error.startswith("route[0].temperature: ")
    assert "temperature = 0.5 here" in error and "temperature = 0.8" in error


def test_a_hand_set_lambda_alone_cannot_be_enforced(base: dict[str, Any], tmp_path: Path) -> None:
    """enforce with λ by hand and no certificate: refused, saying how to get one."""
    base["escalation"] = {"elastic": {"lambda": 0.6, "mode": "enforce"}}
    error = error_of(base, tmp_path)
    assert error.startswith("escalation.elastic.lambda: 0.6 is set by hand")
    assert "firstpass calibrate" in error


# --- route checks ------------------------------------------------------------------------------


@pytest.fixture(params=["sandbox", "structural"])
def spec_checker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run check tests with the sandbox's parse_spec, and with the structural fallback."""
    if request.param == "structural":
        monkeypatch.setattr(_checks, "_sandbox_parse_spec", lambda: None)
    elif _checks._sandbox_parse_spec() is None:
        pytest.skip("firstpass.sandbox.parse_spec is not importable yet")
    return str(request.param)


def test_route_checks_are_kept_and_used_by_default(
    base: dict[str, Any], tmp_path: Path, spec_checker: str
) -> None:
    """A [route.checks] table is stored as raw spec JSON and makes without_checks "route_checks"."""
    hidden = {"cases": [{"args": [2], "expected": 4}], "atol": 0}
    base["route"][0]["checks"] = {
        "entry_point": "double",
        "visible": ["assert double(1) == 2"],
        "hidden": hidden,
    }
    route = build(base, tmp_path).routes[0]
    assert route.without_checks == "route_checks"
    assert route.checks is not None
    assert route.checks.visible == ["assert double(1) == 2"] and route.checks.hidden == hidden
    assert route.checks.entry_point == "double" and route.checks.setup is None


@pytest.mark.parametrize(
    ("checks", "key_path"),
    [
        ({"visible": ["assert f(1) =="]}, "route[0].checks.visible"),
        ({"visible": "assert f(1) == 2"}, "route[0].checks.visible"),
        ({"entry_point": "f", "hidden": {"cases": [{"args": 1, "expected": 2}]}},
         "route[0].checks.hidden"),
        ({"setup": "import (", "visible": ["assert True"]}, "route[0].checks.setup"),
        ({"entry_point": "f"}, "route[0].checks"),
        ({"visible": ["assert True"], "hiden": []}, "route[0].checks.hiden"),
    ],
)  # fmt: skip
def test_malformed_route_checks_fail_at_start(
    base: dict[str, Any], tmp_path: Path, spec_checker: str, checks: dict[str, Any], key_path: str
) -> None:
    """A broken test spec in [route.checks] fails at start, under the checks' key path."""
    base["route"][0]["checks"] = checks
    with pytest.raises(ConfigError) as info:
        build(base, tmp_path)
    found = info.value.key_path
    assert re.fullmatch(re.escape(key_path) + r"([.\[][^ ]*[^.])?", found), str(info.value)


def test_route_checks_that_would_never_run_are_refused(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """Checks with without_checks = "passthrough" would be dead config, so they fail."""
    base["route"][0]["checks"] = {"visible": ["assert True"]}
    base["route"][0]["without_checks"] = "passthrough"
    assert error_of(base, tmp_path) == (
        'route[0].checks: never used: without_checks = "passthrough" (use "route_checks")'
    )


def test_the_public_names_are_exactly_those_exported() -> None:
    """firstpass.config exports the names other parts code against, and nothing private."""
    assert set(firstpass.config.__all__) == {
        name for name in dir(firstpass.config) if not name.startswith("_")
    } - {"annotations"}
    for name in ("Config", "ServerConfig", "SandboxSettings", "ReceiptsConfig", "ProviderConfig",
                 "Rung", "Price", "RouteChecks", "RouteConfig", "ElasticConfig", "load_config",
                 "config_from_dict"):  # fmt: skip
        assert name in firstpass.config.__all__


def test_enforcing_a_calibration_that_certified_nothing_is_refused(tmp_path: Path) -> None:
    """A calibration JSON with lambda null cannot be enforced (config or env), only shadowed."""

    from firstpass.config import config_from_dict as build
    from firstpass.errors import ConfigError as Err

    write_calibration(
        tmp_path / "cal.json", uncertified=[{"route": "r", "rung": 0, "reason": "no λ certified"}]
    )
    data: dict[str, Any] = {
        "provider": [{"id": "p", "kind": "openai", "base_url": "http://127.0.0.1:1/v1"}],
        "route": [{"name": "r", "models": ["*"], "ladder": ["p/a"]}],
        "price": [{"model": "p/a", "input_per_mtok": 1, "output_per_mtok": 1}],
        "escalation": {"elastic": {"mode": "enforce", "calibration": "cal.json"}},
    }
    with pytest.raises(Err) as info:
        build(data, base_dir=tmp_path, env={})
    assert str(info.value).startswith("escalation.elastic.mode:")
    assert "certified no λ" in str(info.value) and "paste" not in str(info.value)
    assert 'mode = "shadow"' in str(info.value)  # what to do instead
    data["escalation"]["elastic"]["mode"] = "shadow"
    shadow = build(data, base_dir=tmp_path, env={})
    assert shadow.elastic is not None and shadow.elastic.licence("r", 0).certificate is None
    with pytest.raises(Err) as info:
        build(data, base_dir=tmp_path, env={"FIRSTPASS_ELASTIC_MODE": "enforce"})
    assert str(info.value).startswith("FIRSTPASS_ELASTIC_MODE:")


def test_sandbox_limits_fail_at_load_naming_the_config_key_and_default_to_the_sandboxs() -> None:
    """[sandbox] memory_mb = 48 fails at load as sandbox.memory_mb; defaults are Limits'."""
    from firstpass.config._build import _sandbox
    from firstpass.sandbox import Limits

    with pytest.raises(ConfigError) as info:
        _sandbox({"memory_mb": 48})
    assert info.value.key_path == "sandbox.memory_mb"
    defaults = _sandbox({}).limits()
    assert (defaults.cpu_s, defaults.wall_s, defaults.memory_mb) == (
        Limits().cpu_s,
        Limits().wall_s,
        Limits().memory_mb,
    )


def test_enforcing_a_calibration_file_that_does_not_exist_names_it(
    base: dict[str, Any], tmp_path: Path
) -> None:
    """A cited file not written yet is fine in shadow; under enforce the start names it."""
    base["escalation"] = {"elastic": {"calibration": "later.json", "mode": "enforce"}}
    error = error_of(base, tmp_path)
    assert error.startswith("escalation.elastic.calibration: ")
    assert "later.json does not exist" in error
