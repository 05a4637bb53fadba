"""Client API keys: which configured key a request's bearer token is, compared in constant time.

The token and every key are hashed to SHA-256 first, so ``hmac.compare_digest`` compares equal
lengths, and every key is compared whatever matched earlier: neither the time nor the order of
keys tells a caller how close a guess came or which key exists.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from firstpass.config import ClientKey

__all__ = ["KeyRing"]


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class KeyRing:
    """The server's accepted keys; empty means the server takes requests without a key."""

    def __init__(self, keys: Sequence[ClientKey]) -> None:
        self._keys = tuple((_digest(k.secret), k) for k in keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def match(self, authorization: str) -> ClientKey | None:
        """The key an ``Authorization: Bearer <token>`` header carries, or None."""
        scheme, _, token = authorization.partition(" ")
        found = self.match_token(token)
        return found if scheme.lower() == "bearer" else None

    def match_token(self, token: str) -> ClientKey | None:
        """The key ``token`` is (an ``x-api-key`` header's value, a bearer token), or None."""
        presented = _digest(token.strip())
        found: ClientKey | None = None
        for digest, key in self._keys:  # no early exit: every key is compared
            if hmac.compare_digest(presented, digest) and found is None:
                found = key
        return found
