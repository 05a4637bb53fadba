"""The public surface is exactly what each package's ``__all__`` says, and every name exists."""

from __future__ import annotations

import importlib

import pytest

import firstpass

PACKAGES = [
    "firstpass",
    "firstpass.errors",
    "firstpass.config",
    "firstpass.sandbox",
    "firstpass.providers",
    "firstpass.policy",
    "firstpass.probe",
    "firstpass.pipeline",
    "firstpass.receipts",
    "firstpass.server",
]


def test_top_level_exports_the_error_tree_and_version() -> None:
    """`import firstpass` gives the one error tree and the version, nothing else."""
    assert set(firstpass.__all__) == {
        "CalibrationError",
        "ChainError",
        "ConfigError",
        "FirstpassError",
        "ReceiptError",
        "RequestError",
        "SandboxError",
        "SpecError",
        "UpstreamError",
        "UpstreamTimeout",
        "__version__",
    }


@pytest.mark.parametrize("name", PACKAGES)
def test_every_name_in_all_is_importable_and_public(name: str) -> None:
    """Each package's __all__ lists only names it defines, none of them private."""
    module = importlib.import_module(name)
    assert module.__all__, f"{name} has an empty __all__"
    for public in module.__all__:
        assert hasattr(module, public), f"{name}.{public} is in __all__ but missing"
        assert not public.startswith("_") or public == "__version__"


def test_every_error_derives_from_firstpass_error() -> None:
    """One tree: catching FirstpassError catches every error Firstpass raises on purpose."""
    from firstpass import errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.FirstpassError)
