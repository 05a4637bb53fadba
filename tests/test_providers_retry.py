"""The retry policy as pure functions: retryable statuses, Retry-After, jittered backoff."""

from __future__ import annotations

import random
import statistics
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstpass.providers import RetryPolicy, is_retryable_status, parse_retry_after

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("status", "retry"),
    [
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (599, True),
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (413, False),
        (422, False),
        (200, False),
    ],
)
def test_retryable_statuses_are_408_409_429_and_5xx(status: int, retry: bool) -> None:
    """Only transient statuses are retried; a 4xx that blames the request is not."""
    assert is_retryable_status(status) is retry


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("2", 2.0),
        (" 1.5 ", 1.5),
        ("0", 0.0),
        ("-1", None),
        ("soon", None),
        ("", None),
        ("nan", None),
        ("inf", None),
        (None, None),
    ],
)
def test_retry_after_seconds_are_parsed_and_nonsense_ignored(
    header: str | None, expected: float | None
) -> None:
    """Delta-seconds give that many seconds; anything unusable gives None (use the backoff)."""
    assert parse_retry_after(header, now=NOW) == expected


def test_retry_after_http_date_gives_seconds_until_then() -> None:
    """An HTTP-date 7 s in the future means wait 7 s."""
    header = format_datetime(NOW + timedelta(seconds=7), usegmt=True)
    assert parse_retry_after(header, now=NOW) == pytest.approx(7.0)


def test_retry_after_http_date_in_the_past_means_no_wait() -> None:
    """A date already gone gives 0, never a negative wait."""
    header = format_datetime(NOW - timedelta(minutes=5), usegmt=True)
    assert parse_retry_after(header, now=NOW) == 0.0


def test_retry_after_ms_is_preferred_when_present() -> None:
    """OpenAI's finer `retry-after-ms` wins over the whole-second `Retry-After`."""
    assert parse_retry_after("1", value_ms="250", now=NOW) == pytest.approx(0.25)
    assert parse_retry_after("1", value_ms="junk", now=NOW) == 1.0


def test_backoff_ceiling_doubles_then_caps_at_the_maximum() -> None:
    """Ceilings are base, 2·base, 4·base... never above max_s."""
    policy = RetryPolicy(retries=10, base_s=0.25, max_s=2.0)
    assert [policy.ceiling_s(r) for r in range(1, 7)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert policy.ceiling_s(5000) == 2.0


def test_full_jitter_spans_zero_to_the_ceiling() -> None:
    """The draw maps linearly onto [0, ceiling): 0 waits nothing, 0.5 waits half the ceiling."""
    policy = RetryPolicy(base_s=0.5, max_s=8.0)
    assert policy.delay_s(3, draw=0.0) == 0.0
    assert policy.delay_s(3, draw=0.5) == pytest.approx(1.0)
    assert policy.delay_s(3, draw=0.999999) < 2.0


def test_full_jitter_is_uniform_by_simulation() -> None:
    """Over 20,000 draws the waits have the mean and spread of Uniform(0, ceiling)."""
    policy = RetryPolicy(base_s=1.0, max_s=8.0)
    rng = random.Random(1234)
    waits = [policy.delay_s(2, draw=rng.random()) for _ in range(20_000)]
    ceiling = policy.ceiling_s(2)
    assert statistics.fmean(waits) == pytest.approx(ceiling / 2, rel=0.02)
    assert statistics.pstdev(waits) == pytest.approx(ceiling / 12**0.5, rel=0.02)
    assert min(waits) >= 0 and max(waits) < ceiling


@given(
    retry=st.integers(min_value=1, max_value=64),
    draw=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
    base=st.floats(min_value=0.0, max_value=10.0),
    cap=st.floats(min_value=0.0, max_value=60.0),
)
def test_jittered_waits_stay_within_bounds(
    retry: int, draw: float, base: float, cap: float
) -> None:
    """Whatever the inputs, a jittered wait is in [0, min(max_s, base·2^(r-1))]."""
    policy = RetryPolicy(base_s=base, max_s=cap)
    wait = policy.delay_s(retry, draw=draw)
    assert 0.0 <= wait <= min(cap, base * 2.0 ** (retry - 1))


@pytest.mark.parametrize(("retry_after", "expected"), [(0.3, 0.3), (0.0, 0.0), (100.0, 8.0)])
def test_retry_after_overrides_jitter_and_is_capped(retry_after: float, expected: float) -> None:
    """The upstream's Retry-After is used as given, but never beyond 4 × max_s."""
    policy = RetryPolicy(base_s=0.25, max_s=2.0)
    assert policy.delay_s(1, draw=0.9, retry_after_s=retry_after) == pytest.approx(expected)


def test_max_attempts_is_the_first_attempt_plus_retries() -> None:
    """retries = 2 means three attempts in all."""
    assert RetryPolicy(retries=2).max_attempts == 3
    assert RetryPolicy(retries=0).max_attempts == 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: RetryPolicy(retries=-1),
        lambda: RetryPolicy(base_s=-0.1),
        lambda: RetryPolicy().delay_s(1, draw=1.0),
        lambda: RetryPolicy().delay_s(0, draw=0.5),
    ],
    ids=["negative-retries", "negative-base", "draw-out-of-range", "retry-zero"],
)
def test_nonsense_policy_inputs_are_refused(make: object) -> None:
    """Negative counts, draws outside [0, 1) and retry 0 are programming errors, caught early."""
    with pytest.raises(ValueError):
        make()  # type: ignore[operator]
