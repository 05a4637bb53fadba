"""Find the program in a model's answer: fenced blocks, ``<code>`` tags, or the raw text.

Rules, in order (the name of the rule that fired is reported as ``Extraction.rule``):

1. ``fence:*`` — Markdown fences (```` ```python ````, ```` ```py ````, ```` ```python3 ````, bare
   ```` ``` ````, ``~~~``); an unclosed last fence runs to the end (a truncated answer).
   Fences tagged with another language (``bash``, ``json``...) are ignored.
2. ``code_tag:*`` — ``<code>...</code>`` blocks (the SpecFix prompt format), used when no fence is.
3. ``raw`` — the whole answer (``raw:after_prose``: from the first code-like line, when only
   that part parses), when it parses as Python with at least one statement that is not a
   bare name or constant, or when a line starts like code (``def``/``class``/``import``/``from``).
4. ``none`` — nothing that looks like code: the sample's category is ``no_code``.

Among several blocks: ``*:entry_point`` the longest that defines the entry point at top level
(``def name(``), else ``*:longest`` the longest block (the first among equals), ``*:only`` if
just one.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

__all__ = ["Extraction", "extract_code"]

#: the rest of the info line starts with a character ``lang`` cannot hold, so the two never
#: compete for the same characters (they did: a long unclosed fence took seconds, quadratic)
_FENCE = re.compile(
    r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[^\s`]*)(?:[^\S\n][^\n]*|`[^\n]*)?\n", re.M
)
_CODE_TAG = re.compile(r"<code>(.*?)(?:</code>|\Z)", re.S | re.I)
_PY_LANGS = {"", "python", "py", "python3", "py3", "pycon", "ipython"}
_CODE_START = re.compile(r"^(def |async def |class |import |from \S+ import )", re.M)


@dataclass(frozen=True, kw_only=True)
class Extraction:
    """The code found in an answer and the rule that found it (``code`` is ``""`` for ``none``)."""

    code: str
    rule: str


def _fenced(text: str) -> list[str]:
    blocks: list[str] = []
    pos = 0
    while True:
        m = _FENCE.search(text, pos)
        if m is None:
            return blocks
        fence, lang = m.group("fence"), m.group("lang").lower()
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M)
        end = close.search(text, m.end())
        body = text[m.end() : end.start() if end else len(text)]
        if lang in _PY_LANGS:
            blocks.append(_dedent_block(body))
        pos = end.end() if end else len(text)


def _dedent_block(body: str) -> str:
    lines = body.split("\n")
    indents = [len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()]
    cut = min(indents, default=0)
    return "\n".join(ln[cut:] for ln in lines).strip("\n") + "\n"


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^(async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def _pick(blocks: list[str], kind: str, entry_point: str | None) -> Extraction:
    blocks = [b for b in blocks if b.strip()]
    if len(blocks) == 1:
        return Extraction(code=blocks[0], rule=f"{kind}:only")
    if entry_point:
        defining = [b for b in blocks if _defines(b, entry_point)]
        if defining:
            return Extraction(code=max(defining, key=len), rule=f"{kind}:entry_point")
    return Extraction(code=max(blocks, key=len), rule=f"{kind}:longest")


def _looks_like_code(text: str) -> bool:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return _CODE_START.search(text) is not None
    return any(
        not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Name | ast.Constant))
        for s in tree.body
    )


def extract_code(answer: str, entry_point: str | None = None) -> Extraction:
    """Pull the program out of a raw model answer (see the module docstring for the rules)."""
    blocks = _fenced(answer)
    if any(b.strip() for b in blocks):
        return _pick(blocks, "fence", entry_point)
    tags = [_dedent_block(b) for b in _CODE_TAG.findall(answer)]
    if any(b.strip() for b in tags):
        return _pick(tags, "code_tag", entry_point)
    if answer.strip() and _looks_like_code(answer):
        start = _CODE_START.search(answer)
        if (
            start
            and start.start() > 0
            and _parses(answer) is False
            and _parses(answer[start.start() :])
        ):
            return Extraction(code=answer[start.start() :], rule="raw:after_prose")
        return Extraction(code=answer, rule="raw")
    return Extraction(code="", rule="none")


def _parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True
