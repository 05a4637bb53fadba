"""The zygote's entry point: ``python -I -S boot.py <cfg json>`` (``-I`` alone with site-packages).

Why a bootstrap: the modules here import each other as one package, and the zygote runs
without firstpass on its import path. This file loads its directory as the package
:data:`PACKAGE` by path, without adding anything to ``sys.path``, so the zygote (and every
sample forked from it) imports only the standard library by name.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

#: what the child package is called inside the sandbox's processes
PACKAGE = "fp_sandbox_child"
HERE = os.path.dirname(os.path.abspath(__file__))


def load() -> ModuleType:
    """This directory as the package :data:`PACKAGE` (once per process)."""
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(HERE, "__init__.py"), submodule_search_locations=[HERE]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    spec.loader.exec_module(package)
    return package


if __name__ == "__main__":
    load()
    importlib.import_module(PACKAGE + ".zygote").main()
