"""Chat messages as the OpenAI API shapes them: the text of one, and the last user message's.

"The task" of a request is its last ``user`` message's text: checks see it as their prompt,
the server records it, and replay and receipts hash it (``firstpass.providers.prompt_sha256``).
It is read here, once, so all of them agree on it. Standard library only: the bottom of the
import graph, where ``checks``, ``providers`` and ``server`` can all reach it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["last_user_text", "message_text"]


def message_text(content: Any) -> str:
    """The text of one message's ``content``: a string, or the ``text`` parts of a parts list.

    Parts are joined with a newline; images, audio and other non-text parts are ignored.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            part["text"]
            for part in content
            if isinstance(part, Mapping)
            and part.get("type", "text") == "text"
            and isinstance(part.get("text"), str)
        ]
        return "\n".join(texts)
    return ""


def last_user_text(messages: Sequence[Any]) -> str | None:
    """The text of the last ``user`` message (as is, not stripped); None without one.

    Entries that are not objects are passed over, as any other role is.
    """
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            return message_text(message.get("content"))
    return None
