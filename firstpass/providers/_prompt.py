"""The prompt key of a chat body: the SHA-256 of its last user message's text.

Replay finds recorded samples by this key when a request carries no task id, and receipts can use
the same function for their prompt digest, so both agree on what "the same prompt" means.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

__all__ = ["message_text", "prompt_sha256"]


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


def prompt_sha256(body: Mapping[str, Any]) -> str | None:
    """Hex SHA-256 of the last ``user`` message's text (stripped, UTF-8); None without one."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, Mapping) and message.get("role") == "user":
            text = message_text(message.get("content")).strip()
            return hashlib.sha256(text.encode("utf-8")).hexdigest()
    return None
