"""The closed language: asserts whose evaluation cannot change the judge that runs them.

Its own module because it is the shared judge's whole admission rule (see :mod:`.sharing`),
checked by the front to pick a judge and by that judge again on every job. Stdlib only.
"""

from __future__ import annotations

import ast
import functools

from .asserts import BUILTIN_NAMES, STDLIB

#: the builtins a closed spec may name: each is a pure function of its arguments on data (C
#: code, or it calls only what it is given: a lambda of the same language, or a sample's
#: object, which is a round trip to W). Nothing here reaches an attribute by a name held in
#: a string (getattr, hasattr, str.format), a namespace (vars, globals), code (eval, exec,
#: compile, __import__), a file, or makes a class (type with three arguments)
CLOSED_BUILTINS = frozenset(
    """abs all any bin bool bytes callable chr complex dict divmod enumerate filter float
    format frozenset hash hex int isinstance iter len list map max min next oct ord pow range
    repr reversed round set slice sorted str sum tuple zip True False None""".split()  # noqa: SIM905
)
#: modules a closed spec may import (whole, by their own name, or names from them) and call
#: into: C functions of numbers, with no state
CLOSED_MODULES = frozenset({"math", "cmath"})
#: what a closed spec may name in each: its public functions and constants (numbers)
CLOSED_MEMBERS = {
    m: frozenset(
        n
        for n in dir(__import__(m))
        if not n.startswith("_") and isinstance(getattr(__import__(m), n), type(abs) | float | int)
    )
    for m in CLOSED_MODULES
}
#: the expression nodes of the closed language (plus the contexts and operators)
_CLOSED_NODES = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Constant,
    ast.Name, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Subscript, ast.Slice, ast.IfExp,
    ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.comprehension, ast.Lambda,
    ast.arguments, ast.arg, ast.keyword, ast.Starred, ast.JoinedStr, ast.FormattedValue,
    ast.NamedExpr, ast.Attribute, ast.expr_context, ast.boolop, ast.operator, ast.unaryop,
    ast.cmpop,
)  # fmt: skip


@functools.lru_cache(maxsize=1024)
def closed_spec(asserts: tuple[str, ...], setup: str | None) -> bool:
    """True when every test of an asserts spec is written in the closed expression language,
    whose evaluation cannot change the judge process: such a spec may be judged by the shared
    judge of cases jobs (``sharing.DATA_KEY``); any other gets a judge of its own request.

    Why it is closed, by construction rather than by a list of tricks: the setup only binds
    ``CLOSED_MODULES`` (or names from them) in the job's own namespace; a test is one
    expression of the nodes in ``_CLOSED_NODES``, and every name it uses is its own (a lambda
    argument, a comprehension target, a ``:=`` target: all in a per-test scope), the
    sample's (values from W: data decoded by the codec, or references whose every operation
    is a round trip to W), a builtin of ``CLOSED_BUILTINS``, or a closed module as the base of
    ``module.member`` and nothing else. There is no other attribute access at all, so nothing
    reaches a method of a value (``str.format`` walks attributes named in a string), a module
    other than those, or a frame; no statement runs, so nothing is assigned anywhere but the
    test's own scope. Every operation left is a pure function of its operands or a round
    trip to W. (Exceptions and ``Decimal`` signal flags are the only state such an
    evaluation leaves, and neither changes any later result.)
    """
    imported: set[str] = set()
    if setup:
        try:
            body = ast.parse(setup).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        for stmt in body:
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.name not in CLOSED_MODULES or alias.asname not in (None, alias.name):
                        return False
                    imported.add(alias.name)
            elif isinstance(stmt, ast.ImportFrom):
                if stmt.level or stmt.module not in CLOSED_MODULES:
                    return False
                for alias in stmt.names:
                    if alias.name not in CLOSED_MEMBERS[stmt.module]:
                        return False
            else:
                return False
    for src in asserts:
        try:
            stmt = ast.parse(src).body[0]
        except (SyntaxError, ValueError, RecursionError, MemoryError, IndexError):
            return False
        if not isinstance(stmt, ast.Assert):
            return False
        bases = {
            id(n.value)
            for n in ast.walk(stmt.test)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
        }
        for node in ast.walk(stmt.test):
            if not isinstance(node, _CLOSED_NODES):
                return False
            if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
                return False  # `for d[k] in ...`: a store into a value, not a name of its own
            if isinstance(node, ast.Attribute):
                base = node.value
                if not (
                    isinstance(base, ast.Name)
                    and base.id in imported
                    and node.attr in CLOSED_MEMBERS[base.id]
                    and isinstance(node.ctx, ast.Load)
                ):
                    return False
            elif isinstance(node, ast.Name):
                name = node.id
                if name.startswith("__"):
                    return False
                if name in CLOSED_MODULES or name in STDLIB:
                    if id(node) not in bases or name not in imported:
                        return False  # a module as a value, or one the setup did not import
                elif name in BUILTIN_NAMES and name not in CLOSED_BUILTINS:
                    return False
    return True
