"""Subcommands of the ``firstpass`` CLI, one module each (see ``firstpass.cli``)."""

from __future__ import annotations

import argparse
from typing import TypeAlias

__all__ = ["Subparsers"]

#: what each module's ``register`` is given: the object ``add_subparsers()`` returns. argparse
#: has no public name for its class, only ``_SubParsersAction`` (which typeshed types); the
#: alias is a string, never evaluated: the class cannot be subscripted at run time
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
