"""The bundled demo: a small data set written by Firstpass itself, and the offline demo runner.

The data set (``tasks.jsonl``, ``samples.jsonl``) is DEMO DATA, not a benchmark: a dozen small
Python tasks and hand-written answers from two made-up models, arranged so that one offline run
shows every decision the proxy can make. ``firstpass.demo.dataset`` writes it and documents it.
"""
