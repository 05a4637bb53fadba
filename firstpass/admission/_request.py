"""The intermediate every API dialect parses its body into: a ``ChatRequest``.

Chat Completions builds one from its body (``_chat.parse_chat_body``); a dialect added later
(OpenAI Responses, Anthropic Messages) builds the same value from its own, so admission and the
pipeline never learn which API a request came through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from firstpass._json import JSON
from firstpass.config import REQUEST_MODES, RequestMode
from firstpass.errors import RequestError
from firstpass.pipeline import Checks
from firstpass.receipts import Dialect
from firstpass.sandbox import TestSpec

__all__ = ["MODES", "ChatRequest", "SpecParser", "bad"]

#: request modes: the plain cascade, the elastic policy in shadow or enforce, or no checks at all
MODES = REQUEST_MODES


class SpecParser(Protocol):
    """The sandbox's spec parser (``firstpass.sandbox.parse_spec``), handed in by the caller:
    a test spec as decoded from JSON, with the setup and entry point it may leave out."""

    def __call__(
        self, obj: object, /, *, setup: str | None = ..., entry_point: str | None = ...
    ) -> TestSpec: ...


@dataclass(frozen=True, kw_only=True, slots=True)
class ChatRequest:
    """A validated request: the upstream body plus everything Firstpass keeps for itself."""

    model: str
    upstream_body: dict[str, JSON]  # without `firstpass`, `model`, `stream`, `stream_options`
    stream: bool
    include_usage: bool
    n: int
    mode: RequestMode | None  # None: the route's default
    mode_param: str = "firstpass.mode"  # where the mode came from, for error messages
    checks: Checks
    #: ``firstpass.checks`` as sent; ``with_listed_checks`` builds it off the event loop
    listed_checks: JSON = None
    task_id: str | None
    prompt_sha256: str
    n_messages: int
    prompt_text: str
    #: the API the request came through (the receipt records it)
    dialect: Dialect = "chat"


def bad(param: str, message: str, code: str | None = None) -> RequestError:
    """A 400 naming ``param`` the way OpenAI does (``messages[1].role``)."""
    return RequestError(f"{param}: {message}", param=param, code=code or "invalid_value")
