"""The sandbox's two sides stay apart: ``firstpass/sandbox/_child/`` runs inside the sandbox's
processes and imports only the standard library and its own siblings, never the front
(``firstpass/sandbox/*.py``) nor anything else of firstpass; and it loads the zygote's way
(``python -I -S boot.py``) without adding anything to the import path."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from firstpass.sandbox._child import boot

CHILD = Path(boot.__file__).resolve().parent
MODULES = sorted(p for p in CHILD.rglob("*.py"))
STDLIB = frozenset(sys.stdlib_module_names)


def _imports(path: Path) -> list[tuple[int, str, int, tuple[str, ...]]]:
    """(line, module, relative level, names) of every import statement in the file."""
    out: list[tuple[int, str, int, tuple[str, ...]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name, 0, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names = tuple(alias.name for alias in node.names)
            out.append((node.lineno, node.module or "", node.level, names))
    return out


#: imports by a computed name the child side makes on purpose, per file: boot.py loads the
#: package (checked by running it, below); closed.py reads math/cmath's constants; judge.py
#: runs a test's own setup imports; zygote.py preimports the stdlib modules its config names.
#: Any other (or one more in these files) fails: a static check cannot vouch for it.
DYNAMIC_IMPORTS = {"boot.py": 1, "closed.py": 2, "judge.py": 1, "zygote.py": 1}


def _dynamic_imports(path: Path) -> list[int]:
    """Lines that import by a computed name (``importlib.import_module``, ``__import__``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__"):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(CHILD)) for p in MODULES])
def test_a_child_module_imports_the_standard_library_and_its_siblings_only(path: Path) -> None:
    """Absolute imports are stdlib modules; relative ones stay in the child package (one
    flat package: level 1, a sibling module, ``from . import X`` only of sibling modules);
    no import by a computed name outside boot.py."""
    assert path.parent == CHILD, f"{path}: the child package is flat (no subpackages)"
    for line, module, level, names in _imports(path):
        where = f"{path.name}:{line}"
        if level:
            assert level == 1, f"{where} reaches outside the child package"
            if module:
                assert (CHILD / f"{module.split('.')[0]}.py").exists(), where
            else:
                for name in names:
                    assert (CHILD / f"{name}.py").exists(), f"{where}: {name} is no sibling"
        else:
            assert module.split(".")[0] in STDLIB, f"{where} imports {module}, not the stdlib"
    found = _dynamic_imports(path)
    assert len(found) <= DYNAMIC_IMPORTS.get(path.name, 0), (
        f"{path.name}: imports by a computed name at lines {found} (DYNAMIC_IMPORTS)"
    )


def test_the_child_package_loads_the_zygote_s_way_with_the_standard_library_only() -> None:
    """Under ``python -I -S`` with no environment, boot.py's loader imports every child module;
    nothing else of firstpass is loaded, every module is stdlib, and sys.path is unchanged."""
    names = [p.stem for p in MODULES if p.stem not in ("__init__", "boot")]
    code = (
        "import importlib, json, runpy, sys\n"
        "before = list(sys.path)\n"
        f"runpy.run_path({str(CHILD / 'boot.py')!r})['load']()\n"
        f"for name in {names!r}:\n"
        f"    importlib.import_module({boot.PACKAGE!r} + '.' + name)\n"
        "print(json.dumps({'path_same': sys.path == before, 'modules': sorted(sys.modules)}))\n"
    )
    run = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, env={}, timeout=60
    )
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["path_same"]
    tops = {m.split(".")[0] for m in got["modules"]} - {"__main__", boot.PACKAGE}
    assert tops <= STDLIB, sorted(tops - STDLIB)
    loaded = {m for m in got["modules"] if m.startswith(boot.PACKAGE + ".")}
    assert loaded == {f"{boot.PACKAGE}.{n}" for n in names}


def test_the_front_starts_the_zygote_through_the_bootstrap() -> None:
    """The command the front runs names child/boot.py (python -I -S, see Sandbox._argv)."""
    from firstpass.sandbox import _isolation

    assert Path(_isolation.ZYGOTE).resolve() == CHILD / "boot.py"
