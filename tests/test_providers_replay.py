"""The replay provider: lookup by task id or prompt hash, seeded draws, tokens, file errors."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from blockbuster import BlockingError, blockbuster_ctx

from firstpass.config import ProviderConfig
from firstpass.errors import ConfigError, UpstreamError
from firstpass.providers import ReplayProvider, build_provider, load_sample_set, prompt_sha256

PROMPT = "Write a function that returns the square of x."
PROMPT_HASH = hashlib.sha256(PROMPT.encode()).hexdigest()
EIGHT = [f"def square(x):\n    return x * x  # {i}\n" for i in range(8)]


def body(prompt: str = PROMPT) -> dict[str, Any]:
    return {
        "model": "whatever",
        "messages": [
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": f"  {prompt}\n"},
        ],
    }


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    return path


@pytest.fixture
def sample_file(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "samples.jsonl",
        [
            {"task_id": "Mbpp/2", "model": "small", "samples": EIGHT, "prompt_sha256": PROMPT_HASH},
            {"task_id": 11, "model": "small", "samples": ["a", "b"], "input_tokens": 30,
             "output_tokens": [5, 7]},
            {"task_id": "Mbpp/2", "model": "large", "samples": ["big answer"]},
            {"model": "small", "prompt_sha256": "sha256:" + "ab" * 32, "samples": ["by hash"]},
        ],
    )  # fmt: skip


def replay(path: Path, **overrides: Any) -> ReplayProvider:
    cfg = ProviderConfig(**{"id": "rp", "kind": "replay", "samples": path, **overrides})
    provider = build_provider(cfg, session=None)
    assert isinstance(provider, ReplayProvider)
    return provider


async def draw_sequence(provider: ReplayProvider, count: int, key: str = "Mbpp/2") -> list[str]:
    return [
        (await provider.complete("small", body(), request_key=key)).texts[0] for _ in range(count)
    ]


async def test_same_seed_gives_the_same_sequence(sample_file: Path) -> None:
    """Two providers with one seed replay identical draws; another seed gives another order."""
    first = await draw_sequence(replay(sample_file, seed=7), 16)
    again = await draw_sequence(replay(sample_file, seed=7), 16)
    other = await draw_sequence(replay(sample_file, seed=8), 16)

    assert first == again
    assert first != other


async def test_draws_are_without_replacement_within_each_cycle(sample_file: Path) -> None:
    """Every recorded sample is served once before any repeats, cycle after cycle."""
    provider = replay(sample_file)
    texts: list[str] = []
    for n in (3, 1, 4, 5, 3):  # 16 draws = two full cycles of 8, across uneven calls
        texts.extend((await provider.complete("small", body(), n=n, request_key="Mbpp/2")).texts)

    assert sorted(texts[:8]) == sorted(EIGHT)
    assert sorted(texts[8:]) == sorted(EIGHT)
    assert texts[:8] != texts[8:], "each cycle is a fresh permutation"


async def test_a_call_for_more_samples_than_recorded_repeats_them_evenly(
    sample_file: Path,
) -> None:
    """n = 10 from a row of 2 gives each sample five times."""
    result = await replay(sample_file).complete("small", body(), n=10, request_key="11")

    assert Counter(result.texts) == {"a": 5, "b": 5}


async def test_draw_state_is_kept_per_model_and_row(sample_file: Path) -> None:
    """Drawing for one task or model does not move another's sequence."""
    alone = await draw_sequence(replay(sample_file), 8)
    provider = replay(sample_file)
    mixed = []
    for _ in range(8):
        mixed.append((await provider.complete("small", body(), request_key="Mbpp/2")).texts[0])
        await provider.complete("small", body(), request_key="11")
        await provider.complete("large", body(), request_key="Mbpp/2")

    assert mixed == alone


async def test_lookup_by_task_id_including_integer_ids(sample_file: Path) -> None:
    """`request_key` finds the row with that task id; integer ids in the file match as text."""
    provider = replay(sample_file)

    big = await provider.complete("large", body("unrelated prompt"), request_key="Mbpp/2")
    eleven = await provider.complete("small", body("unrelated prompt"), request_key="11")

    assert big.texts == ("big answer",)
    assert eleven.texts[0] in {"a", "b"}


@pytest.mark.parametrize(
    "content",
    [
        PROMPT,
        f"\n {PROMPT} \n",
        [{"type": "text", "text": PROMPT}],
        [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": PROMPT}],
    ],
    ids=["string", "padded", "parts", "parts-with-image"],
)
async def test_lookup_by_the_hash_of_the_last_user_message(content: Any, sample_file: Path) -> None:
    """Without a task id the row is found by SHA-256 of the last user message's stripped text."""
    request = {
        "messages": [
            {"role": "user", "content": "an earlier turn"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": content},
        ]
    }
    assert prompt_sha256(request) == PROMPT_HASH

    result = await replay(sample_file).complete("small", request)

    assert result.texts[0] in EIGHT


async def test_an_unknown_task_id_falls_back_to_the_prompt_hash(sample_file: Path) -> None:
    """A task id missing from the file still finds the row its prompt hashes to."""
    result = await replay(sample_file).complete("small", body(), request_key="not-in-file")

    assert result.texts[0] in EIGHT


async def test_prompt_hashes_may_carry_a_sha256_prefix(sample_file: Path) -> None:
    """`prompt_sha256` written as "sha256:<hex>" is the same key as the bare hex."""
    sample_set = load_sample_set(sample_file)

    assert ("small", "ab" * 32) in sample_set.by_prompt


async def test_an_unknown_key_is_a_404_naming_the_file_and_key(sample_file: Path) -> None:
    """No row for the key: UpstreamError status 404 saying which file and which keys were tried."""
    provider = replay(sample_file)

    with pytest.raises(UpstreamError) as caught:
        await provider.complete("small", body("nobody recorded this"), request_key="Mbpp/999")

    message = str(caught.value)
    assert caught.value.status == 404 and caught.value.provider == "rp"
    assert str(sample_file) in message and "'Mbpp/999'" in message
    digest = prompt_sha256(body("nobody recorded this"))
    assert digest is not None
    assert digest in message


async def test_an_unknown_model_is_a_404_listing_the_models_in_the_file(
    sample_file: Path,
) -> None:
    """Asking replay for a model it has no rows for says which models it does have."""
    with pytest.raises(UpstreamError, match=r"'medium'.*large, small") as caught:
        await replay(sample_file).complete("medium", body(), request_key="Mbpp/2")

    assert caught.value.status == 404


async def test_token_counts_come_from_the_file_when_given(sample_file: Path) -> None:
    """Per-row input tokens count once per call; per-sample output tokens are summed."""
    result = await replay(sample_file).complete("small", body(), n=2, request_key="11")

    assert result.input_tokens == 30
    assert result.output_tokens == 12  # 5 + 7, one draw of each


async def test_token_counts_are_estimated_when_absent(sample_file: Path) -> None:
    """Without counts, tokens are len(text) // 4 (at least 1) of the samples and the prompt."""
    result = await replay(sample_file).complete("large", body(), request_key="Mbpp/2")

    prompt_chars = len("You write Python.") + len(f"  {PROMPT}\n")
    assert result.output_tokens == len("big answer") // 4
    assert result.input_tokens == prompt_chars // 4


async def test_a_replay_result_looks_like_one_instant_call(sample_file: Path) -> None:
    """Replay reports one call, one attempt, status 200, no latency and no upstream JSON."""
    result = await replay(sample_file).complete("small", body(), n=3, request_key="Mbpp/2")

    assert (result.calls, result.attempts, result.status) == (1, 1, 200)
    assert result.latency_ms == 0.0 and result.raw is None
    assert result.finish_reasons == ("stop",) * 3 and result.model == "small"


async def test_without_n_support_replay_accounts_n_calls(sample_file: Path) -> None:
    """With honours_n = false the draws are the same but prompt tokens and calls count n times."""
    honouring = await replay(sample_file).complete("small", body(), n=2, request_key="11")
    not_honouring = await replay(sample_file, honours_n=False).complete(
        "small", body(), n=2, request_key="11"
    )

    assert honouring.texts == not_honouring.texts
    assert not_honouring.calls == 2 and not_honouring.input_tokens == 2 * 30


async def test_gzipped_sample_sets_are_read(tmp_path: Path) -> None:
    """A `.jsonl.gz` sample set is read through gzip."""
    path = tmp_path / "s.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"task_id": "t", "model": "m", "samples": ["x"]}\n'))

    result = await replay(path).complete("m", body(), request_key="t")

    assert result.texts == ("x",)


async def test_reading_the_sample_file_does_not_block_the_event_loop(sample_file: Path) -> None:
    """start() reads the file in a worker thread: blockbuster sees no blocking call on the loop."""
    provider = replay(sample_file)
    with blockbuster_ctx(["firstpass"]):
        with pytest.raises(BlockingError):  # the detector is live: a read on the loop is caught
            load_sample_set(sample_file)
        await provider.start()
        result = await provider.complete("small", body(), request_key="Mbpp/2")

    assert result.texts[0] in EIGHT


async def test_concurrent_first_requests_read_the_file_once(
    sample_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many requests racing at startup share one load of the sample file."""
    import firstpass.providers._replay as replay_module

    loads = []

    def counting_load(path: Path) -> Any:
        loads.append(path)
        return load_sample_set(path)

    monkeypatch.setattr(replay_module, "load_sample_set", counting_load)
    provider = replay(sample_file)

    await asyncio.gather(*(provider.complete("small", body(), request_key="11") for _ in range(20)))

    assert len(loads) == 1


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
        ('{"task_id": "t", "samples": ["x"]}', "line 2: `model`"),
        ('{"task_id": "t", "model": "m", "samples": []}', "line 2: `samples`"),
        ('{"task_id": "t", "model": "m", "samples": [1]}', "line 2: `samples`"),
        ('{"model": "m", "samples": ["x"]}', "line 2: needs `task_id` or `prompt_sha256`"),
        ('{"task_id": true, "model": "m", "samples": ["x"]}', "line 2: `task_id`"),
        ('{"task_id": "t", "model": "m", "samples": ["x"], "output_tokens": [1, 2]}',
         "line 2: `output_tokens`"),
        ('{"task_id": "t", "model": "m", "samples": ["x"], "input_tokens": -1}',
         "line 2: `input_tokens`"),
        ('{"task_id": "first", "model": "m", "samples": ["x"]}', "already given on line 1"),
    ],
)  # fmt: skip
async def test_a_malformed_sample_file_fails_at_start_naming_the_line(
    line: str, complaint: str, tmp_path: Path
) -> None:
    """Each kind of bad row is a ConfigError that names the file, the line and the field."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task_id": "first", "model": "m", "samples": ["ok"]}\n' + line + "\n")

    with pytest.raises(ConfigError) as caught:
        await replay(path).start()

    assert str(path) in str(caught.value) and complaint in str(caught.value)


async def test_a_missing_sample_file_fails_at_start(tmp_path: Path) -> None:
    """A path that does not exist is a ConfigError at start, chained to the OSError."""
    with pytest.raises(ConfigError, match="cannot read sample set") as caught:
        await replay(tmp_path / "absent.jsonl").start()

    assert isinstance(caught.value.__cause__, OSError)


async def test_line_separators_inside_samples_do_not_split_rows(tmp_path: Path) -> None:
    """A sample holding U+2028 (written raw by json.dumps(ensure_ascii=False)) stays one row."""
    text = "x = 1\u2028y = 2\x85"
    path = write_jsonl(tmp_path / "s.jsonl", [{"task_id": "t", "model": "m", "samples": [text]}])

    result = await replay(path).complete("m", body(), request_key="t")

    assert result.texts == (text,)
