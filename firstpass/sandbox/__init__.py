"""Run untrusted model code against tests: extraction, specs, isolation, verdicts.

See docs/sandbox.md for what is isolated, the spec shape and the threat model.
"""

from ._codec import NonData, WireError, from_json, from_wire, to_wire
from ._extract import Extraction, extract_code
from ._limits import Limits
from ._result import CATEGORIES, SampleResult, TestResult
from ._runner import Sandbox
from ._spec import AssertSpec, Case, CasesSpec, TestSpec, parse_spec

__all__ = [
    "CATEGORIES",
    "AssertSpec",
    "Case",
    "CasesSpec",
    "Extraction",
    "Limits",
    "NonData",
    "SampleResult",
    "Sandbox",
    "TestResult",
    "TestSpec",
    "WireError",
    "extract_code",
    "from_json",
    "from_wire",
    "parse_spec",
    "to_wire",
]
