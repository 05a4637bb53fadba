"""Which jobs may share a judge process: the judge's whole isolation rule, in one place.

Z picks a job's key with :func:`judge_key`; the shared judge checks each job again with
:func:`shareable` before it judges it. Stdlib only.
"""

from __future__ import annotations

from .closed import closed_spec

#: the job modes whose judging runs no client code in the judge (a call of the entry point
#: on decoded arguments and a comparison of decoded values): only these share a judge
#: across requests
RESIDENT_MODES = frozenset({"cases", "outputs"})
#: the judge key of those modes; every other job's key names its request (see judge_key)
DATA_KEY = "data"


def judge_key(mode: str, request_key: object, job_id: int, closed: bool = False) -> str:
    """Which jobs may share a judge process with this one: the judge's whole isolation rule.

    A judge serves one key for its life, and T kills it before a job of another key reaches
    its slot. Jobs whose judging cannot change the judge share ``DATA_KEY`` across requests:
    cases and outputs jobs (no client code runs in the judge) and asserts specs written in the
    closed language (``closed``, from ``closed.closed_spec``; the shared judge checks it again
    on the job, see ``shareable``). Any other asserts spec runs client code that can change
    its judge, so its key is its request's (the samples of one ``run_many``), else its own:
    such a spec never runs in a process that judges another request's sample.
    """
    if mode in RESIDENT_MODES or (mode == "asserts" and closed):
        return DATA_KEY
    if type(request_key) is str and request_key:
        return "req:" + request_key[:200]
    return f"job:{job_id}"


def shareable(job: object) -> bool:
    """A job whose judging cannot change the judge: a cases or outputs job (no client code in
    the judge), or an asserts spec in the closed language (``closed.closed_spec``), checked
    here on the job itself, whatever Z decided."""
    if type(job) is not dict:
        return False
    mode = job.get("mode")
    if mode in RESIDENT_MODES:
        return True
    tests, setup = job.get("tests"), job.get("setup")
    return (
        mode == "asserts"
        and type(tests) is list
        and all(type(t) is str for t in tests)
        and (setup is None or type(setup) is str)
        and closed_spec(tuple(tests), setup)
    )
