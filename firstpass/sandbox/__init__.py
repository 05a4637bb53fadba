"""Run untrusted model code against tests: extraction, specs, isolation, verdicts.

See docs/sandbox.md for what is isolated, the spec shape and the threat model.
"""

from ._child.codec import NonData, WireError, from_json, from_wire, to_wire
from ._extract import Extraction, extract_code
from ._limits import MAX_SECONDS, Limits
from ._null import NullKind, NullProgram, NullVerdict, null_programs, stub_names
from ._result import CATEGORIES, SampleResult, TestResult
from ._runner import Sandbox
from ._spec import (
    DEFAULT_PER_INPUT_S,
    AssertSpec,
    Case,
    CasesSpec,
    ProbeInputs,
    TestSpec,
    parse_spec,
)

__all__ = [
    "CATEGORIES",
    "DEFAULT_PER_INPUT_S",
    "MAX_SECONDS",
    "AssertSpec",
    "Case",
    "CasesSpec",
    "Extraction",
    "Limits",
    "NonData",
    "NullKind",
    "NullProgram",
    "NullVerdict",
    "ProbeInputs",
    "SampleResult",
    "Sandbox",
    "TestResult",
    "TestSpec",
    "WireError",
    "extract_code",
    "from_json",
    "from_wire",
    "null_programs",
    "parse_spec",
    "stub_names",
    "to_wire",
]
