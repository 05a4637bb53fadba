"""Numeric request fields are checked before anything goes upstream, through the running server.

Python's ``json`` reads ``NaN``, ``Infinity`` and ``1e400`` (an infinite float); no JSON peer
does, and OpenAI refuses a fractional or boolean ``max_tokens``, ``seed`` or ``n``. Such a
request is a 400 in OpenAI's error shape naming the field in ``param``, with its one receipt,
and nothing reaches the upstream. Valid values still pass through untouched.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply
from tests.test_server_errors import _post_raw

MESSAGES = '[{"role": "user", "content": "hi"}]'


def _post(stack: Any, extra: str) -> tuple[int, Any, Any]:
    """POST a chat body with ``extra`` spliced in as raw JSON text (so NaN stays NaN)."""
    data = f'{{"model": "{MODEL}", "messages": {MESSAGES}, {extra}}}'.encode()
    return _post_raw(stack, data)


def _assert_refused_with_receipt(stack: Any, extra: str, param: str) -> str:
    """400, OpenAI's error shape, ``param`` named, one receipt saying so, nothing upstream."""
    status, body, headers = _post(stack, extra)
    assert status == 400, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"].startswith(f"{param}: ")
    assert headers["X-Firstpass-Action"] == "rejected"
    (receipt,) = stack.receipts_list()
    assert receipt["id"] == headers["X-Firstpass-Receipt"]
    assert receipt["decision"]["action"] == "rejected"
    assert receipt["error"]["status"] == 400 and param in receipt["error"]["message"]
    assert stack.stub.completions == []
    return str(error["message"])


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ('"max_tokens": NaN', "max_tokens"),
        ('"max_tokens": Infinity', "max_tokens"),
        ('"max_tokens": -Infinity', "max_tokens"),
        ('"max_tokens": 1e400', "max_tokens"),
        ('"seed": NaN', "seed"),
        ('"seed": Infinity', "seed"),
        ('"temperature": NaN', "temperature"),
        ('"top_p": Infinity', "top_p"),
        ('"presence_penalty": NaN', "presence_penalty"),
        ('"frequency_penalty": -Infinity', "frequency_penalty"),
        ('"max_completion_tokens": NaN', "max_completion_tokens"),
        ('"n": NaN', "n"),
        ('"logit_bias": {"50256": NaN}', "logit_bias.50256"),
    ],
)
def test_nan_or_infinity_in_a_numeric_field_is_a_400_naming_it(
    live_stack: Any, extra: str, param: str
) -> None:
    """NaN, ±Infinity and 1e400 are refused, naming the field and what was sent."""
    stack = live_stack()
    message = _assert_refused_with_receipt(stack, extra, param)
    assert "NaN" in message or "Infinity" in message


@pytest.mark.parametrize(
    ("extra", "param", "shown"),
    [
        ('"max_tokens": 1.5', "max_tokens", "got 1.5"),
        ('"max_tokens": true', "max_tokens", "got true"),
        ('"max_tokens": 100.0', "max_tokens", "got 100.0"),
        ('"max_tokens": 0', "max_tokens", "got 0"),
        ('"max_tokens": "64"', "max_tokens", "got a string"),
        ('"seed": 1.5', "seed", "got 1.5"),
        ('"seed": false', "seed", "got false"),
        ('"seed": 18446744073709551616', "seed", "got 18446744073709551616"),
        ('"n": 1.5', "n", "got 1.5"),
        ('"n": true', "n", "got true"),
        ('"top_logprobs": 2.5', "top_logprobs", "got 2.5"),
        ('"presence_penalty": 3', "presence_penalty", "got 3"),
        ('"logit_bias": {"7": 101}', "logit_bias.7", "got 101"),
    ],
)
def test_integer_fields_take_only_integers_in_range(
    live_stack: Any, extra: str, param: str, shown: str
) -> None:
    """max_tokens, seed and n are integers (not 1.5, not true); ranges are OpenAI's."""
    stack = live_stack()
    message = _assert_refused_with_receipt(stack, extra, param)
    assert shown in message


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            '"tools": [{"type": "function", "function": {"name": "f", "parameters": '
            '{"type": "object", "properties": {"x": {"type": "number", "default": NaN}}}}}]',
            "tools[0].function.parameters.properties.x.default",
        ),
        (
            '"response_format": {"type": "json_schema", "json_schema": {"name": "s", '
            '"schema": {"maximum": Infinity}}}',
            "response_format.json_schema.schema.maximum",
        ),
        ('"metadata": {"weights": [1, 2, -Infinity]}', "metadata.weights[2]"),
    ],
)
def test_a_non_finite_number_anywhere_that_would_go_upstream_is_named(
    live_stack: Any, extra: str, param: str
) -> None:
    """Fields Firstpass does not know are forwarded as they are, so a NaN deep inside one is
    refused too, with the path to it."""
    stack = live_stack()
    _assert_refused_with_receipt(stack, extra, param)


def test_nan_inside_a_message_is_named_by_its_path(live_stack: Any) -> None:
    """A content part carrying a NaN is refused as messages[0].content[0].<field>."""
    stack = live_stack()
    data = (
        f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": '
        '[{"type": "text", "text": "hi", "weight": NaN}]}]}'
    ).encode()

    async def go() -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{stack.base_url}/chat/completions", data=data) as r,
        ):
            return r.status, await r.json(content_type=None)

    status, body = asyncio.run(go())
    assert status == 400 and body["error"]["param"] == "messages[0].content[0].weight"
    (receipt,) = stack.receipts_list()
    assert receipt["error"]["status"] == 400


def test_valid_numeric_fields_pass_through_untouched(live_stack: Any) -> None:
    """Integers, in-range numbers and a logit_bias reach the upstream exactly as sent."""
    stack = live_stack()
    stack.stub.script(Reply.ok("hello"), model=CHEAP)
    status, body, _ = _post(
        stack,
        '"max_tokens": 64, "seed": -7, "temperature": 0.5, "top_p": 1, '
        '"presence_penalty": -2, "frequency_penalty": 1.5, "logit_bias": {"50256": -100}',
    )
    assert status == 200, body
    (sent,) = stack.stub.completions
    assert sent.body["max_tokens"] == 64 and sent.body["seed"] == -7
    assert sent.body["temperature"] == 0.5 and sent.body["top_p"] == 1
    assert sent.body["presence_penalty"] == -2 and sent.body["frequency_penalty"] == 1.5
    assert sent.body["logit_bias"] == {"50256": -100}
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "passthrough"
