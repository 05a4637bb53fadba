"""The import graph of ``firstpass`` has no cycles, follows the declared layers, and keeps each
subpackage's private modules to itself.

The graph is read statically (``ast``) from every module of the package, so an import counts
wherever it is written: at module level, inside a function (a "lazy" import), or under
``if TYPE_CHECKING:``. None of those cycles fires at run time today, which is why they must be
caught here: a lazy import moved to module level, or a type-only import that becomes a real
one, turns a latent cycle into an ``ImportError`` at start. ``importlib.import_module`` with a
literal (or an f-string's literal prefix) counts as an import too (``firstpass.cli`` loads its
subcommands that way). Importing ``a.b._c`` runs ``a/b/__init__.py`` first, so the module graph
links the importer to each package on the way as well.

A *unit* is a subpackage (``firstpass.config``) or a top-level module (``firstpass.cli``);
``firstpass/__init__.py`` is the unit ``__init__``. Modules at the top whose names start with an
underscore (``firstpass._console``, ``firstpass._messages``) are the package's shared internals,
importable from anywhere in it. A private module *of a subpackage* (``firstpass.receipts._chain``)
is for that subpackage only: others import what its ``__init__`` re-exports.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

import firstpass

#: The layers of the package, lowest first, by unit (``__init__``: firstpass/__init__.py). A unit
#: imports only units of lower layers: never one above, never another of its own layer. Derived
#: from the code (the longest import path under each unit), not wished: moving a unit means
#: moving what it imports first.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "errors",
        "logs",
        "_console",
        "_messages",
        "_json",
    ),  # the standard library (and structlog) only
    ("__init__", "sandbox"),  # the error tree and version; untrusted code against tests
    ("checks", "probe"),  # the verification library; probe inputs (sandbox's codec)
    ("receipts",),  # the record's schema, chain and writer (check results are in it)
    ("config", "policy"),  # firstpass.toml (checks, limits, signing key); pure decisions
    ("monitor",),  # a licence's audited labels: the e-process, revocations, their store
    ("budgets", "providers"),  # spend caps; upstream clients (a provider's config)
    ("db", "pipeline"),  # PostgreSQL (the shared ledger); the I/O executor
    ("admission", "calibration", "observe"),  # a request's checks; λ; metrics, from receipts
    ("server",),
    ("demo",),  # runs the server in process
    ("commands",),  # one module per subcommand
    ("cli",),  # the dispatcher
    ("__main__",),
)

#: Imports of another subpackage's private module still allowed, as (importer, imported). Burn
#: this list down: re-export the name from the subpackage's ``__init__`` and import it from
#: there. An entry that no longer occurs fails the test too, so the list only shrinks.
ALLOWED_PRIVATE_IMPORTS: frozenset[tuple[str, str]] = frozenset(
    {
        # Lazy on purpose: firstpass.checks._sql pulls in sqlglot (0.26-0.66 s here, by
        # -X importtime), which firstpass.checks does not import until an sql_evidence check
        # is built: re-exported from firstpass.checks, every `firstpass` command would pay it.
        ("firstpass.admission._listed", "firstpass.checks._sql"),
        ("firstpass.commands.check", "firstpass.checks._sql"),
        # The byte-level chain primitives the calibration's one-pass reader shares with
        # verify_chain (a line's own hash, its link), and the streaming verifier the table's
        # chains run through: not for the receipts package's public face. firstpass/receipts/
        # __init__.py is being reworked (typed receipts): if they are to be re-exported, there.
        ("firstpass.calibration._scan", "firstpass.receipts._chain"),
        ("firstpass.db._chains", "firstpass.receipts._chain"),
        # Receipt-file plumbing shared with the budgets' seed and the spill file (rotated
        # siblings, moving a broken file aside); firstpass.receipts/__init__ is being reworked.
        ("firstpass.budgets._seed", "firstpass.receipts._rotate"),
        ("firstpass.db._spill", "firstpass.receipts._aside"),
    }
)

PACKAGE_DIR = Path(firstpass.__file__).resolve().parent
ROOT = "firstpass"


@dataclass(frozen=True)
class Import:
    """One import statement's edge: ``importer`` line ``line`` imports ``imported``."""

    importer: str
    imported: str
    line: int
    where: str  # "module", "function" or "TYPE_CHECKING"

    def __str__(self) -> str:
        how = {"module": "", "function": ", in a function", "TYPE_CHECKING": ", TYPE_CHECKING"}
        return f"{self.importer} (line {self.line}{how[self.where]}) imports {self.imported}"


@functools.cache
def _modules() -> Mapping[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = [ROOT, *path.relative_to(PACKAGE_DIR).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str) -> str | None:
    """The package module ``name`` is, or is an attribute of; None outside the package."""
    modules = _modules()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    """The package modules one module imports, with where each import is written."""

    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.context = ["module"]
        self.found: list[Import] = []
        #: (line, literal prefix) of each import by a computed name (a prefix "": none)
        self.computed: list[tuple[int, str]] = []

    def _add(self, target: str, node: ast.AST) -> None:
        resolved = _resolve(target)
        if resolved is not None and resolved != self.module:
            line = getattr(node, "lineno", 0)
            self.found.append(Import(self.module, resolved, line, self.context[-1]))

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        keep = self.context[-1] == "TYPE_CHECKING"
        self.context.append("TYPE_CHECKING" if keep else "function")
        self.generic_visit(node)
        self.context.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.context.append("TYPE_CHECKING")
        for child in node.body:
            self.visit(child)
        self.context.pop()
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join([*base, *([node.module] if node.module else [])])
        else:
            source = node.module or ""
        for alias in node.names:  # `from pkg import submodule` imports the submodule
            name = f"{source}.{alias.name}"
            self._add(name if name in _modules() else source, node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called in ("import_module", "__import__") and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                self._add(first.value, node)
            else:
                prefix = ""
                if isinstance(first, ast.JoinedStr) and first.values:
                    head = first.values[0]  # f"firstpass.commands.{name}": its literal prefix
                    if isinstance(head, ast.Constant) and isinstance(head.value, str):
                        prefix = head.value
                if prefix:
                    self._add(prefix.rstrip("."), node)
                self.computed.append((node.lineno, prefix))
        self.generic_visit(node)


@functools.cache
def _collected() -> tuple[_Collector, ...]:
    out: list[_Collector] = []
    for module, path in _modules().items():
        collector = _Collector(module, path.name == "__init__.py")
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        out.append(collector)
    return tuple(out)


def _imports() -> tuple[Import, ...]:
    return tuple(found for collector in _collected() for found in collector.found)


def _unit(module: str) -> str:
    """``firstpass.config._model`` -> ``config``; ``firstpass`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _packages_on_the_way(module: str) -> Iterator[str]:
    """The packages importing ``module`` runs first (``a.b`` for ``a.b._c``), not the root."""
    parts = module.split(".")
    for i in range(2, len(parts)):
        yield ".".join(parts[:i])


def _module_graph() -> dict[str, dict[str, Import]]:
    """module -> module it imports -> the first import that says so."""
    graph: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in _imports():
        running = {*_packages_on_the_way(imp.importer), imp.importer}  # being imported already
        for package in _packages_on_the_way(imp.imported):
            if package not in running:
                graph[imp.importer].setdefault(package, imp)
        graph[imp.importer].setdefault(imp.imported, imp)
    return graph


def _unit_graph() -> dict[str, dict[str, Import]]:
    """unit -> unit it imports -> the first import that says so."""
    graph: dict[str, dict[str, Import]] = defaultdict(dict)
    for imp in _imports():
        a, b = _unit(imp.importer), _unit(imp.imported)
        if a != b:
            graph[a].setdefault(b, imp)
    return graph


def _cycles(graph: Mapping[str, Mapping[str, Import]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: Mapping[str, Mapping[str, Import]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first member (breadth first)."""
    start = min(component)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph.get(node, {})):
            if nxt == start:
                return [*paths[node], start]
            if nxt in component and nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


def _chain(graph: Mapping[str, Mapping[str, Import]], cycle: list[str]) -> str:
    """The cycle as the import statements that make it, one a line."""
    lines = [f"  {' -> '.join(cycle)}"]
    for a, b in pairwise(cycle):
        imp = graph[a][b]
        on_the_way = b not in (imp.imported, _unit(imp.imported))  # a package run first
        lines.append(f"    {imp}" + (f" (which runs {b} first)" if on_the_way else ""))
    return "\n".join(lines)


def test_the_static_import_graph_sees_the_imports_it_must() -> None:
    """The reader finds imports of each kind (else an empty graph would pass every check)."""
    found = {(imp.importer, imp.imported): imp.where for imp in _imports()}
    assert found[("firstpass.cli", "firstpass.commands")] == "function"  # import_module(f"...")
    assert found[("firstpass.probe._mutate", "firstpass.sandbox")] == "module"
    assert "module" in found.values() and "function" in found.values()
    assert "TYPE_CHECKING" in found.values()
    assert len(_modules()) > 100


def test_every_unit_of_the_package_has_a_layer() -> None:
    """A new subpackage or top-level module is placed in LAYERS on purpose, once."""
    declared = [unit for layer in LAYERS for unit in layer]
    assert len(declared) == len(set(declared)), "a unit is listed in two layers"
    units = {_unit(module) for module in _modules()}
    assert units - set(declared) == set(), "place these units in LAYERS"
    assert set(declared) - units == set(), "these units of LAYERS no longer exist"


def test_the_subpackages_import_each_other_without_a_cycle() -> None:
    """No cycle among the units (``firstpass.checks`` -> ``firstpass.providers`` ->
    ``firstpass.config`` -> ``firstpass.checks`` was one), counting every kind of import."""
    graph = _unit_graph()
    problems = [_chain(graph, cycle) for cycle in _cycles(graph)]
    assert not problems, "import cycles between subpackages:\n" + "\n\n".join(problems)


def test_each_subpackage_imports_only_layers_below_its_own() -> None:
    """Imports go down LAYERS: never up, never sideways to another unit of the same layer."""
    layer_of = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
    wrong = sorted(
        f"  {imp}: {a} (layer {layer_of[a]}) may not import {b} (layer {layer_of[b]})"
        for a, targets in _unit_graph().items()
        for b, imp in targets.items()
        if a in layer_of and b in layer_of and layer_of[b] >= layer_of[a]
    )
    assert not wrong, "imports against LAYERS (lowest first):\n" + "\n".join(wrong)


def test_no_module_imports_itself_back() -> None:
    """No cycle among modules either, inside a subpackage included (a package's ``__init__``
    and a module of it that imports the package back, say), counting every kind of import."""
    graph = _module_graph()
    problems = [_chain(graph, cycle) for cycle in _cycles(graph)]
    assert not problems, "import cycles between modules:\n" + "\n\n".join(problems)


def _is_private_import(importer: str, imported: str) -> bool:
    """Whether ``imported`` is a private module of a subpackage other than ``importer``'s."""
    if _unit(importer) == _unit(imported):
        return False
    inside = imported.split(".")[2:]  # below the unit: firstpass.db._chains -> _chains
    return any(part.startswith("_") and not part.startswith("__") for part in inside)


def _private_imports() -> dict[tuple[str, str], Import]:
    """(importer, private module of another subpackage) -> the first import of it."""
    found: dict[tuple[str, str], Import] = {}
    for imp in _imports():
        if _is_private_import(imp.importer, imp.imported):
            found.setdefault((imp.importer, imp.imported), imp)
    return found


def test_no_module_imports_another_subpackages_private_module() -> None:
    """``firstpass.x._y`` is x's own: other subpackages import what ``firstpass.x`` re-exports,
    except the pairs ALLOWED_PRIVATE_IMPORTS still lists (each with its reason)."""
    found = _private_imports()
    new = sorted(str(imp) for pair, imp in found.items() if pair not in ALLOWED_PRIVATE_IMPORTS)
    assert not new, (
        "imports of another subpackage's private module (re-export the name from its "
        "__init__ and import it from there):\n  " + "\n  ".join(new)
    )


def test_the_allow_list_of_private_imports_has_no_stale_entry() -> None:
    """An allowed pair that no longer occurs is removed, so the list only shrinks."""
    stale = sorted(ALLOWED_PRIVATE_IMPORTS - set(_private_imports()))
    assert not stale, "remove from ALLOWED_PRIVATE_IMPORTS (no longer imported): " + str(stale)


@pytest.mark.parametrize(
    ("importer", "imported", "private"),
    [
        ("firstpass.db._chains", "firstpass.receipts._chain", True),
        ("firstpass.server._app", "firstpass.sandbox.child._x", True),  # below a subpackage too
        ("firstpass.db._chains", "firstpass.db._prefetch", False),  # its own subpackage
        ("firstpass.sandbox.child.link", "firstpass.sandbox._spec", False),  # nested: still own
        ("firstpass.checks._base", "firstpass._messages", False),  # the package's shared own
        ("firstpass.probe._mutate", "firstpass.sandbox", False),  # a re-export
    ],
)
def test_what_counts_as_a_private_import(importer: str, imported: str, private: bool) -> None:
    """The rule as stated in the module docstring, on examples of each case."""
    assert _is_private_import(importer, imported) is private


#: where the package imports by a computed name with no ``firstpass.<unit>.`` prefix: the
#: sandbox's child side (stdlib modules by construction: tests/test_sandbox_layout.py runs it
#: with nothing else importable)
COMPUTED_IMPORTS_ALLOWED_IN = "firstpass.sandbox._child."
#: other modules that import by a computed name on purpose, and why (none of them firstpass)
COMPUTED_IMPORTS_ALLOWED = {
    "firstpass.checks._patterns": "jsonschema's own modules, named in JSONSCHEMA_MODULES",
}


def test_an_import_by_a_computed_name_names_its_subpackage_literally() -> None:
    """``import_module(f"firstpass.commands.{name}")`` is seen as an import of commands; a
    name computed whole (``import_module(x)``, ``f"firstpass.{x}"``) could be any unit, so it
    would hide a cycle or a layer violation: it is refused outside the sandbox's child side."""
    units = {f"firstpass.{_unit(m)}." for m in _modules()}
    problems = [
        f"{c.module}:{line}: import by a computed name ({prefix or 'no literal prefix'})"
        for c in _collected()
        if not c.module.startswith(COMPUTED_IMPORTS_ALLOWED_IN)
        and c.module not in COMPUTED_IMPORTS_ALLOWED
        for line, prefix in c.computed
        if not any(prefix.startswith(unit) for unit in units)
    ]
    assert problems == [], "\n".join(problems)
