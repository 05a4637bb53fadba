"""The code that runs inside the sandbox's processes: the zygote (Z), its template (T), workers
(W), judges (J) and sweepers (R). docs/sandbox.md has the picture and the module map.

Stdlib only, and imported as one package in two ways: by the proxy as
``firstpass.sandbox._child`` (the codec, frames, verdict categories, the static reading of
asserts), and inside the sandbox by ``boot.py``, which the front starts as
``python -I -S boot.py``. There firstpass is not importable, so a module here imports the
standard library and its siblings (relatively), never the proxy's side:
tests/test_sandbox_layout.py checks both.
"""
