"""`[receipts] sink = "postgresql"` in the config: what is accepted, what fails at load (naming
the key or the variable), and how a replica's id is found."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from firstpass.config import Config, config_from_dict
from firstpass.errors import ConfigError
from firstpass.server._workers import worker_config

ENV = {"OPENAI_API_KEY": "sk-test", "FIRSTPASS_DSN": "postgresql://fp@db/fp"}


@pytest.fixture
def data(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "samples.jsonl").write_text(
        '{"task_id": "t", "model": "m", "samples": ["x"]}\n', encoding="utf-8"
    )
    return {
        "provider": [{"id": "replay", "kind": "replay", "samples": "samples.jsonl"}],
        "route": [{"name": "code", "models": ["code"], "ladder": ["replay/cheap"]}],
        "price": [{"model": "replay/cheap", "input_per_mtok": 0.1, "output_per_mtok": 0.4}],
        "receipts": {"sink": "postgresql"},
    }


def _build(data: dict[str, Any], tmp_path: Path, env: dict[str, str] | None = None) -> Config:
    return config_from_dict(data, base_dir=tmp_path, env=ENV if env is None else env)


def _error(data: dict[str, Any], tmp_path: Path, env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        _build(data, tmp_path, env)
    return str(info.value)


def test_the_postgresql_sink_defaults_to_firstpass_dsn_and_a_spill_file_beside_the_log(
    data: dict[str, Any], tmp_path: Path
) -> None:
    receipts = _build(data, tmp_path).receipts
    assert receipts.sink == "postgresql" and receipts.dsn_env == "FIRSTPASS_DSN"
    assert receipts.resolved_spill_path == tmp_path / "receipts.spill.jsonl"
    assert "postgresql://" not in repr(receipts)  # only the variable's name is kept


def test_an_unset_dsn_variable_fails_at_load_naming_the_key(
    data: dict[str, Any], tmp_path: Path
) -> None:
    message = _error(data, tmp_path, env={"OPENAI_API_KEY": "x"})
    assert "receipts.dsn_env" in message and "FIRSTPASS_DSN is not set" in message


def test_a_dsn_written_where_the_variable_name_belongs_is_refused(
    data: dict[str, Any], tmp_path: Path
) -> None:
    data["receipts"]["dsn_env"] = "postgresql://u:secret@db/fp"
    message = _error(data, tmp_path)
    assert "receipts.dsn_env" in message and "NAME of the environment variable" in message
    assert "secret" not in message


def test_database_keys_with_the_file_sink_and_rotation_with_the_table_are_refused(
    data: dict[str, Any], tmp_path: Path
) -> None:
    data["receipts"] = {"replica": "r1"}
    assert "receipts.replica" in _error(data, tmp_path)
    data["receipts"] = {"sink": "postgresql", "rotate_bytes": 1 << 20}
    assert "receipts.rotate_bytes" in _error(data, tmp_path)


@pytest.mark.parametrize("bad", ["", "-r1", "a/b", "r 1", "x" * 129, "../up", "web.000001"])
def test_a_replica_id_that_cannot_name_a_chain_or_a_file_is_refused(
    data: dict[str, Any], tmp_path: Path, bad: str
) -> None:
    data["receipts"]["replica"] = bad
    assert "receipts.replica" in _error(data, tmp_path)
    del data["receipts"]["replica"]
    assert "FIRSTPASS_REPLICA" in _error(data, tmp_path, env={**ENV, "FIRSTPASS_REPLICA": bad})


def test_firstpass_replica_overrides_the_file_and_a_derived_id_is_stable(
    data: dict[str, Any], tmp_path: Path
) -> None:
    derived = _build(data, tmp_path).receipts.replica_id
    assert derived == _build(data, tmp_path).receipts.replica_id  # the same on every start
    data["receipts"]["replica"] = "from-file"
    env = {**ENV, "FIRSTPASS_REPLICA": "eu-1.pod-3"}
    assert _build(data, tmp_path, env).receipts.replica_id == "eu-1.pod-3"
    assert _build(data, tmp_path).receipts.replica_id == "from-file"


def test_each_worker_writes_its_own_chain_and_spill_file(
    data: dict[str, Any], tmp_path: Path
) -> None:
    data["receipts"]["replica"] = "r1"
    config = _build(data, tmp_path)
    first, second = worker_config(config, 0, 2), worker_config(config, 1, 2)
    assert (first.receipts.replica_id, second.receipts.replica_id) == ("r1", "r1-w1")
    assert first.receipts.resolved_spill_path != second.receipts.resolved_spill_path
