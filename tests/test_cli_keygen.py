"""``firstpass keygen`` prints config a user can put into the config they already have."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from firstpass.cli import main
from firstpass.commands.init import demo_samples_path, starter_config
from firstpass.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def printed_toml(out: str) -> list[str]:
    """The block keygen tells the user to add to firstpass.toml: the lines between the blank
    lines after "sign receipt checkpoints with it"."""
    after = out.split("sign receipt checkpoints with it", 1)[1]
    return after.split("\n\n")[1].splitlines()


def with_lines_in_receipts(config: str, lines: list[str]) -> str:
    """``config`` with ``lines`` put below its ``[receipts]`` line, as the printed text says."""
    head, rest = config.split("\n[receipts]\n", 1)
    return head + "\n[receipts]\n" + "".join(f"{line}\n" for line in lines) + rest


@pytest.mark.parametrize("config", ["repository", "init"])
def test_the_printed_signing_key_goes_into_an_existing_receipts_table(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    config: str,
) -> None:
    """keygen printed a `[receipts]` block; added to a config that has one (the repository's
    firstpass.toml, the one `init` writes), it gave "Cannot declare ('receipts',) twice". It
    prints the `signing_key` line for the existing table, and the config then loads with it."""
    monkeypatch.chdir(tmp_path)
    if config == "repository":
        shutil.copy(ROOT / "firstpass.toml", tmp_path / "firstpass.toml")
        text = (tmp_path / "firstpass.toml").read_text("utf-8")
        shutil.copytree(ROOT / "firstpass" / "demo", tmp_path / "firstpass" / "demo")
    else:
        text = starter_config(demo_samples_path())
    assert main(["keygen", "--out", "keys/sign.key"]) == 0
    out = capsys.readouterr().out
    block = printed_toml(out)
    assert block and not any(line.strip().startswith("[") for line in block), out
    assert "put this line below the\n[receipts] line" in out
    target = tmp_path / "firstpass.toml"
    target.write_text(with_lines_in_receipts(text, block), encoding="utf-8")
    loaded = load_config(target, env={})
    assert loaded.receipts.signing_key is not None
    assert Path(loaded.receipts.signing_key) == (tmp_path / "keys" / "sign.key").resolve()
