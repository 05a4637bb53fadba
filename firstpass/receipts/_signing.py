"""Signed checkpoints: Ed25519 signatures over chain heads, written into the log itself.

A hash chain proves its own prefix, but whoever can write the file can rewrite it from the
genesis hash with every hash recomputed. A checkpoint line carries a signature, by a key the
writer holds and the rewriter does not, over the hash of the line just before it; so a log
rewritten from genesis no longer verifies under ``--pubkey``: its checkpoints either are gone
(none left: it cannot be tied to the key) or sign heads that are no longer in the chain.

The writer calls ``CheckpointSigner.checkpoint(head)`` in its own thread every ``interval_s``
and at close, and links the record right after ``head``; so a checkpoint's ``prev_hash`` is
the head it signs. Lines after the last checkpoint are not signed yet (the live log's newest
lines); a clean shutdown signs the head.

A checkpoint vouches only for lines its own writer wrote: it also signs ``since``, the head
from which it vouches (the head the writer inherited at start, via ``begin``, for its first
checkpoint; the head its previous checkpoint signed for the others). Otherwise a writer
restarted on a log rewritten while the server was stopped would sign the forged head. So the
lines between one checkpoint's head and the next one's ``since`` are signed by no one: lines
written before a crash that came before a checkpoint (or forged), which ``verify_checkpoints``
reports, unless they are all lines the writer adds itself (a checkpoint, a gap marker).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import socket
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from firstpass._json import JSON, JSONObject
from firstpass.errors import ConfigError, ReceiptError
from firstpass.receipts._canonical import GENESIS_HASH, HASH_RE, canonical_bytes
from firstpass.receipts._chain import VerifyReport, verify_chain
from firstpass.receipts._ids import new_receipt_id
from firstpass.receipts._special import utc_now

__all__ = [
    "CHECKPOINT_KIND",
    "CheckpointSigner",
    "KeyFiles",
    "SignatureProblem",
    "SignatureReport",
    "key_id",
    "load_public_key",
    "load_signing_key",
    "verify_checkpoints",
    "write_key_files",
]

#: ``kind`` (and ``mode``) of a checkpoint line
CHECKPOINT_KIND = "checkpoint"
#: what a signature is for, inside the signed bytes: a signature made with the same key for
#: anything else can never pass as a checkpoint's
PURPOSE = "firstpass.receipts.checkpoint.v1"
#: the key path every signing-key error names
KEY_PATH = "receipts.signing_key"

#: the bytes only a checkpoint line holds (canonical JSON: no spaces): every other line is
#: counted without a JSON parse
_CHECKPOINT_MARK = b'"kind":"checkpoint"'
_READ_BUFFER = 1 << 20


def key_id(public_key: Ed25519PublicKey) -> str:
    """``ed25519:`` + the first 16 hex digits of SHA-256 over the raw public key: a name to
    tell keys apart in messages and records, not a secret."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


class CheckpointSigner:
    """Makes checkpoint records for the writer (its ``checkpointer``): one Ed25519 signature
    over ``{head, since, time, key_id, host, pid, purpose}`` each, ~40 µs, in the writer's
    thread. ``since`` is signed once ``begin`` was called (the writer always calls it); it
    follows one chain, so give each writer its own signer (the key may be shared)."""

    def __init__(self, key: Ed25519PrivateKey, *, interval_s: float) -> None:
        if not interval_s > 0:
            raise ReceiptError(f"a checkpoint interval must be positive, not {interval_s!r}")
        self._key = key
        self.interval_s = float(interval_s)
        self.key_id = key_id(key.public_key())
        self._host = socket.gethostname()
        self._since: str | None = None

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, interval_s: float) -> CheckpointSigner:
        """A signer with the key at ``path`` (reads a file: call it off the event loop)."""
        return cls(load_signing_key(path), interval_s=interval_s)

    def begin(self, head: str) -> None:
        """The next checkpoint vouches for the lines after ``head`` only (the head the writer
        inherited at start); each later one for the lines after the head the one before it
        signed."""
        self._since = head

    def checkpoint(self, head: str) -> JSONObject:
        """The checkpoint record signing ``head`` (the writer adds ``prev_hash`` = ``head``)
        and, after ``begin``, ``since``: the lines between ``since`` and ``head`` are the ones
        this checkpoint vouches for."""
        now = utc_now()
        signed: JSONObject = {
            "head": head,
            "time": now,
            "key_id": self.key_id,
            "host": self._host,
            "pid": os.getpid(),
            "purpose": PURPOSE,
        }
        if self._since is not None:
            signed["since"] = self._since
            self._since = head
        signature = self._key.sign(canonical_bytes(signed))
        return {
            "id": new_receipt_id(),
            "kind": CHECKPOINT_KIND,
            "mode": CHECKPOINT_KIND,
            "time": now,
            "signed": signed,
            "signature": base64.b64encode(signature).decode("ascii"),
        }


# -- keys ------------------------------------------------------------------------------------


def load_signing_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """The Ed25519 private key at ``path``; ``ConfigError`` naming ``receipts.signing_key``
    when it is missing, unreadable, readable by group or others, or not an Ed25519 key."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = fh.read()
    except FileNotFoundError:
        raise ConfigError(
            KEY_PATH, f"{shown} does not exist; create it with `firstpass keygen --out {shown}`"
        ) from None
    except OSError as exc:
        raise ConfigError(
            KEY_PATH, f"cannot read {shown} ({exc.strerror or exc}); check the path and owner"
        ) from None
    if not stat.S_ISREG(mode):
        raise ConfigError(KEY_PATH, f"{shown} is not a regular file")
    if b"PUBLIC KEY" in data and b"PRIVATE KEY" not in data:
        private = shown.removesuffix(".pub") if shown.endswith(".pub") else "the private key"
        raise ConfigError(
            KEY_PATH,
            f"{shown} is a public key (the `.pub` half); a signing key is the private half "
            f"`firstpass keygen --out FILE` wrote as FILE: use {private}",
        )
    if mode & 0o077:
        raise ConfigError(
            KEY_PATH,
            f"{shown} is readable by group or others (mode {stat.S_IMODE(mode):04o}); a signing"
            f" key must be private: run `chmod 600 {shown}`",
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise ConfigError(
            KEY_PATH, f"{shown} is encrypted; use an unencrypted key from `firstpass keygen`"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise ConfigError(
            KEY_PATH,
            f"{shown} is not a PEM private key; create one with `firstpass keygen --out {shown}`",
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            KEY_PATH,
            f"{shown} is not an Ed25519 key (RSA, EC...); create one with `firstpass keygen`",
        )
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """The Ed25519 public key (PEM) at ``path``; ``ReceiptError`` saying what is wrong.

    A public key is what signatures are trusted by, so a file that group or others may write
    (anyone there could put their own key in it) is refused, and so is a file holding more
    than one PEM block (which of them is meant would be a guess)."""
    shown = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = fh.read()
    except OSError as exc:
        raise ReceiptError(f"{shown}: cannot read the public key: {exc.strerror or exc}") from None
    if b"PRIVATE KEY" in data:
        raise ReceiptError(
            f"{shown} is a private key; verify with the public one (`{shown}.pub`, written beside"
            " it by `firstpass keygen`), and keep the private key where it is"
        )
    if mode & 0o022:
        raise ReceiptError(
            f"{shown} is writable by group or others (mode {stat.S_IMODE(mode):04o}): anyone "
            f"there could replace the key that signatures are trusted by; run `chmod go-w {shown}`"
        )
    blocks = data.count(b"-----BEGIN ")
    if blocks > 1:
        raise ReceiptError(
            f"{shown} holds {blocks} PEM blocks: one key per file (the `.pub` file `firstpass "
            "keygen` wrote); list each trusted key's file on its own"
        )
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise ReceiptError(
            f"{shown} is not a PEM public key (the `.pub` file `firstpass keygen` wrote)"
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise ReceiptError(f"{shown} is not an Ed25519 public key")
    return key


@dataclass(frozen=True, kw_only=True)
class KeyFiles:
    """What ``write_key_files`` wrote."""

    private: Path
    public: Path
    key_id: str


def write_key_files(out: str | os.PathLike[str], *, force: bool = False) -> KeyFiles:
    """Create a new Ed25519 key: ``out`` (PKCS8 PEM, unencrypted, mode 0600) and ``out.pub``.

    Each file appears whole or not at all (written to a temporary file, then linked in place);
    an existing file is kept, and ``ReceiptError`` raised, unless ``force``.
    """
    private_path = Path(out)
    public_path = private_path.with_name(private_path.name + ".pub")
    if not force:
        for existing in (private_path, public_path):
            if existing.exists():
                raise ReceiptError(
                    f"{existing} already exists; keeping it (a new key cannot verify what the old"
                    " one signed). Pass --force to replace it, or choose another --out"
                )
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    try:
        private_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ReceiptError(f"cannot create {private_path.parent}: {exc.strerror or exc}") from None
    # --force: the key being replaced is kept (a hard link) until the new pair is in place, so
    # a public half that cannot be written leaves the old pair as it was, not no key at all
    kept = _keep(private_path) if force else None
    try:
        _place(private_path, private_pem, 0o600, force=force)
        try:
            _place(public_path, public_pem, 0o644, force=force)
        except BaseException:
            if kept is not None:
                os.replace(kept, private_path)
            else:
                private_path.unlink(missing_ok=True)  # never a private key without its public
            raise
    finally:
        if kept is not None:
            kept.unlink(missing_ok=True)
    return KeyFiles(private=private_path, public=public_path, key_id=key_id(key.public_key()))


def _keep(path: Path) -> Path | None:
    """A second name for the file at ``path`` (a hard link beside it), or ``None`` when there
    is no file there to keep."""
    kept = path.with_name(f".{path.name}.{os.getpid()}.{time.time_ns()}.old")
    try:
        os.link(path, kept, follow_symlinks=False)
    except OSError:
        return None
    return kept


def _place(path: Path, data: bytes, mode: int, *, force: bool) -> None:
    """Write ``data`` to a new file at ``path`` with ``mode``, atomically; without ``force``
    ``os.link`` refuses an existing ``path`` (O_EXCL semantics, no window to overwrite)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.time_ns()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as exc:
        raise ReceiptError(f"cannot create {path}: {exc.strerror or exc}") from None
    try:
        try:
            os.fchmod(fd, mode)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if force:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    except FileExistsError:
        raise ReceiptError(f"{path} already exists; pass --force to replace it") from None
    except OSError as exc:
        raise ReceiptError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


# -- verification ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SignatureProblem:
    """One checkpoint (or log) that does not hold up: ``line`` is 1-based in ``path``, 0 for
    the log as a whole."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return (
            f"{self.path}:{self.line}: {self.reason}"
            if self.line
            else f"{self.path}: {self.reason}"
        )


@dataclass(frozen=True, kw_only=True)
class SignatureReport:
    """The outcome of ``verify_checkpoints`` over one chain (its files in order).

    ``unsigned_tail_lines`` counts the lines after the last checkpoint (all of them when there
    is none): not a failure, the live log's newest lines are not signed yet. ``last_head`` and
    ``last_time`` are what the last good checkpoint signed (``None`` without one).
    """

    ok: bool
    n_lines: int
    n_checkpoints: int
    unsigned_tail_lines: int
    key_id: str
    last_head: str | None = None
    last_time: str | None = None
    problems: tuple[SignatureProblem, ...] = ()


def verify_checkpoints(
    files: Iterable[str | os.PathLike[str]],
    public_key: Ed25519PublicKey,
    *,
    reports: Sequence[VerifyReport | None] | None = None,
) -> SignatureReport:
    """Check every checkpoint of one chain (``files`` in chain order) against ``public_key``.

    Each checkpoint must be signed by this key over the head it follows in the hash chain,
    which must also be its own ``prev_hash`` (a checkpoint copied into a rewritten chain signs
    a head that is not there), and a non-empty chain needs at least one. A checkpoint vouches
    for the lines from its signed ``since`` to its head, through the chain: the lines between
    the previous good checkpoint's head (the chain's start for the first) and ``since`` were
    signed by no one (written before a crash that came before a checkpoint, or forged while
    the writer was stopped) and are a problem naming them, unless each is a line the writer
    adds itself (a checkpoint, a gap marker: a clean restart). A checkpoint without ``since``
    (written before it was signed) vouches from the previous good checkpoint's head.

    The chain is verified here as ``verify_chain`` does (``reports``: the files'
    ``VerifyReport``s, in the same order, when the caller has them already); lines past a
    break are not checked, and the break is a problem. Only lines holding
    ``"kind":"checkpoint"`` are parsed. ``ReceiptError`` if a file cannot be read.
    """
    paths = list(files)
    if reports is not None and len(reports) != len(paths):
        raise ReceiptError("verify_checkpoints: one report per file, in the same order")
    expected_id = key_id(public_key)
    problems: list[SignatureProblem] = []
    n_lines = n_checkpoints = since_last = 0
    last_head: str | None = None
    last_time: str | None = None
    shown = ""
    prev: str | None = None
    layout = _Layout()
    vouches: list[_Vouch] = []  # the good checkpoints, in chain order
    for index, path in enumerate(paths):
        shown = os.fspath(path)
        chain = reports[index] if reports is not None else verify_chain(path, prev=prev)
        if chain is None or not chain.ok:
            where = chain.first_bad_line if chain is not None else 0
            why = f" ({chain.reason})" if chain is not None and chain.reason else ""
            problems.append(
                SignatureProblem(
                    path=shown,
                    line=where or 0,
                    reason=f"the hash chain does not verify here{why}; no checkpoint from here"
                    " on is checked (run `firstpass receipts verify`)",
                )
            )
        verified = chain.n_lines if chain is not None else 0
        heads = dict(chain.checkpoints) if chain is not None else {}
        offset = n_lines  # the chain position of the head before this file's line 1
        if chain is not None and chain.n_lines:
            layout.add(path, offset, chain)
        if chain is not None and chain.n_lines:
            prev = chain.head
        elif prev is None:
            prev = GENESIS_HASH
        try:
            with open(path, "rb", buffering=_READ_BUFFER) as fh:
                for line_no, raw in enumerate(fh, 1):
                    if line_no > verified:
                        break
                    n_lines += 1
                    since_last += 1
                    if _CHECKPOINT_MARK not in raw:
                        continue
                    record = _json_object(raw)
                    if record is None or record.get("kind") != CHECKPOINT_KIND:
                        continue
                    n_checkpoints += 1
                    since_last = 0
                    reason = _checkpoint_problem(
                        record, public_key, expected_id, heads.get(line_no)
                    )
                    if reason is not None:
                        problems.append(SignatureProblem(path=shown, line=line_no, reason=reason))
                        continue
                    # the checkpoint holds up (``_checkpoint_problem``): ``signed`` is an object,
                    # its ``head`` the head the line follows, its ``since`` None or a hash, and
                    # its ``time`` what the key's holder signed (the writer's ``utc_now()``)
                    signed = cast("JSONObject", record["signed"])
                    last_head = cast(str, signed["head"])
                    last_time = cast("str | None", signed.get("time"))
                    since = cast("str | None", signed.get("since"))
                    vouches.append(
                        _Vouch(path=shown, line=line_no, at=offset + line_no, since=since)
                    )
        except OSError as exc:
            raise ReceiptError(f"{shown}: cannot read the receipt log: {exc}") from exc
        if chain is None or not chain.ok:
            break
    problems.extend(_unvouched(vouches, layout))
    if n_lines and not n_checkpoints:
        problems.append(
            SignatureProblem(
                path=shown,
                line=0,
                reason="no signed checkpoint: this log cannot be tied to the key (was it written"
                " without [receipts] signing_key, or rewritten without the key?)",
            )
        )
    return SignatureReport(
        ok=not problems,
        n_lines=n_lines,
        n_checkpoints=n_checkpoints,
        unsigned_tail_lines=since_last,
        key_id=expected_id,
        last_head=last_head,
        last_time=last_time,
        problems=tuple(problems),
    )


def _json_object(raw: bytes) -> JSONObject | None:
    try:
        value: JSON = json.loads(raw)
    except (ValueError, RecursionError):
        return None  # not a line the chain check would pass either
    return value if isinstance(value, dict) else None


def _checkpoint_problem(
    record: Mapping[str, JSON], public_key: Ed25519PublicKey, expected_id: str, linked: str | None
) -> str | None:
    """Why this checkpoint record does not hold up under ``public_key``, or ``None``.
    ``linked``: the head the line follows in the verified chain (``None``: not known)."""
    signed = record.get("signed")
    signature = record.get("signature")
    if not isinstance(signed, dict) or not isinstance(signature, str):
        return "malformed checkpoint: no 'signed' object or 'signature' string"
    if signed.get("purpose") != PURPOSE:
        return f"malformed checkpoint: 'signed.purpose' is not {PURPOSE!r}"
    since = signed.get("since")
    if since is not None and not (isinstance(since, str) and HASH_RE.fullmatch(since)):
        return "malformed checkpoint: 'signed.since' is not a hash"
    claimed_id = signed.get("key_id")
    if claimed_id != expected_id:
        return (
            f"signed by another key ({claimed_id}; the given public key is {expected_id}):"
            " pass the public key of the signing_key that wrote this log"
        )
    try:
        public_key.verify(base64.b64decode(signature, validate=True), canonical_bytes(signed))
    except (InvalidSignature, binascii.Error, ValueError, ReceiptError):
        return "signature does not verify: the checkpoint was edited or forged"
    if signed.get("head") != record.get("prev_hash"):
        return (
            f"the signed head {signed.get('head')} is not this line's prev_hash"
            f" {record.get('prev_hash')}: a checkpoint copied from another chain (was the log"
            " rewritten?)"
        )
    if linked is None:
        # verify_chain records every checkpoint laid out as the writer lays them out ("kind"
        # right after "id"); one it did not is not a line the writer wrote
        return "not a checkpoint line as the writer writes them ('kind' does not follow 'id')"
    if signed.get("head") != linked:
        # the chain links the line by its bytes; a line with a second prev_hash member (or one
        # nested before the real one) links one head and parses as another
        return (
            f"the signed head {signed.get('head')} is not the head this line follows in the"
            f" chain ({linked}): the line's links are ambiguous, or the log was rewritten"
        )
    return None


# -- what each checkpoint vouches for ---------------------------------------------------------
#
# Positions count lines along the whole chain (its files in order): position p is the head
# right after the chain's p-th verified line, 0 the head the chain starts from.


@dataclass(frozen=True, kw_only=True)
class _Vouch:
    """A good checkpoint: its place, and the ``since`` it signed (``None``: an older one)."""

    path: str
    line: int
    at: int  # its own chain position (its head is at ``at - 1``)
    since: str | None


class _Layout:
    """Where heads and special lines lie along the chain, from the files' ``VerifyReport``s."""

    def __init__(self) -> None:
        self.files: list[tuple[str | os.PathLike[str], int, VerifyReport]] = []
        self.heads: dict[str, int] = {}  # head -> position (the ones the reports name)
        self.special: set[int] = set()  # positions of checkpoint and gap lines
        self.start: str | None = None  # the head the chain starts from

    def add(self, path: str | os.PathLike[str], offset: int, chain: VerifyReport) -> None:
        self.files.append((path, offset, chain))
        if chain.first_prev is not None:
            self.heads.setdefault(chain.first_prev, offset)
            if self.start is None:
                self.start = chain.first_prev
        for line, head in chain.checkpoints:
            self.heads.setdefault(head, offset + line - 1)
        for line, head in chain.special_heads:
            self.heads.setdefault(head, offset + line)
            self.special.add(offset + line)

    def locate(self, wanted: set[str]) -> None:
        """Find heads no report names (a line that is not special): one more pass, made only
        when some checkpoint vouches from such a head (a crash, a forged log)."""
        for path, offset, chain in self.files:
            found = verify_chain(path, prev=chain.first_prev, find=wanted).found
            for line, head in found:
                if line <= chain.n_lines:
                    self.heads.setdefault(head, offset + line)

    def where(self, position: int) -> tuple[str, int]:
        """The file and line of the line at ``position``."""
        for path, offset, chain in self.files:
            if offset < position <= offset + chain.n_lines:
                return os.fspath(path), position - offset
        raise AssertionError(f"no line at chain position {position}")  # pragma: no cover

    def lines(self, first: int, last: int, here: str) -> str:
        """``lines 3-9`` (of the file ``here``), ``line 3 of F``, ``lines F:40 to G:3``."""
        (a_path, a), (b_path, b) = self.where(first), self.where(last)
        if a_path != b_path:
            return f"lines {a_path}:{a} to {b_path}:{b}"
        of = "" if a_path == here else f" of {a_path}"
        return f"line {a}{of}" if a == b else f"lines {a}-{b}{of}"


def _unvouched(vouches: Sequence[_Vouch], layout: _Layout) -> list[SignatureProblem]:
    """The lines no good checkpoint vouches for, before the last one: between a checkpoint's
    head (the chain's start before the first) and the next one's ``since``, lines that are not
    checkpoints or gap markers."""
    unknown = {v.since for v in vouches if v.since is not None and v.since not in layout.heads}
    if unknown:
        layout.locate(unknown)
    problems: list[SignatureProblem] = []
    vouched = 0  # everything up to this position is vouched for (or is the chain's start)
    for index, vouch in enumerate(vouches):
        since = vouched if vouch.since is None else layout.heads.get(vouch.since)
        if since is None and index == 0 and layout.start != GENESIS_HASH:
            since = 0  # the files given start after a head of earlier files, left out
        if since is None or since > vouch.at - 1:
            problems.append(
                SignatureProblem(
                    path=vouch.path,
                    line=vouch.line,
                    reason=f"it vouches from {vouch.since}, a head that is not in this chain"
                    " before it (was the log rewritten?)",
                )
            )
        else:
            first = vouched + 1
            while first <= since and first in layout.special:
                first += 1
            if first <= since:
                last = since
                while last in layout.special:
                    last -= 1
                what = layout.lines(first, last, vouch.path)
                is_, it_was, it = (
                    ("is", "it was", "it") if first == last else ("are", "they were", "them")
                )
                problems.append(
                    SignatureProblem(
                        path=vouch.path,
                        line=vouch.line,
                        reason=f"{what} {is_} not vouched for: {it_was} never signed by this key,"
                        " written before a crash that came before a checkpoint, or rewritten"
                        " while the server was stopped (this checkpoint's writer started after"
                        f" {it})",
                    )
                )
        vouched = vouch.at - 1
    return problems
