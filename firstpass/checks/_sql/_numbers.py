"""Numbers stated in an answer, and whether the evidence holds each one.

Tolerant the way people write numbers: thousands separators in the English, French (``1 234,5``
with a space or a (narrow) no-break space), German (``1.234,5``) and Indian (``12,34,567``)
styles, a decimal comma, rounding (``3.14`` for 3.14159: equal within half a unit of the last
digit shown), percentages (``42%`` for 0.42 or 42), scales (``250k``, ``1.2M``, ``2.5bn``,
``1.2 million``), a minus or a Unicode minus. A separator that reads two ways (``1,234`` is 1234
in English and 1.234 in French) holds when either reading does. Numbers next to CJK characters
are read (``共有7位歌手`` states 7). Not numbers here: dates and times (``2021-03-04``,
``3/4/2021``, ``10:30``, ``March 4, 2021``), a year said as a time (``as of 2024``, ``in 2019``,
``from 2019 to 2021``), list markers (``1.`` at a line's start, or ``1. Alice 2. Bob``), digits
inside words (``T2``, ``COVID-19``). Scans are linear regular expressions over the model's text;
lookups go through ``Values``, an index built once per answer (a set and a sorted array).
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, replace

__all__ = ["MAX_STATED", "MAX_VALUES", "Stated", "Values", "evidence_numbers", "holds",
           "stated_numbers"]  # fmt: skip

#: numbers of one answer checked at most (the rest are counted, not checked)
MAX_STATED = 200
#: distinct evidence values indexed at most (past it, the rest are not considered)
MAX_VALUES = 200_000
#: characters of one text scanned for numbers at most
MAX_TEXT_CHARS = 100_000

#: scripts written without spaces between words: a digit next to them starts a number
_CJK = (
    "\u2e80-\u2fff\u3000-\u303f\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"
)
#: a letter or digit of a script that spaces its words
_W = rf"[^\W{_CJK}]"
#: a letter (not a digit) of a script that spaces its words
_L = rf"[^\W\d{_CJK}]"
_MONTH = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\b\.?"
)
_DATES = re.compile(
    r"\b\d{4}-\d{1,2}-\d{1,2}(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?\b"
    r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    # 2021/03/04 and 04.03.2021: a real month and day, so "4096/64/8" is still arithmetic
    r"|\b\d{4}/(?:0?[1-9]|1[0-2])/(?:0?[1-9]|[12]\d|3[01])\b"
    r"|(?<![\d.,])(?:0?[1-9]|[12]\d|3[01])\.(?:0?[1-9]|1[0-2])\.\d{4}\b"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\b"
    # "at 3 pm", "until 11 a.m.": only after a word of time, so "7 AM stations", "5 PM" (prime
    # ministers) and German "7 am Montag" stay numbers to check
    r"|\b(?:at|by|from|until|till|to|before|after|around|since|between|and)\s+"
    r"(?:1[0-2]|0?[1-9])\s?[ap]\.?m\b\.?"
    rf"|\b{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?\b(?:,?\s+\d{{4}}\b)?"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}}\b)?"
    rf"|\b{_MONTH}\s+\d{{4}}\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(
    # not after a letter's hyphen ("COVID-19"); after a digit's it is a range's end ("27-52")
    rf"(?<!{_W})(?<!\.)(?<!{_L}[-−])(?P<sign>[-−])?"
    # digit runs joined by separators: "," and "." always, a (narrow) no-break or thin space
    # or a Swiss apostrophe before three digits (a plain space of "1 234,5" is made a thin
    # space first: ``_spaced``)
    r"(?P<body>\d+(?:(?:[.,]|[\u00a0\u202f\u2009'\u2019](?=\d{3}(?!\d)))\d+)*)"
    r"(?:[eE](?P<exp>[-+]?\d{1,3}))?"
    r"(?:(?P<suffix>bn|mn|[kKMB])"
    r"|[ \u00a0\u202f]?(?P<word>(?i:thousand|million|billion|trillion|milliard|millionen"
    rf"|milliarden|lakh|crore|mio|mrd))s?(?!{_W}))?"
    rf"(?P<pct>\s?%|[ \u00a0]?(?i:percent|per\s?cent|pct)(?!{_W}))?"
    rf"(?!\.?{_W})"  # "1.2M" is read whole, "3e2" as 300; "T2", "5th" are no numbers
)
_SCALE = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "bn": 1e9, "mn": 1e6}
_WORD_SCALE = {
    "thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12, "milliard": 1e9,
    "millionen": 1e6, "milliarden": 1e9, "lakh": 1e5, "crore": 1e7, "mio": 1e6, "mrd": 1e9,
}  # fmt: skip
#: digits in runs joined by single plain spaces ("1 234 567"), read whole (no backtracking)
_SPACED_RUN = re.compile(r"\d+(?: \d+)+")
_SEPARATOR = re.compile(r"([.,\u00a0\u202f\u2009 '\u2019])")
#: separators that only group digits, never mark decimals (a Swiss apostrophe among them)
_SPACES = frozenset(" \u00a0\u202f\u2009'\u2019")
#: the words before a year said as a time ("as of 2024", "in 2019", "by Q3 2025")
_YEAR_BEFORE = re.compile(
    r"\b(?:in|as\s+of|since|by|until|till|through|during|from|before|after|between|year|"
    r"fy|q[1-4]|h[12]|early|mid|late|circa|end\s+of|start\s+of|beginning\s+of|spring|summer|"
    r"autumn|fall|winter)[\s,]*$",
    re.IGNORECASE,
)
#: what joins two years of one range ("from 2019 to 2021", "between 2019 and 2021")
_YEAR_RANGE = re.compile(r"^\s*(?:to|and|through|until|till|or|-|–|—)\s*$", re.IGNORECASE)
#: a list marker at a line's start ("1.", "2)", "**3.**"), or one inline ("1. Alice 2. Bob")
_LINE_MARKER = re.compile(r"^[ \t>*_#-]*(\d{1,3})[.)]\**(?=[ \t])", re.MULTILINE)
_INLINE_MARKER = re.compile(r"(?<!\S)(\d{1,3})[.)](?=[ \t]+\S)")


@dataclass(frozen=True, slots=True)
class Stated:
    """A number as the answer states it: its value, the decimals shown, a percent sign, and
    how far a value may be from it and still be what was written (half a unit of the last
    digit shown, scaled by an exponent or a k/M/B suffix). ``alternatives``: other readings
    of the same text (``1,234`` in French is 1.234); it holds when any reading does."""

    text: str
    value: float
    decimals: int
    percent: bool
    start: int
    tolerance: float = 0.5
    alternatives: tuple[Stated, ...] = ()


def _grouped(groups: list[str]) -> bool:
    """Thousands grouping: 1-3 digits, then groups of exactly three."""
    return 1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])


def _indian(groups: list[str]) -> bool:
    """Indian grouping (``12,34,567``): 1-2 digits, groups of two, a last group of three."""
    return (
        len(groups) >= 3
        and 1 <= len(groups[0]) <= 2
        and all(len(g) == 2 for g in groups[1:-1])
        and len(groups[-1]) == 3
    )


#: one reading of a number's digits: (integer digits, fraction digits)
Reading = tuple[str, str]


def _readings(body: str) -> list[list[Reading]]:
    """The numbers a run of digits and separators states: one list of readings per number
    (``1,2,3`` is three numbers; ``1,234`` one number read two ways; ``1.2.3`` none)."""
    parts = _SEPARATOR.split(body)
    groups, seps = parts[0::2], parts[1::2]
    if not seps:
        return [[(body, "")]]
    whole = "".join(groups)
    kinds = set(seps)
    if len(kinds) == 1:
        sep = seps[0]
        if sep in _SPACES:
            return [[(whole, "")]] if _grouped(groups) else [[(g, "")] for g in groups]
        if len(seps) == 1:  # "1,234" / "1.234": grouped, or a decimal mark
            decimal = (groups[0], groups[1])
            if not _grouped(groups):
                return [[decimal]]
            return [[(whole, ""), decimal]] if sep == "," else [[decimal, (whole, "")]]
        if _grouped(groups) or (sep == "," and _indian(groups)):
            return [[(whole, "")]]
        return [[(g, "")] for g in groups] if sep == "," else []  # a list; a version: none
    # several kinds: the last separator is the decimal mark, the others one grouping kind
    decimal_mark, grouping = seps[-1], set(seps[:-1])
    ints = groups[:-1]
    if (
        decimal_mark in ".,"
        and len(grouping) == 1
        and decimal_mark not in grouping
        and (_grouped(ints) or (grouping == {","} and _indian(ints)))
    ):
        return [[("".join(ints), groups[-1])]]
    out: list[list[Reading]] = []  # anything else: numbers listed with commas or spaces
    for piece in re.split(r"[,\u00a0\u202f\u2009 '\u2019]", body):
        if piece.count(".") <= 1:
            head, _, frac = piece.partition(".")
            out.append([(head, frac)])
    return out


def _markers(text: str) -> set[int]:
    """Where list markers' digits start: at a line's start, or inline in a run 1, 2, ..."""
    found = {m.start(1) for m in _LINE_MARKER.finditer(text)}
    run: list[tuple[int, int]] = []
    for m in _INLINE_MARKER.finditer(text):
        n = int(m.group(1))
        if run and n == run[-1][1] + 1:
            run.append((m.start(1), n))
            continue
        if len(run) >= 2:
            found.update(start for start, _ in run)
        run = [(m.start(1), n)] if n == 1 else []
    if len(run) >= 2:
        found.update(start for start, _ in run)
    return found


def _said_as_year(text: str, m: re.Match[str], previous_year_end: int | None) -> bool:
    """A plain four-digit number after a word of time (``as of 2024``, ``in 2019``), or the
    second year of a range (``from 2019 to 2021``)."""
    body = m.group("body")
    if (
        len(body) != 4
        or not body.isdigit()
        or not 1800 <= int(body) <= 2199
        or any(m.group(g) for g in ("sign", "exp", "suffix", "word", "pct"))
    ):
        return False
    if previous_year_end is not None and _YEAR_RANGE.match(text[previous_year_end : m.start()]):
        return True
    return _YEAR_BEFORE.search(text[max(0, m.start() - 24) : m.start()]) is not None


def _spaced(text: str) -> str:
    """``text`` with the plain spaces that group digits in ``1 234 567,5`` (groups of three
    up to a decimal comma) made thin spaces, the same length: one linear pass over runs of
    spaced digits, where a lookahead from every space rescanned the run (quadratic on
    ``"1" + " 234" * n``)."""
    if " " not in text:
        return text
    chars: list[str] | None = None
    for run in _SPACED_RUN.finditer(text):
        end = run.end()
        if not (text[end : end + 1] == "," and text[end + 1 : end + 2].isdigit()):
            continue
        groups = run.group().split(" ")
        at = end
        for g in reversed(groups[1:]):  # from the decimal comma back, while groups are three
            at -= len(g)
            if len(g) != 3:
                break
            chars = chars if chars is not None else list(text)
            chars[at - 1] = "\u2009"
            at -= 1
    return text if chars is None else "".join(chars)


def stated_numbers(text: str) -> list[Stated]:
    """Every number in ``text`` (its first ``MAX_TEXT_CHARS``), dates, years said as times
    and list markers left out."""
    text = text[:MAX_TEXT_CHARS]
    blanked = _DATES.sub(lambda m: " " * len(m.group()), text)
    markers = _markers(blanked) if any(c in blanked for c in ".)") else set()
    found: list[Stated] = []
    year_end: int | None = None
    spaced = _spaced(blanked)
    for m in _NUMBER.finditer(spaced):
        if m.start("body") in markers:
            continue
        if _said_as_year(blanked, m, year_end):
            year_end = m.end()
            continue
        year_end = None
        suffix, word = m.group("suffix"), m.group("word")
        scale = 10.0 ** int(m.group("exp") or 0) * (
            _SCALE[suffix] if suffix else _WORD_SCALE[word.lower()] if word else 1.0
        )
        negative = m.group("sign") is not None
        percent = m.group("pct") is not None
        pieces = _readings(m.group("body"))
        for readings in pieces:
            made = [
                s
                for digits, frac in readings
                if (s := _make(m, digits, frac, scale, negative, percent, len(pieces) > 1))
                is not None
            ]
            if made and spaced is not blanked and not len(pieces) > 1:
                made = [replace(s, text=_as_written(blanked, s)) for s in made]
            if made and not negative and not percent and _bracketed(spaced, m) and len(pieces) == 1:
                made += [replace(x, value=-x.value) for x in made]  # accounting: "(3.25)"
            if made:
                found.append(
                    Stated(
                        text=made[0].text,
                        value=made[0].value,
                        decimals=made[0].decimals,
                        percent=percent,
                        start=made[0].start,
                        tolerance=made[0].tolerance,
                        alternatives=tuple(made[1:]),
                    )
                )
    return found


def _bracketed(text: str, m: re.Match[str]) -> bool:
    """An amount alone in parentheses, as accounts write a negative: ``(3.25)``, ``(1,234)``;
    not a count (``(7)``) nor a call (``f(3.5)``), whose sign the parentheses do not change."""
    return (
        text[m.start() - 1 : m.start()] == "("
        and text[m.end() : m.end() + 1] == ")"
        and not re.match(r"\w", text[m.start() - 2 : m.start() - 1])
        and any(c in m.group("body") for c in ".,")
    )


def _as_written(text: str, number: Stated) -> str:
    """A number's text as the answer wrote it (a grouping space shows as a space)."""
    return text[number.start : number.start + len(number.text)]


def _make(
    m: re.Match[str],
    digits: str,
    frac: str,
    scale: float,
    negative: bool,
    percent: bool,
    listed: bool,
) -> Stated | None:
    """One reading as a ``Stated`` (``listed``: one of several numbers of one run, ``1,2,3``,
    named by its own digits)."""
    try:
        value = float(f"{digits}.{frac}" if frac else digits) * scale
    except (OverflowError, ValueError):
        return None
    if not math.isfinite(value):
        return None
    return Stated(
        text=(f"{digits}.{frac}" if frac else digits) if listed else m.group().strip(),
        value=-value if negative else value,
        decimals=len(frac),
        percent=percent,
        start=m.start(),
        tolerance=0.5 * 10.0 ** -len(frac) * scale,
    )


def evidence_numbers(cells: Iterable[object]) -> list[float]:
    """The numbers the evidence holds: numeric cells, and cells that are numeric text."""
    out: list[float] = []
    for cell in cells:
        if isinstance(cell, bool):
            continue
        if isinstance(cell, int | float):
            try:
                value = float(cell)
            except OverflowError:  # an integer past a float's range holds no stated number
                continue
            if math.isfinite(value):
                out.append(value)
        elif isinstance(cell, str) and len(cell) < 40:
            try:
                value = float(cell.replace(",", ""))
            except ValueError:
                continue
            if math.isfinite(value):
                out.append(value)
    return out


class Values:
    """Evidence values indexed once, so each stated number is a few bisections, not a scan:
    a sorted array of the distinct values (at most ``MAX_VALUES``; ``dropped`` counts the
    rest, which are not considered)."""

    __slots__ = ("dropped", "sorted")

    def __init__(self, values: Iterable[float]) -> None:
        distinct: set[float] = set()
        dropped = 0
        for v in values:
            if len(distinct) < MAX_VALUES or v in distinct:
                distinct.add(v)
            else:
                dropped += 1
        self.sorted = sorted(distinct)
        self.dropped = dropped

    def __len__(self) -> int:
        return len(self.sorted)

    def any_in(self, lo: float, hi: float, accept: _Accept) -> bool:
        """Some value in [lo, hi] that ``accept`` takes (the window is slightly wide; the
        predicate is exact)."""
        i = bisect_left(self.sorted, lo)
        while i < len(self.sorted) and self.sorted[i] <= hi:
            if accept(self.sorted[i]):
                return True
            i += 1
        return False


class _Accept:
    __slots__ = ("number",)

    def __init__(self, number: Stated) -> None:
        self.number = number

    def __call__(self, value: float) -> bool:
        return _close(self.number, value)


def _close(number: Stated, value: float) -> bool:
    """``number`` is ``value`` as written: within half a unit of its last digit shown, or the
    integer part of it (truncated, not rounded)."""
    if abs(number.value - value) <= number.tolerance + 1e-9 * max(1.0, abs(value)):
        return True
    return number.decimals == 0 and number.tolerance == 0.5 and number.value == math.trunc(value)


def _holds_one(number: Stated, index: Values) -> bool:
    v, reach = number.value, number.tolerance
    slack = 2e-9 * max(1.0, abs(v) + reach)
    accept = _Accept(number)
    if index.any_in(v - reach - slack, v + reach + slack, accept):
        return True
    if number.decimals == 0 and reach == 0.5:  # the integer part of a value: trunc(x) == v
        lo, hi = (v, v + 1.0) if v > 0 else (v - 1.0, v) if v < 0 else (-1.0, 1.0)
        return index.any_in(lo, hi, accept)
    return False


def holds(number: Stated, values: Iterable[float] | Values) -> bool:
    """Some evidence value is this number, as written, in any of its readings (a percentage
    as a share too)."""
    index = values if isinstance(values, Values) else Values(values)
    for reading in (number, *number.alternatives):
        if _holds_one(reading, index):
            return True
        if reading.percent:
            share = Stated(
                text=reading.text,
                value=reading.value / 100.0,
                decimals=reading.decimals,
                percent=True,
                start=reading.start,
                tolerance=reading.tolerance / 100.0,
            )
            if _holds_one(share, index):
                return True
    return False
