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
MODULES = sorted(p for p in CHILD.glob("*.py"))
STDLIB = frozenset(sys.stdlib_module_names)


def _imports(path: Path) -> list[tuple[int, str, int]]:
    """(line, module, relative level) of every import statement in the file."""
    out: list[tuple[int, str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            out.append((node.lineno, node.module or "", node.level))
    return out


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_a_child_module_imports_the_standard_library_and_its_siblings_only(path: Path) -> None:
    """Absolute imports are stdlib modules; relative ones stay in the child package (level 1)."""
    for line, module, level in _imports(path):
        where = f"{path.name}:{line}"
        if level:
            assert level == 1, f"{where} reaches outside the child package"
            assert not module or (CHILD / f"{module.split('.')[0]}.py").exists(), where
        else:
            assert module.split(".")[0] in STDLIB, f"{where} imports {module}, not the stdlib"


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
