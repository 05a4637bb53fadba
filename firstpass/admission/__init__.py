"""Admission: may this request run, and as what? One answer for every API dialect.

A dialect parses its body into a ``ChatRequest`` (Chat Completions: ``parse_chat_body``; the
OpenAI Responses and Anthropic Messages dialects will build the same value, parsing the shared
``firstpass`` object with ``parse_extension``). ``admit`` then decides the rest and returns the
``Admitted`` value the pipeline runs (``Pipeline.handle``), or raises the ``RequestError`` that
refuses the request: the route, the key's routes, the route's tests in place of none, one answer
on a verified route, ``tests_required``, the mode, the receipt's ``RequestInfo``.

``admit`` is pure (no I/O, nothing awaited), so each rule is a table test. What admission needs
of I/O is its caller's, in this order (the server's, ``firstpass.server._door``): ``screen``
(the rules that need only the request: ``n``, the route, the key's routes), then the budget
ledger's refusal, then ``with_listed_checks`` (the request's listed checks compiled on the
checks' threads), then ``admit``. So nothing is spent on a request refused for its route, and
refusals come in the order they always did.

Why a package, between ``pipeline`` and ``server``: it needs config, checks, the pipeline's
``Checks`` and ``Admitted`` and the receipt's ``RequestInfo``, and nothing of HTTP. In the
server, each new dialect would sit beside rules it must not restate, and nothing but an aiohttp
handler could reach them; here the server imports them and so can anything that is not HTTP.
"""

from firstpass.admission._admit import admit, request_info, resolve_mode, screen, unparsed_info
from firstpass.admission._chat import parse_chat_body
from firstpass.admission._extension import MAX_PROBE_INPUTS, Extension, parse_extension
from firstpass.admission._listed import with_listed_checks
from firstpass.admission._messages import parse_messages_body
from firstpass.admission._request import MODES, ChatRequest, SpecParser
from firstpass.admission._responses_api import parse_responses_body

__all__ = [
    "MAX_PROBE_INPUTS",
    "MODES",
    "ChatRequest",
    "Extension",
    "SpecParser",
    "admit",
    "parse_chat_body",
    "parse_extension",
    "parse_messages_body",
    "parse_responses_body",
    "request_info",
    "resolve_mode",
    "screen",
    "unparsed_info",
    "with_listed_checks",
]
