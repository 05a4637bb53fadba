"""Signed calibration files: who vouches for a certificate, not only what it says.

A calibration file's ``id`` is a SHA-256 anyone can recompute, so it catches an accidental edit
but not a deliberate one: whoever can write the file can change λ and re-hash the id, or
fabricate a whole file. ``firstpass calibrate --signing-key FILE`` adds a ``signature`` member,
an Ed25519 signature (the key ``firstpass keygen`` makes, the one that signs receipt
checkpoints) over the canonical JSON of everything else in the file, ``id`` and ``created_at``
included, tagged with a purpose so that no other signature by the same key (a checkpoint's) can
pass as a calibration's::

    "signature": {"alg": "ed25519", "key_id": "ed25519:…", "value": "<base64>"}

The ``id`` does not cover the signature (``_certificate._UNHASHED``): the same data and settings
give the same id signed or not, and a receipt that names the id names the content either way.

Pure: ``signed_payload``, ``sign_calibration`` and ``signature_problem`` work on values; the
keys are loaded by the caller (``firstpass.receipts.load_signing_key``/``load_public_key``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from firstpass._json import JSON
from firstpass.errors import ReceiptError
from firstpass.receipts import canonical_bytes, key_id

__all__ = [
    "SIGNATURE_KEY",
    "CalibrationSignature",
    "sign_calibration",
    "signature_problem",
    "signed_payload",
]

#: the member of a calibration file that holds its signature
SIGNATURE_KEY = "signature"
#: inside the signed bytes: what the signature is for (a checkpoint signs another purpose)
PURPOSE = "firstpass.calibration.v1"
ALG = "ed25519"
#: what to do about a file no trusted key signed
HOW_TO_SIGN = (
    "sign it with `firstpass calibrate ... --signing-key KEY --out FILE` (calibrate again: a "
    "signature is made only by calibrating), with KEY the private half of a trusted key"
)


def signed_payload(doc: Mapping[str, JSON]) -> bytes:
    """The bytes a calibration file's signature covers: its canonical JSON without the
    ``signature`` member, under the calibration purpose."""
    body = {k: v for k, v in doc.items() if k != SIGNATURE_KEY}
    return canonical_bytes({"purpose": PURPOSE, "calibration": body})


def sign_calibration(doc: Mapping[str, JSON], key: Ed25519PrivateKey) -> dict[str, JSON]:
    """``doc`` with a ``signature`` member by ``key`` (replacing any it had). Sign the values
    as they will be read back (parse the JSON text first) so the reader's bytes are these."""
    body: dict[str, JSON] = {k: v for k, v in doc.items() if k != SIGNATURE_KEY}
    value = base64.b64encode(key.sign(signed_payload(body))).decode("ascii")
    body[SIGNATURE_KEY] = {"alg": ALG, "key_id": key_id(key.public_key()), "value": value}
    return body


@dataclass(frozen=True, kw_only=True)
class CalibrationSignature:
    """A file's ``signature`` member as read, with the bytes it must sign; ``malformed`` says
    why the member is not a signature at all (it then verifies under no key)."""

    key_id: str | None
    value: bytes
    payload: bytes
    malformed: str | None = None

    @classmethod
    def read(cls, doc: Mapping[str, JSON]) -> CalibrationSignature | None:
        """The signature of a parsed calibration file; None when it has none."""
        raw = doc.get(SIGNATURE_KEY)
        if raw is None:
            return None
        try:
            payload = signed_payload(doc)
        except ReceiptError as exc:
            return cls(key_id=None, value=b"", payload=b"", malformed=str(exc))
        if not isinstance(raw, dict):
            return cls(key_id=None, value=b"", payload=payload, malformed="not an object")
        found = raw.get("key_id")
        kid = found if isinstance(found, str) else None
        if raw.get("alg") != ALG:
            why = f"alg is {raw.get('alg')!r}, not {ALG!r}"
            return cls(key_id=kid, value=b"", payload=payload, malformed=why)
        text = raw.get("value")
        try:
            value = base64.b64decode(text, validate=True) if isinstance(text, str) else None
        except (binascii.Error, ValueError):
            value = None
        if value is None or kid is None:
            why = "no base64 value or no key_id"
            return cls(key_id=kid, value=b"", payload=payload, malformed=why)
        return cls(key_id=kid, value=value, payload=payload)


def signature_problem(
    signature: CalibrationSignature | None, trusted: Mapping[str, Ed25519PublicKey]
) -> str | None:
    """Why a calibration file is not signed by one of ``trusted`` (key id → public key), or
    None when it is. Unsigned, malformed, signed by a key not trusted here, and a signature
    that does not verify (the file was edited after it was signed) each say so."""
    if signature is None:
        return "it is not signed"
    if signature.malformed is not None:
        return f"its signature is malformed ({signature.malformed})"
    key = trusted.get(signature.key_id or "")
    if key is None:
        known = ", ".join(sorted(trusted)) or "none"
        return f"it is signed by {signature.key_id}, which is not a trusted key (trusted: {known})"
    try:
        key.verify(signature.value, signature.payload)
    except InvalidSignature:
        return (
            f"its signature by {signature.key_id} does not verify: the file was edited after it "
            "was signed (or the signature was copied from another file)"
        )
    return None
