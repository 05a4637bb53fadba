"""`firstpass.probe_inputs` in a request: a list of argument lists, validated, 400 naming it."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from firstpass.admission import MAX_PROBE_INPUTS, parse_chat_body
from firstpass.errors import RequestError
from firstpass.sandbox import parse_spec
from tests.server_harness import MODEL


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def body(probe_inputs: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "write add"}],
        "firstpass": {
            "tests": ["assert add(1, 2) == 3"],
            "entry_point": "add",
            "probe_inputs": probe_inputs,
        },
    }


def test_probe_inputs_reach_the_checks_as_argument_tuples() -> None:
    """Each inner list is one call's positional arguments, kept in order, objects included."""
    chat = parse_chat_body(
        body([[1, 2], [[3, 4], {"k": "v"}]]), header_mode=None, parse_spec=parse_spec
    )
    assert chat.checks.probe_inputs == ((1, 2), ([3, 4], {"k": "v"}))
    assert chat.checks.n_visible == 1


def test_without_probe_inputs_the_checks_are_the_plain_ones() -> None:
    """A request that gives none gets exactly the Checks it always got."""
    plain = body(None)
    del plain["firstpass"]["probe_inputs"]
    chat = parse_chat_body(plain, header_mode=None, parse_spec=parse_spec)
    assert type(chat.checks).__name__ == "Checks"


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"a": 1}, "firstpass.probe_inputs"),
        ([[1], 2], "firstpass.probe_inputs[1]"),
        ([[1]] * (MAX_PROBE_INPUTS + 1), "firstpass.probe_inputs"),
        ([_nested(40)], "firstpass.probe_inputs[0]"),
    ],
)
def test_malformed_probe_inputs_are_refused_naming_the_field(value: Any, param: str) -> None:
    """Not a list, an entry that is not a list, too many, too deep: RequestError with param."""
    with pytest.raises(RequestError) as info:
        parse_chat_body(body(value), header_mode=None, parse_spec=parse_spec)
    assert info.value.param == param and info.value.status == 400


@pytest.mark.e2e
def test_a_live_server_answers_400_naming_probe_inputs(live_stack: Any) -> None:
    """Through the SDK: the error's param is firstpass.probe_inputs[0]."""
    stack = live_stack()
    client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    payload = body(["not a list"])
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=payload["messages"],
            extra_body={"firstpass": payload["firstpass"]},
        )
    assert info.value.body["param"] == "firstpass.probe_inputs[0]"  # type: ignore[index]
