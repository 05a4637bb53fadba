"""Test code read, never run: the names an assert uses, a setup's imports, the entry point.

Both sides need it: the front to build a request (what the worker reports up front, which
builtin-named function is under test), the judge to compile and scope each assert. Parsing
only, stdlib only.
"""

from __future__ import annotations

import ast
import builtins
import functools
import sys
from types import CodeType

BUILTIN_NAMES = frozenset(dir(builtins))
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))


def assert_names(src: str) -> tuple[CodeType, frozenset[str]]:
    """The compiled test expression of one assert and the free names it loads."""
    code, names, _ = assert_uses(src)
    return code, names


def assert_uses(src: str) -> tuple[CodeType, frozenset[str], frozenset[str]]:
    """The compiled test expression, the names it loads, and those it uses as the base of
    ``name.attribute`` somewhere (``math.isclose``: the module; ``calendar(2020)`` alone is a
    call of the sample's ``calendar``)."""
    tree = ast.parse(src)
    stmt = tree.body[0]
    assert isinstance(stmt, ast.Assert)  # parse_spec guarantees one assert statement
    loads = [
        n for n in ast.walk(stmt.test) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    ]
    bases = {
        id(n.value)
        for n in ast.walk(stmt.test)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    names = frozenset(n.id for n in loads)
    based = frozenset(n.id for n in loads if id(n) in bases)
    code = compile(ast.Expression(body=stmt.test), "<test>", "eval", dont_inherit=True)
    return code, names, based


def prefetch_names(asserts: tuple[str, ...] | list[str], entry: str | None) -> list[str]:
    """Names the worker should report with its load record, saving the judge a round trip:
    every name the asserts load that the judge would look up in the sample (a superset:
    setup's names are left to the judge, which ignores what it does not need)."""
    out: set[str] = set()
    for src in asserts:
        _, names, bases = assert_uses(src)
        for name in names:
            if name in BUILTIN_NAMES and name != entry:
                continue
            if name in bases and name != entry and name in STDLIB:
                continue
            out.add(name)
    return sorted(out)


def setup_imports(setup: str | None) -> str | None:
    """Only the import statements of ``setup``: the sample may use them, never its helpers."""
    if not setup:
        return None
    tree = ast.parse(setup)
    imports = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)]
    return "\n".join(ast.unparse(s) for s in imports) or None


def _top_level_defs(code: object) -> frozenset[str]:
    """Names the sample's code defines at top level with ``def`` or ``class`` (parsed, never
    run; code that does not parse defines nothing)."""
    if type(code) is not str:
        return frozenset()
    try:
        tree = ast.parse(code)
    except Exception:  # SyntaxError, a parser's RecursionError or MemoryError
        return frozenset()
    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return frozenset(n.name for n in tree.body if isinstance(n, kinds))


def infer_entry_point(asserts: tuple[str, ...], setup: str | None, code: str) -> str | None:
    """The builtin-named function an asserts spec without an entry point tests, if it tests
    one (MBPP 126 calls the sample's ``sum(a, b)``), else None. The proxy sends it as the
    request's entry point: the one name that may be the sample's although a builtin has it.

    Builtins stay the real ones (a sample's ``sorted`` never stands in for the test's) unless
    the spec names nothing of the sample's but builtins: every name its asserts use is a
    builtin, bound by the setup, or a stdlib module used as ``module.name`` (any other name
    would be the function under test, and then every builtin is the real one). The function
    under test is then one of the builtin names: the one the sample's code defines at top
    level with ``def`` or ``class`` (parsed here, never run), when it defines exactly one of
    the builtin names the asserts use and every assert calls it. Everything else in the test
    is still the judge's own: what that function returns is checked by real builtins.
    """
    called = _builtin_candidates(tuple(asserts), setup)
    if not called:
        return None
    mine = _top_level_defs(code) & called[1]
    if len(mine) != 1:
        return None
    (name,) = mine
    return name if name in called[0] else None


@functools.lru_cache(maxsize=1024)
def _builtin_candidates(
    asserts: tuple[str, ...], setup: str | None
) -> tuple[frozenset[str], frozenset[str]] | None:
    """(builtin names every assert calls, builtin names the asserts use), or None when an
    assert uses a name that is not a builtin, the setup's, or a stdlib module's base."""
    try:
        bound = _bound_names(ast.parse(setup)) if setup else frozenset()
        trees = [ast.parse(src) for src in asserts]
    except (SyntaxError, ValueError):
        return None
    used: set[str] = set()
    every: set[str] | None = None
    for src, tree in zip(asserts, trees, strict=True):
        _, names, bases = assert_uses(src)
        for name in names:
            if name in bound:
                continue
            if name in BUILTIN_NAMES:
                used.add(name)
            elif not (name in bases and name in STDLIB):
                return None  # a name of the sample's that is not a builtin: that is tested
        calls = {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in used
        }
        every = calls if every is None else every & calls
    if not every:
        return None
    return frozenset(every), frozenset(used)


def _bound_names(tree: ast.AST) -> frozenset[str]:
    """Every name a piece of code binds anywhere (assigned, defined, imported, an argument)."""
    return names_in(tree)[1]


def names_in(tree: ast.AST) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(names loaded, names bound, names used as the base of ``name.attribute``)."""
    loaded: set[str] = set()
    bound: set[str] = set()
    bases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            bases.add(node.value.id)
    return frozenset(loaded), frozenset(bound), frozenset(bases)
