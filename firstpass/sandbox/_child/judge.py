"""The judge (J): evaluates every test itself, in a process that never runs sample code.

J is forked per sample, under its own uid, with trusted builtins and the spec's ``setup``.
Asserts are evaluated here whole — comparisons, ``set``/``sorted``/``math``, setup helpers,
comprehensions and lambdas included; a name the sample defines is looked up in the worker (W)
and arrives as plain data or as a :class:`~.remote.Remote`. Cases are judged here too
(expected values never reach W), and reference outputs collected. The channel to W is
:mod:`.link`'s. Stdlib only.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import signal
from types import CodeType, ModuleType
from typing import TYPE_CHECKING, Any, cast

from . import codec, compare, frames
from .asserts import BUILTIN_NAMES, STDLIB, assert_uses, names_in
from .behaviour import Behaviour, behaviour
from .codec import Wire
from .failures import Gone, JudgeTimeout, SampleError, SampleFailure, Unsupported, Violation
from .link import EXCHANGE, Link, on_alarm
from .remote import JudgeType, Remote, brief_repr
from .verdicts import CATEGORIES, Verdict, short, verdict

if TYPE_CHECKING:
    from .frames import JudgeJob, JudgeResult, WorkerJob

#: cases sent to the worker in one round trip (each still under its own time budget)
CASE_BATCH = 64
#: extra time the judge allows itself per test for its own evaluation
JUDGE_SLACK_S = 1.0


def trusted_namespace(
    setup: str | None, link: Link | None = None
) -> tuple[dict[str, Any], str | None]:  # Any: exec's and eval's namespace, whatever it binds
    """Builtins and the spec's setup, run here (test code from the client).

    With ``link``, a name the setup uses but neither binds nor finds among the builtins
    (``root = Node(1)``, MBPP's setups build trees of the sample's class) is the sample's, as
    it would be in plain Python where the setup runs after the sample's code; a stdlib
    module used as ``module.name`` is the real module. Its calls run under the first test's
    budget.
    """
    ns: dict[str, Any] = {"__builtins__": builtins, "__name__": "__test__", "type": JudgeType}
    if setup:
        try:
            if link is not None:
                link.start_test()
                ns.update(_setup_sample_names(link, setup))
            exec(compile(setup, "<setup>", "exec", dont_inherit=True), ns)
        except (Gone, Violation):
            raise
        except (SampleFailure, SampleError) as exc:
            return ns, short(f"setup raised {type(exc).__name__}: {exc.msg}")
        except BaseException as exc:  # setup naming sample functions fails here: reported
            return ns, short(f"setup raised {type(exc).__name__}: {exc}")
    return ns, None


def _setup_sample_names(link: Link, setup: str) -> dict[str, object]:
    """The sample's values (and real stdlib modules) for the setup's free names."""
    loaded, bound, bases = names_in(ast.parse(setup))
    out: dict[str, object] = {}
    free = sorted(loaded - bound - BUILTIN_NAMES)
    ask = []
    for name in free:
        module = _stdlib_module(name) if name in bases else None
        if module is not None:
            out[name] = module
        else:
            ask.append(name)
    if ask:
        for name, value in _fetch(link, ask).items():
            if not isinstance(value, _Missing):
                out[name] = value
    return out


def _stdlib_module(name: str) -> ModuleType | None:
    if name not in STDLIB or name.startswith("_"):
        return None
    try:
        return __import__(name)
    except ImportError:
        return None


def judge_asserts(link: Link, job: JudgeJob) -> list[Verdict | None]:
    ns, setup_error = trusted_namespace(job.get("setup"), link)
    n = len(job["tests"])
    if setup_error:
        return [verdict(False, "runtime_error", setup_error)] * n
    uses = [assert_uses(src) for src in cast("list[str]", job["tests"])]  # asserts: sources
    entry = job.get("entry_point")
    if entry is not None and ns.get(entry) is JudgeType:  # the sample's `type` is under test
        del ns[entry]
    compiled: list[tuple[CodeType, frozenset[str]]] = []
    modules: list[dict[str, ModuleType]] = []  # per test: names that are the real stdlib module
    wanted: set[str] = set()
    for code, names, bases in uses:
        mine: dict[str, ModuleType] = {}
        for name in names:
            if name in ns and name != "__builtins__":
                continue  # setup's names are the test's own
            if name in BUILTIN_NAMES and name != entry:
                continue  # a sample's `set` or `sorted` never stands in for the real one
            # `math.isclose` is the real math, whatever the sample bound; a name used only
            # as a value or a call (`calendar(2020)`, the entry point) is the sample's
            module = None if name == entry or name not in bases else _stdlib_module(name)
            if module is not None:
                mine[name] = module
                continue
            wanted.add(name)
        compiled.append((code, names))
        modules.append(mine)
    order = sorted(wanted)
    fetched: dict[str, object] = {}
    out: list[Verdict | None] = []
    refetch: list[str] = []
    try:
        if order:
            fetched = _fetch(link, order)
            refetch = [k for k, v in fetched.items() if not isinstance(v, Remote | _Missing)]
    except (SampleFailure, SampleError, Unsupported) as exc:
        msg = getattr(exc, "msg", str(exc))
        return [verdict(False, "runtime_error", short(f"reading the sample's names: {msg}"))] * n
    for i, (code, names) in enumerate(compiled):
        link.start_test()
        if i and refetch:  # a data name may have changed since: read it again
            with contextlib.suppress(SampleFailure, SampleError, Unsupported):
                fetched.update(_fetch(link, refetch))
        scope = dict(ns)
        for name in names:
            if name in fetched and not isinstance(fetched[name], _Missing):
                scope[name] = fetched[name]
        scope.update(modules[i])
        out.append(_one_assert(link, code, scope))
        if out[-1] is None:  # the worker is gone: the zygote says why
            out.extend([None] * (n - len(out)))
            break
    return out


class _Missing:
    pass


def _fetch(link: Link, names: list[str]) -> dict[str, object]:
    pre = link.prefetched
    ask = [n for n in names if n not in pre]
    vals: Wire = []
    if ask:
        vals = link.ask({"op": "get", "n": ask}).get("vals")
        if type(vals) is not list or len(vals) != len(ask):
            raise Violation("malformed name record")
    answers = dict(zip(ask, cast("list[Wire]", vals), strict=True))  # a list: checked
    out: dict[str, object] = {}
    for name in names:
        item = pre.pop(name) if name in pre else answers[name]
        if type(item) is not dict:
            raise Violation("malformed name record")
        if item.get("e") == "missing":
            out[name] = _Missing()
            continue
        value = link.value(item)
        if isinstance(value, Remote):
            object.__setattr__(value, "_fp_name", name)
        out[name] = value
    return out


def _one_assert(link: Link, code: CodeType, scope: dict[str, Any]) -> Verdict | None:
    # the judge's own CPU time (waiting for the worker is not: that is the sample's budget)
    signal.signal(signal.SIGPROF, on_alarm)
    signal.setitimer(signal.ITIMER_PROF, link.per_test_s + JUDGE_SLACK_S)
    try:
        value = eval(code, scope)
        ok = bool(value)
    except Gone:
        return None
    except (SampleFailure, SampleError) as exc:
        return verdict(False, exc.cat, exc.msg)
    except Unsupported as exc:
        return verdict(False, "unsupported", short(str(exc)))
    except JudgeTimeout:
        return verdict(False, "timeout", "evaluating the test expression timed out")
    except MemoryError:
        return verdict(False, "memory_limit", "MemoryError in the test expression")
    except Exception as exc:
        return verdict(False, "runtime_error", short(f"{type(exc).__name__}: {exc}"))
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, signal.SIG_IGN)  # one that fired just now is dropped
        EXCHANGE[1] = False
    if ok:
        return verdict(True)
    got = "; ".join(link.calls)
    return verdict(
        False, "assertion_failed", short("assertion failed" + (f": {got}" if got else ""))
    )


# --------------------------------------------------------------------------- cases and outputs


def _entry(link: Link, job: JudgeJob) -> Remote | str:
    name = str(job.get("entry_point"))
    try:
        got = _fetch(link, [name])[name]
    except (SampleFailure, SampleError, Unsupported) as exc:
        return getattr(exc, "msg", str(exc))
    if not isinstance(got, Remote):
        return (
            f"entry point {name!r} is not defined"
            if isinstance(got, _Missing)
            else (f"entry point {name!r} is not callable")
        )
    return got


def call_cases(link: Link, job: JudgeJob) -> list[dict[str, Wire]]:
    """Call the entry point on each case; each answer is the raw record (data or failure)."""
    fn = _entry(link, job)
    n = len(job["tests"])
    if isinstance(fn, str):
        return [{"e": "runtime_error", "m": short(fn)}] * n
    out: list[dict[str, Wire]] = []
    tests = job["tests"]
    while len(out) < n:
        if link.dead:
            out.append({"e": "timeout", "m": "the sample's CPU limit was reached"})
            continue
        batch = tests[len(out) : len(out) + CASE_BATCH]
        try:
            ans = link.ask({"op": "batch", "r": fn._fp_ref, "a": batch, "b": link.per_test_s})
        except Gone:
            out.extend([{"gone": True}] * (n - len(out)))
            break
        outs = ans.get("outs")
        if type(outs) is not list or not 0 < len(outs) <= len(batch):
            raise Violation("malformed batch record")
        for item in outs:
            if type(item) is not dict:
                raise Violation("malformed batch record")
            out.append(item)
            if item.get("cpu"):
                link.dead = True
    return out


def judge_cases(link: Link, job: JudgeJob) -> list[Verdict | None]:
    # a cases job's expected values (the front sends them with every cases request)
    expected, atol = cast("list[Wire]", job["expected"]), float(job.get("atol") or 0)
    out: list[Verdict | None] = []
    for exp_wire, ans in zip(expected, call_cases(link, job), strict=False):
        if "gone" in ans:
            out.append(None)
        elif "v" in ans:
            try:
                got = codec.from_wire(ans["v"])
            except (codec.WireError, RecursionError) as exc:
                raise Violation(f"malformed value: {exc}") from None
            exp = codec.from_wire(exp_wire)
            try:
                same = compare.values_equal(got, exp, atol)
            except (OverflowError, ValueError, RecursionError):
                same = False
            out.append(
                verdict(True)
                if same
                else verdict(
                    False, "wrong_output", f"expected {brief_repr(exp)}, got {brief_repr(got)}"
                )
            )
        elif "r" in ans:
            ty = str(ans.get("ty"))[:100]
            out.append(verdict(False, "wrong_output", f"returned a non-data value of type {ty}"))
        else:
            cat, msg = ans.get("e"), ans.get("m")
            if cat == "nondata":
                cat = "wrong_output"
            if cat not in CATEGORIES or type(msg) is not str:
                raise Violation("malformed failure record")
            out.append(verdict(False, cat, short(msg)))
    return out


def collect_outputs(
    link: Link, job: JudgeJob, allowance: int
) -> tuple[list[Verdict | None], list[Wire]]:
    """Reference outputs: the verdict says whether a value came back; outputs hold it (wire).

    A case whose reference failed for a reason of its own (it raised, exited, gave non-data,
    or went over the allowance) holds ``{"$drop": why}``; one that failed by accident of
    time or memory (a loaded host, a hostile neighbour) holds None, so the caller tries it
    again rather than drop it (``$drop`` is no tag of the codec: no output can look like it).
    """
    verdicts: list[Verdict | None] = []
    outputs: list[Wire] = []
    used = 0
    for ans in call_cases(link, job):
        if "gone" in ans:
            verdicts.append(None)
            outputs.append(None)
        elif "v" in ans:
            size = len(json.dumps(ans["v"], separators=(",", ":")))
            used += size
            if used > allowance:
                msg = f"the reference's outputs exceed the {allowance}-byte allowance"
                verdicts.append(verdict(False, "output_limit", msg))
                outputs.append({DROP: "output_limit (over the allowance)"})
                continue
            verdicts.append(verdict(True))
            outputs.append(ans["v"])
        else:
            cat = str(ans["e"]) if ans.get("e") in CATEGORIES else "wrong_output"
            msg = short(str(ans.get("m") or "non-data"))
            verdicts.append(verdict(False, cat, msg))
            if cat not in TRANSIENT:
                outputs.append({DROP: _drop_reason(cat, ans.get("x"))})
            elif cat == "timeout" and (
                CPU_TIME_TIMEOUT in msg or (ans.get("cpu") and len(job["tests"]) == 1)
            ):  # this case's own CPU budget (alone in its process: the process's limit)
                outputs.append({SLOW: "timeout (CPU time)"})
            else:  # the wall-clock backstop, or the process's CPU spent on earlier cases
                outputs.append(None)
    return verdicts, outputs


#: the key of an output the reference could not give for a reason of its own
DROP = "$drop"
#: the key of an output whose case used up its own CPU-time budget (the caller drops the
#: case only if it does so in every run: see Sandbox.resolve)
SLOW = "$slow"
#: how the worker says a call ran out of its CPU-time budget (``worker._KINDS``)
CPU_TIME_TIMEOUT = "(CPU time)"


def _drop_reason(cat: str, exc_name: object) -> str:
    """Why a case was dropped, without the message (it can quote hidden inputs: receipts
    carry this reason)."""
    if type(exc_name) is str and exc_name.isidentifier():
        return f"{cat} ({exc_name[:60]})"
    return "wrong_output (non-data)" if cat == "wrong_output" else cat


#: failures that say nothing about the reference (time and memory depend on the host)
TRANSIENT = frozenset({"timeout", "memory_limit"})


def _probe(link: Link, job: JudgeJob) -> Behaviour | None:
    inputs = job["probe"]
    try:
        ans = link.ask(
            {"op": "probe", "f": job.get("probe_entry"), "in": inputs, "b": float(job["probe_s"])}
        )
    except Gone:
        return behaviour(None, len(inputs))
    outs = ans.get("outs")
    try:
        return behaviour(outs if type(outs) is list else [], len(inputs))
    except (ValueError, TypeError, RecursionError):
        return None  # a malformed record: the sample agrees with nobody


# --------------------------------------------------------------------------- the judge's run


def run_judge(zfd: int, wfd: int, job: JudgeJob) -> JudgeResult:
    """Load the sample in W, judge every test, and return the result for the zygote.

    ``tests`` holds a verdict per test, or None where W ended before that test was judged
    (the zygote knows why: its exit status, the deadline or the output cap).
    """
    n = len(job["tests"])
    link = Link(wfd, float(job["per_test_s"]), job.get("cpu_usage"))
    result: JudgeResult = {}
    # the code is there whenever this judge sends W its job (not w_job_sent)
    wjob: WorkerJob = {"code": cast(str, job.get("code")), "load_s": job["load_s"]}
    if job.get("setup_imports"):
        wjob["setup_imports"] = job["setup_imports"]
    try:
        if not job.get("w_job_sent"):  # else the zygote put it in W's socket already
            frames.write_all(wfd, frames.encode_frame(wjob))
        try:
            ready = frames.read_frame(wfd, 1 << 10)
        except (EOFError, OSError):
            result["ready"] = False  # the worker died before the sample ran: not the sample's
            raise Gone() from None
        except (ValueError, RecursionError):
            raise Violation("the result channel carried bytes that are not a record") from None
        if ready != {"t": "ready"}:
            raise Violation("the worker's first record was not its ready record")
        result["ready"] = True
        try:
            load = frames.read_frame(wfd, frames.MAX_VALUE_FRAME)
        except (EOFError, OSError):
            raise Gone() from None
        except (ValueError, RecursionError):
            raise Violation("the result channel carried bytes that are not a record") from None
        if type(load) is not dict or load.get("t") != "load":
            raise Violation("the first record was not the load record")
        if "cat" in load:
            cat, msg = load.get("cat"), load.get("msg")
            if cat not in CATEGORIES or type(msg) is not str:
                raise Violation("malformed load record")
            result["tests"] = [verdict(False, cat, short(msg))] * n
            result["load_failed"] = True
            if job["mode"] == "outputs" and cat not in TRANSIENT:  # the reference's own fault
                result["outputs"] = [{DROP: _drop_reason(str(cat), None) + " while loading"}] * n
            return result
        pre, names = load.get("vals"), job.get("prefetch") or []
        if pre is not None:
            if type(pre) is not list or len(pre) != len(names):
                raise Violation("malformed load record")
            link.prefetched = dict(zip(names, pre, strict=True))
        mode = job["mode"]
        if mode == "asserts":
            tests = judge_asserts(link, job)
        elif mode == "cases":
            tests = judge_cases(link, job)
        else:
            tests, outputs = collect_outputs(link, job, int(job.get("allowance") or 0))
            result["outputs"] = outputs
        result["tests"] = tests
        if job.get("probe") is not None and not link.dead and None not in tests:
            link.end_test()  # the probe has its own timer per input, no test's budget
            result["behaviour"] = _probe(link, job)
    except Gone:
        done = result.get("tests") or []
        result["tests"] = list(done) + [None] * (n - len(done))
        result["gone"] = True
    except Violation as exc:
        msg = short(str(exc))
        result = {"tests": [verdict(False, "sandbox_violation", msg)] * n}
    finally:
        result["round_trips"] = link.round_trips
        link.close()
        with contextlib.suppress(OSError):
            frames.write_all(wfd, frames.encode_frame({"op": "bye"}))
    return result
