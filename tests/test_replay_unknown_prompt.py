"""A prompt the replay upstream never recorded: the 502 says how to name a recorded task."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import openai
import pytest

from firstpass.config import ProviderConfig
from firstpass.errors import UpstreamError
from firstpass.providers import ReplayProvider, build_provider
from tests.cli_process import serving

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.e2e
def test_an_unrecorded_prompt_gets_a_502_naming_task_id_and_the_demo_tasks(tmp_path: Path) -> None:
    """Through `firstpass serve` on the shipped config, the SDK's error says to send
    firstpass.task_id and lists demo/1 … demo/12 in order."""
    config = shlex.quote(str(ROOT / "firstpass.toml"))
    command = f"{shlex.quote(sys.executable)} -m firstpass serve --config {config}"
    receipts = str(tmp_path / "receipts.jsonl")

    with serving(command, tmp_path, FIRSTPASS_RECEIPTS=receipts) as server:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{server.port}/v1", api_key="unused", max_retries=0
        )
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(
                model="firstpass-demo",
                messages=[{"role": "user", "content": "Write is_palindrome(s) ..."}],
                extra_body={"firstpass": {"tests": {"visible": ["assert is_palindrome('aba')"]}}},
            )

    assert caught.value.status_code == 502
    message = caught.value.message
    assert "no samples for model 'demo-strong'" in message
    assert '"firstpass": {"task_id": ...}' in message
    listed = ", ".join(f"demo/{i}" for i in range(1, 13))
    assert f"(task ids for 'demo-strong': {listed})" in message


async def test_a_long_task_list_is_cut_with_the_total(tmp_path: Path) -> None:
    """With more recorded tasks than the message lists, it shows the first ones and the count."""
    path = tmp_path / "samples.jsonl"
    rows = [{"task_id": f"t/{i}", "model": "m", "samples": ["x"]} for i in range(30, 0, -1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    provider = build_provider(ProviderConfig(id="rp", kind="replay", samples=path), session=None)
    assert isinstance(provider, ReplayProvider)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete(
            "m", {"messages": [{"role": "user", "content": "?"}]}, request_key="t/99"
        )

    message = str(caught.value)
    assert "task_id 't/99'" in message
    first = ", ".join(f"t/{i}" for i in range(1, 13))
    assert message.endswith(f"(task ids for 'm': {first}, … (30 in all))")
