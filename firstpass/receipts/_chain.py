"""The hash chain: linking a record to the one before it, and re-deriving every link.

A line is the canonical JSON of the record with ``prev_hash`` (the previous line's ``hash``, or
``GENESIS_HASH`` on line 1) and ``hash`` (over the canonical record without ``hash``), then
``\\n``. Verification streams the file and stops at the first line that does not hold up.

Verifying re-derives each hash from the bytes on disk: the line with its ``"hash":"…",`` member
cut out is exactly the canonical record without ``hash``, so hashing that slice needs no JSON
parse (1M lines verify in seconds). A line that fails this fast check is parsed and re-serialised
to say precisely what is wrong; ``strict=True`` does that for every line and also requires each
line to be byte-for-byte canonical.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, TypedDict, cast

from firstpass._json import JSON, JSONObject
from firstpass.errors import ReceiptError
from firstpass.receipts._canonical import (
    GENESIS_HASH,
    HASH_LEN,
    HASH_PREFIX,
    HASH_RE,
    EncodedRecord,
    canonical_bytes,
    record_hash,
)
from firstpass.receipts._special import SPECIAL_KINDS

_HASH_MEMBER = b'"hash":"sha256:'
_PREV_MEMBER = b'"prev_hash":"'
_HEX_LEN = 64
_READ_BUFFER = 1 << 20


class _Digester(Protocol):
    """A running hash, as ``hashlib.sha256(...)`` returns it."""

    def update(self, data: memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


#: ``hashlib.sha256`` (passed in as a local: a line loop saves the global lookups)
Sha256 = Callable[[memoryview], _Digester]


@dataclass(frozen=True, kw_only=True)
class Gap:
    """A gap marker in a chain: the writer recorded, in the chain itself, that lines were lost
    (a torn last line after a crash, receipts dropped while the disk failed)."""

    line: int
    reason: str
    lost_receipts: int | None = None
    lost_bytes: int | None = None
    moved_to: str | None = None


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """The outcome of ``verify_chain``.

    ``n_lines`` counts the lines that verified (all of them when ``ok``); ``head`` is the hash of
    the last verified line (``GENESIS_HASH`` for none), the value to anchor elsewhere.
    ``first_bad_line`` (1-based) and ``reason`` are ``None`` when ``ok``. ``gaps`` lists the gap
    markers among the verified lines (a chain with gaps is ``ok``: the loss is recorded, not
    hidden); ``n_special`` counts the verified lines that are not requests (gaps, checkpoints).
    ``first_prev`` is the first line's ``prev_hash`` (``None`` for an empty file) and
    ``good_bytes`` the length of the verified prefix. ``checkpoints`` lists each verified
    checkpoint line as ``(line, head)``: the hash of the line before it, which is what the
    chain links it to and so what its signature must be over (``verify_checkpoints``).
    ``special_heads`` lists each verified gap marker and checkpoint line as ``(line, hash)``
    (its own hash: the head right after it), and ``found`` each verified line whose hash is
    one of ``verify_chain``'s ``find`` as ``(line, hash)``: where a head lies in the chain.
    """

    ok: bool
    n_lines: int
    head: str
    first_bad_line: int | None = None
    reason: str | None = None
    gaps: tuple[Gap, ...] = ()
    n_special: int = 0
    first_prev: str | None = None
    good_bytes: int = 0
    checkpoints: tuple[tuple[int, str], ...] = ()
    special_heads: tuple[tuple[int, str], ...] = ()
    found: tuple[tuple[int, str], ...] = ()
    #: each verified ``revocation`` line as ``(line, what it revoked)``: a licence and its
    #: evidence (``firstpass.monitor``)
    revocations: tuple[tuple[int, str], ...] = ()

    @property
    def n_receipts(self) -> int:
        """Verified lines that are request receipts."""
        return self.n_lines - self.n_special

    @property
    def torn(self) -> bool:
        """The only damage is an incomplete last line (a crash mid-write)."""
        return not self.ok and (self.reason or "").startswith("truncated")


class CheckedLine(TypedDict):
    """A line as ``check_line`` returns it: a JSON object (``dict[str, JSON]``) whose ``hash``
    and ``prev_hash`` it checked are well-formed hashes. Its other members are JSON values,
    read with ``.get`` (typed ``object``) and narrowed where they are used."""

    hash: str
    prev_hash: str


class BadLine(Exception):
    """Why one line does not verify (internal: becomes a ``VerifyReport`` or a ``ReceiptError``)."""


def link(encoded: EncodedRecord, prev_hash: str) -> tuple[bytes, str]:
    """The full line (with ``\\n``) for ``encoded`` after ``prev_hash``, and its hash."""
    line = bytearray(encoded.data)
    line[encoded.prev_at : encoded.prev_at + HASH_LEN] = prev_hash.encode()
    # the hashed bytes are the line without its '"hash":"…",' member ("id" always follows it)
    member_start = encoded.hash_at - len(b'"hash":"')
    member_end = encoded.hash_at + HASH_LEN + len(b'",')
    view = memoryview(line)
    digester = hashlib.sha256(view[:member_start])
    digester.update(view[member_end:])
    view.release()
    digest = HASH_PREFIX + digester.hexdigest()
    line[encoded.hash_at : encoded.hash_at + HASH_LEN] = digest.encode()
    line += b"\n"
    return bytes(line), digest


def check_line(raw: bytes, *, strict: bool = False) -> CheckedLine:
    """Parse one line and re-derive its own hash (not its link); ``BadLine`` says what is wrong."""
    if not raw.endswith(b"\n"):
        raise BadLine("truncated: the last line is incomplete (no newline; an interrupted write)")
    body = raw[:-1]
    if not body.strip():
        raise BadLine("not JSON: empty line")
    record = _parse_object(body)
    for key in ("hash", "prev_hash"):
        value = record.get(key)
        if value is None:
            raise BadLine(f"no {key!r} key")
        if not isinstance(value, str) or not HASH_RE.fullmatch(value):
            raise BadLine(
                f"ill-formed {key!r}: {value!r} is not 'sha256:' + 64 lowercase hex digits"
            )
    try:
        derived = record_hash(record)
    except ReceiptError as exc:
        raise BadLine(str(exc)) from exc
    if derived != record["hash"]:
        raise BadLine(
            f"hash mismatch: the content hashes to {derived}, the line says {record['hash']}"
            " (the line was edited)"
        )
    if strict and canonical_bytes(record) != body:
        raise BadLine("not in canonical form (the content is intact but was re-serialised)")
    return cast(CheckedLine, record)  # its hash and prev_hash are strings: checked above


def check_link(
    record: Mapping[str, object], prev_hash: str, line_no: int, genesis: bool | None = None
) -> None:
    """``BadLine`` unless ``record`` points at ``prev_hash``. ``genesis``: whether line 1 must
    link to the genesis hash (the default) or to a previous file's head."""
    if record["prev_hash"] == prev_hash:
        return
    if line_no == 1 and (genesis if genesis is not None else prev_hash == GENESIS_HASH):
        raise BadLine(
            f"broken link: the first line's prev_hash is {record['prev_hash']}, not the genesis"
            f" hash {GENESIS_HASH} (lines before it were deleted?)"
        )
    if line_no == 1:
        raise BadLine(
            f"broken link: the first line's prev_hash is {record['prev_hash']}, but the"
            f" previous file ends at {prev_hash} (a file between them is missing or was edited)"
        )
    raise BadLine(
        f"broken link: prev_hash is {record['prev_hash']} but line {line_no - 1} has hash"
        f" {prev_hash} (a line was deleted, inserted or reordered)"
    )


def verify_chain(
    path: str | os.PathLike[str],
    *,
    strict: bool = False,
    prev: str | None = GENESIS_HASH,
    find: Collection[str] = (),
) -> VerifyReport:
    """Re-derive every hash and link of the receipt log at ``path``, streaming it.

    Catches an edited, reordered, deleted or inserted line, a truncated last line, a non-JSON line
    and a missing or ill-formed hash, and names the first bad line. ``prev`` is the hash line 1
    must link to: the genesis hash for a log's first file, the previous file's head for a rotated
    one, ``None`` to take line 1's own ``prev_hash`` as given (checking the file on its own).
    ``find``: hashes to locate (``VerifyReport.found``). ``ReceiptError`` if the file cannot be
    read at all.
    """
    name = os.fspath(path)
    try:
        with open(path, "rb", buffering=_READ_BUFFER) as fh:
            return verify_stream(fh, strict=strict, prev=prev, find=find, name=name)
    except OSError as exc:
        raise ReceiptError(f"{name}: cannot read the receipt log: {exc}") from exc


def verify_stream(
    fh: Iterable[bytes],
    *,
    strict: bool = False,
    prev: str | None = GENESIS_HASH,
    find: Collection[str] = (),
    name: str = "<stream>",
) -> VerifyReport:
    """``verify_chain`` over any binary stream of lines (a file, a table's chain read in seq
    order): one line loop, so a chain verifies the same wherever it is stored.

    ``fh`` yields lines with their ``\\n`` (iterating a binary file does). ``name`` names the
    source in a ``ReceiptError`` when reading fails midway.
    """
    gaps: list[Gap] = []
    revocations: list[tuple[int, str]] = []
    checkpoints: list[tuple[int, str]] = []
    special_heads: list[tuple[int, str]] = []
    found: list[tuple[int, str]] = []
    wanted = frozenset(value.encode() for value in find)
    n_special = 0
    first_prev: str | None = None
    good = 0
    sha256 = hashlib.sha256
    lines: Iterator[bytes] = iter(fh)
    try:
        if prev is None:
            first = next(lines, b"")
            prev = _prev_of(first)
            lines = itertools.chain((first,), lines) if first else lines
        prev_bytes = prev.encode()
        n_ok = 0
        for line_no, raw in enumerate(lines, 1):
            record: Mapping[str, object] | None = None
            digest = None if strict else _fast_check(raw, prev_bytes, sha256)
            try:
                if digest is None:
                    record = check_line(raw, strict=strict)
                    check_link(record, prev_bytes.decode(), line_no)
                    digest = record["hash"].encode()
                kind = None
                if _may_be_special(raw):
                    kind, record = _special_kind(raw, record)
            except BadLine as bad:
                return VerifyReport(
                    ok=False,
                    n_lines=n_ok,
                    head=prev_bytes.decode(),
                    first_bad_line=line_no,
                    reason=str(bad),
                    gaps=tuple(gaps),
                    n_special=n_special,
                    first_prev=first_prev,
                    good_bytes=good,
                    checkpoints=tuple(checkpoints),
                    special_heads=tuple(special_heads),
                    found=tuple(found),
                    revocations=tuple(revocations),
                )
            if line_no == 1:
                first_prev = prev_bytes.decode()
            if kind is not None and record is not None:
                n_special += 1
                if kind == "gap":
                    gaps.append(_gap(line_no, record))
                elif kind == "revocation":
                    revocations.append((line_no, _revocation_text(record)))
                elif kind == "checkpoint":
                    # the head this line follows in the chain, as linked above: what a
                    # checkpoint must sign (its parsed prev_hash may say otherwise)
                    checkpoints.append((line_no, prev_bytes.decode()))
                if kind in SPECIAL_KINDS:
                    special_heads.append((line_no, digest.decode()))
            if wanted and digest in wanted:
                found.append((line_no, digest.decode()))
            prev_bytes = digest
            good += len(raw)
            n_ok += 1
    except OSError as exc:
        raise ReceiptError(f"{name}: cannot read the receipt log: {exc}") from exc
    return VerifyReport(
        ok=True,
        n_lines=n_ok,
        head=prev_bytes.decode(),
        gaps=tuple(gaps),
        n_special=n_special,
        first_prev=first_prev,
        good_bytes=good,
        checkpoints=tuple(checkpoints),
        special_heads=tuple(special_heads),
        found=tuple(found),
        revocations=tuple(revocations),
    )


_KIND_AFTER_ID = b',"kind":"'


def _may_be_special(raw: bytes) -> bool:
    """Whether a line may carry a top-level ``kind`` (a gap marker, a checkpoint), cheaply.

    Keys sort, so a top-level ``kind`` directly follows ``id``, which directly follows
    ``hash``; a request's nested ``kind`` (a check run's stage) sits under ``checks``, before
    ``hash``. One search for the hash member and two short steps; a line this says may be
    special is parsed to be sure.
    """
    at = raw.find(_HASH_MEMBER)
    if at < 0:
        return False
    id_at = at + len(_HASH_MEMBER) + _HEX_LEN + 2  # past '<hex>",'
    if not raw.startswith(b'"id":"', id_at):
        return b'"kind":"' in raw  # not the writer's layout: look everywhere
    close = raw.find(b'"', id_at + 6)
    return close > 0 and raw.startswith(_KIND_AFTER_ID, close + 1)


def _prev_of(first: bytes) -> str:
    """Line 1's ``prev_hash`` (the genesis hash when it has none readable)."""
    try:
        record: JSON = json.loads(first) if first else None
        value = record.get("prev_hash") if isinstance(record, dict) else None
    except (ValueError, RecursionError):
        value = None
    return value if isinstance(value, str) and HASH_RE.fullmatch(value) else GENESIS_HASH


def _special_kind(
    raw: bytes, record: Mapping[str, object] | None
) -> tuple[str | None, Mapping[str, object]]:
    """The top-level ``kind`` of a verified line that may carry one (parsed only then), and the
    parsed line. ``BadLine`` when its bytes hash and link but are not a JSON object (a line
    forged to pass the byte-level check: readers could not read it)."""
    if record is None:
        record = _parse_object(raw)
    kind = record.get("kind")
    return (kind if isinstance(kind, str) else None), record


def _parse_object(raw: bytes) -> JSONObject:
    """A line's JSON object; ``BadLine`` saying why it is not one."""
    try:
        record: JSON = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadLine(f"not UTF-8 text (byte {exc.start + 1})") from exc
    except json.JSONDecodeError as exc:
        raise BadLine(f"not JSON: {exc.msg} at column {exc.colno}") from exc
    except RecursionError as exc:
        raise BadLine("not a receipt: JSON nested too deeply to read") from exc
    except ValueError as exc:  # an integer of more than 4,300 digits (int_max_str_digits)
        raise BadLine(f"not a receipt: {exc}") from exc
    if not isinstance(record, dict):
        raise BadLine(f"not a receipt: a JSON {type(record).__name__}, not an object")
    return record


def _revocation_text(data: Mapping[str, object]) -> str:
    """A revocation line as ``receipts verify`` lists it."""
    return (
        f"licence {data.get('licence')} revoked at {data.get('revoked_at', data.get('time'))}: "
        f"{data.get('failures')} of {data.get('audited')} audited skips failed, rate above "
        f"{data.get('bound')} > alpha {data.get('alpha')} (level {data.get('level')})"
    )


def _gap(line_no: int, data: Mapping[str, object]) -> Gap:

    def number(key: str) -> int | None:
        value = data.get(key)
        return value if type(value) is int else None

    moved = data.get("moved_to")
    return Gap(
        line=line_no,
        reason=str(data.get("reason", "")),
        lost_receipts=number("lost_receipts"),
        lost_bytes=number("lost_bytes"),
        moved_to=moved if isinstance(moved, str) else None,
    )


def _fast_check(raw: bytes, prev: bytes, sha256: Sha256) -> bytes | None:
    """The line's hash if its bytes hash and link correctly, else ``None`` (then parse it)."""
    if raw[-1:] != b"\n":
        return None
    links = line_links(raw, 0, len(raw) - 1, sha256=sha256)
    if links is None or links[1] != prev:
        return None
    return links[0]


def line_links(
    buf: bytes | mmap.mmap,
    start: int,
    end: int,
    *,
    view: memoryview | None = None,
    sha256: Sha256 = hashlib.sha256,
) -> tuple[bytes, bytes] | None:
    """``(hash, prev_hash)`` of the line ``buf[start:end]`` (no newline) when its bytes hash to
    the ``hash`` it carries, both as ``b"sha256:…"``; ``None`` when this byte-level check cannot
    vouch for it (then parse it).

    ``buf`` is ``bytes`` or an ``mmap`` (``view``, a memoryview of it, saves making one per
    line): a log can be checked where it lies, without copying lines out. Cuts the first
    ``"hash":"sha256:…",`` member out of the line and hashes the rest; the link is the first
    ``prev_hash`` member after it. In a line the writer wrote those are the top-level members;
    a nested one matches only if whoever wrote the line computed its hash and placed it there
    on purpose (a forgery, which could as well have been a well-formed line: the chain proves a
    prefix against a kept head, nothing more). The link is not checked here, so a log can be
    checked in spans whose ends are joined afterwards.
    """
    at = buf.find(_HASH_MEMBER, start, end)
    if at <= start or buf[at - 1] not in b"{,":
        return None
    value_start = at + 8  # len('"hash":"')
    hex_start = value_start + 7  # len("sha256:")
    hex_end = hex_start + _HEX_LEN
    if hex_end + 2 >= end or buf[hex_end : hex_end + 2] != b'",' or buf[end - 1] != 125:  # }
        return None
    if view is None:
        view = memoryview(buf)
    digester = sha256(view[start:at])
    digester.update(view[hex_end + 2 : end])
    if digester.hexdigest().encode() != buf[hex_start:hex_end]:
        return None
    # prev_hash sorts after hash (and id, mode): the first one after it is the top-level one
    link_at = buf.find(_PREV_MEMBER, hex_end, end)
    if link_at < 0 or buf[link_at - 1] != 44:  # ","
        return None
    link_start = link_at + 13  # len('"prev_hash":"')
    link_end = link_start + 7 + _HEX_LEN
    if buf[link_end : link_end + 1] != b'"' or link_end >= end:
        return None
    return buf[value_start:hex_end], buf[link_start:link_end]


def read_tail_hash(path: str | os.PathLike[str]) -> str:
    """The hash of the last line of an existing log after re-deriving it, or ``GENESIS_HASH``.

    Runs in the writer's thread at start. A corrupt or truncated tail is a ``ReceiptError``: the
    writer must not extend a chain it cannot vouch for.
    """
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        if end == 0:
            return GENESIS_HASH
        tail = b""
        pos = end
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            fh.seek(pos)
            tail = fh.read(step) + tail
            # the last line starts after the last newline before the final byte
            cut = tail.rfind(b"\n", 0, len(tail) - 1)
            if cut >= 0:
                tail = tail[cut + 1 :]
                break
    try:
        record = check_line(tail)
    except BadLine as bad:
        raise ReceiptError(
            f"{os.fspath(path)}: the last line does not verify ({bad}); refusing to extend the"
            f" chain. Run `firstpass receipts verify {os.fspath(path)}` to see where it breaks"
        ) from None
    return str(record["hash"])
