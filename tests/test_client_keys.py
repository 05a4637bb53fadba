"""Client API keys: named keys with route allow-lists, compared in constant time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from firstpass.config import ClientKey, config_from_dict
from firstpass.errors import ConfigError
from firstpass.server._auth import KeyRing
from tests.server_harness import MODEL
from tests.stub_upstream import Reply

KEYS = {"TEAM_A_KEY": "sk-team-a-0123456789", "TEAM_B_KEY": "sk-team-b-0123456789"}
NAMED = {
    "client_key": [
        {"name": "team-a", "key_env": "TEAM_A_KEY", "routes": ["code"]},
        {"name": "team-b", "key_env": "TEAM_B_KEY", "routes": []},
    ]
}


def _ask(stack: Any, key: str) -> Any:
    client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=30)
    return client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )


def test_the_ring_accepts_exactly_the_configured_keys() -> None:
    """The matching key is found whatever its position; near misses and other schemes are not."""
    a = ClientKey(name="a", key_env="A", secret="sk-aaaa")
    b = ClientKey(name="b", key_env="B", secret="sk-bbbb")
    ring = KeyRing([a, b])
    assert ring.match("Bearer sk-bbbb") is b
    assert ring.match("bearer sk-aaaa ") is a
    for wrong in (
        "Bearer sk-aaab",
        "Bearer sk-aaa",
        "Bearer sk-aaaaa",
        "Bearer ",
        "",
        "Basic sk-aaaa",
    ):
        assert ring.match(wrong) is None, wrong
    assert not KeyRing([])


@pytest.mark.e2e
def test_a_named_key_is_accepted_and_the_receipt_names_it_without_the_key(
    live_stack: Any,
) -> None:
    """The right key is served; the receipt and the log carry its name only."""
    stack = live_stack(env=KEYS, tables={"server": NAMED})
    stack.stub.script(Reply.ok("hello"))
    raw = _ask(stack, KEYS["TEAM_A_KEY"])
    assert raw.parse().choices[0].message.content == "hello"
    (receipt,) = stack.receipts_list()
    assert receipt["request"]["client_key"] == "team-a"
    assert KEYS["TEAM_A_KEY"] not in stack.receipts.read_text()


@pytest.mark.e2e
def test_a_wrong_or_missing_key_is_refused_with_401(live_stack: Any) -> None:
    """A key that is not configured (even one character off) gets 401 invalid_api_key."""
    stack = live_stack(env=KEYS, tables={"server": NAMED})
    for wrong in (KEYS["TEAM_A_KEY"][:-1] + "X", "nope"):
        with pytest.raises(openai.AuthenticationError) as info:
            _ask(stack, wrong)
        assert info.value.code == "invalid_api_key"
    assert stack.stub.completions == []


@pytest.mark.e2e
def test_a_key_not_allowed_on_the_route_gets_403_naming_the_route(live_stack: Any) -> None:
    """A key whose routes do not list the request's route: 403 permission_error naming the
    route, never the key; the refusal's receipt names the key's name."""
    stack = live_stack(env=KEYS, tables={"server": NAMED})
    with pytest.raises(openai.PermissionDeniedError) as info:
        _ask(stack, KEYS["TEAM_B_KEY"])
    assert info.value.code == "route_not_allowed"
    assert info.value.body["type"] == "permission_error"  # type: ignore[index]
    assert "'code'" in info.value.message
    assert KEYS["TEAM_B_KEY"] not in info.value.message and "team-b" not in info.value.message
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "rejected"
    assert receipt["request"]["client_key"] == "team-b"
    assert stack.stub.completions == []


@pytest.mark.e2e
def test_client_keys_env_keeps_working_beside_named_keys(live_stack: Any) -> None:
    """A key from client_keys_env is accepted, named after its variable, on every route."""
    stack = live_stack(
        client_keys_env=("OLD_KEY",),
        env={**KEYS, "OLD_KEY": "sk-old-key"},
        tables={"server": NAMED},
    )
    stack.stub.script(Reply.ok("hello"))
    _ask(stack, "sk-old-key")
    (receipt,) = stack.receipts_list()
    assert receipt["request"]["client_key"] == "OLD_KEY"


def _config(tmp_path: Path, keys: list[dict[str, Any]], env: dict[str, str]) -> Any:
    return config_from_dict(
        {
            "server": {"client_key": keys},
            "provider": [{"id": "p", "kind": "openai", "base_url": "http://x"}],
            "route": [{"name": "r", "models": ["m"], "ladder": ["p/a"]}],
            "price": [{"model": "p/a", "input_per_mtok": 1, "output_per_mtok": 1}],
        },
        base_dir=tmp_path,
        env=env,
    )


def test_key_config_errors_name_the_key_path(tmp_path: Path) -> None:
    """An unset variable, a duplicate name or an unknown route fails at load, by key path."""
    with pytest.raises(ConfigError, match=r"^server\.client_key\[0\]\.key_env: .*K is not set"):
        _config(tmp_path, [{"name": "a", "key_env": "K"}], {})
    dup = [{"name": "a", "key_env": "K"}, {"name": "a", "key_env": "K"}]
    with pytest.raises(ConfigError, match=r"^server\.client_key\[1\]\.name: duplicate"):
        _config(tmp_path, dup, {"K": "v"})
    with pytest.raises(
        ConfigError, match=r'^server\.client_key\[0\]\.routes\[0\]: no route named "x"'
    ):
        _config(tmp_path, [{"name": "a", "key_env": "K", "routes": ["x"]}], {"K": "v"})


def test_named_keys_stay_out_of_repr_and_digest(tmp_path: Path) -> None:
    """The digest covers a key's name, routes and cap, never its value."""
    one = _config(tmp_path, [{"name": "a", "key_env": "K", "daily_usd": 1.0}], {"K": "v1"})
    two = _config(tmp_path, [{"name": "a", "key_env": "K", "daily_usd": 1.0}], {"K": "v2"})
    capped = _config(tmp_path, [{"name": "a", "key_env": "K", "daily_usd": 2.0}], {"K": "v1"})
    assert one.digest == two.digest != capped.digest
    assert "v1" not in repr(one.server)


@pytest.mark.e2e
def test_models_takes_a_key_and_lists_only_the_routes_it_may_use(live_stack: Any) -> None:
    """GET /v1/models with keys configured: 401 without one; team-a (route code) sees the
    route's model, team-b (no routes) sees none."""

    def models(key: str) -> list[str]:
        client = openai.OpenAI(base_url=stack.base_url, api_key=key, max_retries=0, timeout=30)
        return [m.id for m in client.models.list()]

    stack = live_stack(env=KEYS, tables={"server": NAMED})
    with pytest.raises(openai.AuthenticationError):
        models("nope")
    assert MODEL in models(KEYS["TEAM_A_KEY"])
    assert models(KEYS["TEAM_B_KEY"]) == []


async def test_an_api_route_added_without_an_endpoints_entry_still_takes_a_key() -> None:
    """The key check fails closed: a ``/v1/`` route nobody listed in ``ENDPOINTS`` answers
    401 without a key, while the operations routes stay open and an unknown path stays 404."""
    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer

    from firstpass.server._door import auth_middleware
    from firstpass.server._errors import error_middleware
    from firstpass.server._keys import CLIENT_KEYS, ENDPOINTS

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application(middlewares=[error_middleware, auth_middleware])
    app[ENDPOINTS] = {}
    app[CLIENT_KEYS] = KeyRing([ClientKey(name="a", key_env="A", secret="sk-aaaa")])
    app.router.add_get("/v1/brand-new", hello)
    app.router.add_get("/healthz", hello)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/v1/brand-new")).status == 401
        keyed = await client.get("/v1/brand-new", headers={"Authorization": "Bearer sk-aaaa"})
        assert keyed.status == 200
        assert (await client.get("/healthz")).status == 200
        assert (await client.get("/v1/no-such-thing")).status == 404
