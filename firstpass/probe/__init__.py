"""Behavioural agreement's inputs: extra calls of the entry point, mutated from the visible tests.

    inputs = build_probe_inputs(visible_spec, extra=request_probe_inputs)   # ProbeInputs | None
    results = await sandbox.run_many(texts, visible_spec, probe=inputs)     # each has .behaviour

The scores built on the recorded behaviour are pure functions of ``firstpass.policy``.
"""

from firstpass.probe._mutate import (
    DEFAULT_COUNT,
    MAX_COUNT,
    build_probe_inputs,
    cached_probe_inputs,
    mutate_value,
    seed_calls,
)
from firstpass.sandbox import DEFAULT_PER_INPUT_S, ProbeInputs

__all__ = [
    "DEFAULT_COUNT",
    "DEFAULT_PER_INPUT_S",
    "MAX_COUNT",
    "ProbeInputs",
    "build_probe_inputs",
    "cached_probe_inputs",
    "mutate_value",
    "seed_calls",
]
