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


def test_the_version_is_written_once_and_installed_as_written() -> None:
    """pyproject.toml takes the version from ``firstpass.__version__`` (the one place it is
    written), and the installed distribution's metadata carries that same version."""
    import tomllib
    from importlib import metadata
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    config = tomllib.loads(pyproject.read_text("utf-8"))
    assert "version" not in config["project"]
    assert "version" in config["project"]["dynamic"]
    assert config["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "firstpass.__version__"}
    try:
        installed = metadata.version(config["project"]["name"])
    except metadata.PackageNotFoundError:
        pytest.skip("firstpass-verify is not installed (a bare checkout): pip install -e .")
    assert installed == firstpass.__version__, "reinstall (pip install -e .) after a version bump"
