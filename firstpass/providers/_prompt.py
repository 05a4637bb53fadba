"""The prompt key of a chat body: the SHA-256 of its last user message's text.

Replay finds recorded samples by this key when a request carries no task id, and receipts can use
the same function for their prompt digest, so both agree on what "the same prompt" means. Which
message that is, and its text, is ``firstpass._messages``' to say (checks read the same one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from firstpass._messages import last_user_text, message_text

__all__ = ["message_text", "prompt_sha256"]


def prompt_sha256(body: Mapping[str, object]) -> str | None:
    """Hex SHA-256 of the last ``user`` message's text (stripped, UTF-8); None without one."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    text = last_user_text(messages)
    if text is None:
        return None
    return hashlib.sha256(text.strip().encode("utf-8")).hexdigest()
