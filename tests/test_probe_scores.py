"""The three probe scores, behaviour clusters, the candidate and the config key that picks a score."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from firstpass.config import config_digest, public_dict
from firstpass.errors import ConfigError
from firstpass.policy import (
    SCORES,
    behaviour_keys,
    candidate_order,
    cluster_sizes,
    probe_scores,
    regime_for,
)
from tests.server_harness import stack_config

# (passed, behaviour keys, pass_share, agreement, unanimous_agreement, clusters)
TABLE = [
    ([True] * 5, ["a"] * 5, 1.0, 1.0, 1.0, (5,)),
    ([True] * 5, ["a", "b", "a", "c", "a"], 1.0, 0.6, 0.6, (3, 1, 1)),
    ([True, True, False, True, False], ["a", "b", "a", "b", "a"], 0.6, 0.4, 0.0, (2, 1)),
    ([False] * 5, ["a"] * 5, 0.0, 0.0, 0.0, ()),
    ([True, False, False, False, False], ["x", "x", "x", "x", "x"], 0.2, 0.2, 0.0, (1,)),
]


@pytest.mark.parametrize(("passed", "keys", "share", "agree", "unanimous", "sizes"), TABLE)
def test_scores_and_clusters_on_scripted_probes(
    passed: list[bool],
    keys: list[str],
    share: float,
    agree: float,
    unanimous: float,
    sizes: tuple[int, ...],
) -> None:
    """pass_share = c/k, agreement = g/k, unanimous = g/k only when c = k; failing samples never
    join a cluster."""
    assert cluster_sizes(passed, keys) == sizes
    assert probe_scores(passed, keys) == pytest.approx(
        {"pass_share": share, "agreement": agree, "unanimous_agreement": unanimous}
    )
    assert tuple(probe_scores(passed, keys)) == SCORES


def test_every_score_takes_only_the_levels_i_over_k() -> None:
    """All three scores are multiples of 1/k, the levels calibration snaps them to."""
    import itertools

    k = 4
    for passed in itertools.product([True, False], repeat=k):
        for keys in itertools.product("ab", repeat=k):
            for value in probe_scores(list(passed), list(keys)).values():
                assert abs(value * k - round(value * k)) < 1e-12


def test_the_candidate_comes_from_the_largest_cluster_lowest_index_on_ties() -> None:
    """Largest cluster first; among equal clusters and within one, the lowest index wins."""
    passed = [True, True, True, True, False]
    assert candidate_order(passed, ["b", "a", "a", "b", "a"])[0] == 0  # two clusters of two
    assert candidate_order(passed, ["b", "a", "a", "c", "a"])[0] == 1  # "a" is largest
    assert candidate_order(passed, ["a", "b", "c", "d", "a"])[0] == 0


def test_the_regime_reads_the_chosen_score_but_escalates_on_the_pass_count() -> None:
    """serve at score >= λ, gate below it; escalation still follows c <= escalate_at."""
    scores = probe_scores([True] * 5, ["a", "a", "a", "b", "c"])
    assert regime_for(5, 5, lam=0.8, escalate_at=0) == "serve"
    assert regime_for(5, 5, lam=0.8, escalate_at=0, score=scores["agreement"]) == "gate"
    assert regime_for(0, 5, lam=0.0, escalate_at=0, score=1.0) == "escalate"
    assert regime_for(1, 5, lam=0.0, escalate_at=1, score=1.0) == "escalate"


def _config(tmp_path: Path, **elastic: Any) -> Any:
    block = {"k": 5, "lambda": 0.8, "mode": "shadow", **elastic}
    return stack_config("http://127.0.0.1:9", tmp_path / "r.jsonl", elastic=block)


@pytest.mark.parametrize("score", ["pass_share", "agreement", "unanimous_agreement"])
def test_the_score_key_accepts_the_three_scores(tmp_path: Path, score: str) -> None:
    """`[escalation.elastic] score` is one of the three names and lands on ElasticConfig."""
    config = _config(tmp_path, score=score)
    assert config.elastic is not None and config.elastic.score == score


@pytest.mark.parametrize("bad", ["agree", 1, True, ""])
def test_an_unknown_score_is_refused_naming_the_key(tmp_path: Path, bad: Any) -> None:
    """Anything else is a ConfigError whose key path is escalation.elastic.score."""
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, score=bad)
    assert info.value.key_path == "escalation.elastic.score"


def test_the_default_score_leaves_the_config_digest_as_it_was(tmp_path: Path) -> None:
    """No `score` and `score = "pass_share"` give the digest the config had before the key
    existed; another score changes it."""
    plain = _config(tmp_path)
    explicit = _config(tmp_path, score="pass_share")
    assert config_digest(plain) == config_digest(explicit)
    public: dict[str, Any] = public_dict(plain)  # JSON-ready data
    assert "score" not in public["elastic"]
    assert config_digest(_config(tmp_path, score="agreement")) != config_digest(plain)


def test_unrecorded_behaviour_agrees_with_nobody_and_no_inputs_means_all_agree() -> None:
    """A passing sample without a behaviour digest is its own cluster; with zero probe inputs
    every sample has the same (empty) output vector, so agreement equals the pass share."""
    passed = [True, True, True]
    keys = behaviour_keys(["sha256:a", None, "sha256:a"], 4)
    assert cluster_sizes(passed, keys) == (2, 1)
    assert cluster_sizes(passed, behaviour_keys([None, None, None], 4)) == (1, 1, 1)
    empty = behaviour_keys([None, "sha256:x", None], 0)
    assert probe_scores(passed, empty)["agreement"] == 1.0


def test_the_config_accepts_exactly_the_scores_the_policy_computes() -> None:
    """The score names are written in the config model and in the policy (config stays
    policy-free); the two lists must not drift apart."""
    from firstpass.config._elastic import SCORES as CONFIG_SCORES

    assert CONFIG_SCORES == SCORES
