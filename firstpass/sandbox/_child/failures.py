"""What can go wrong while the judge evaluates a test, as the exceptions J raises (stdlib only).

Kept apart from the channel and the stand-ins, which both raise them: the sample's failures
(as the builtin exception it raised, so a setup helper's ``except ValueError`` still catches
it), the worker's violations, and what cannot cross the sandbox boundary.
"""

from __future__ import annotations

import builtins


class Gone(BaseException):
    """The worker's channel ended (it exited or was killed): the rest is for the zygote to say."""


class Violation(BaseException):
    """The worker sent something that is not an answer to the judge's request."""


class SampleFailure(BaseException):
    """Sample code failed in a way plain Python would not let a test catch (timeout, memory)."""

    def __init__(self, cat: str, msg: str, cpu: bool = False) -> None:
        self.cat, self.msg, self.cpu = cat, msg, cpu
        super().__init__(msg)


class SampleError(Exception):
    """Sample code raised: catchable by a setup helper, as it would be in plain Python."""

    def __init__(self, cat: str, msg: str) -> None:
        self.cat, self.msg = cat, msg
        super().__init__(msg)


class Unsupported(Exception):
    """The test needs something that cannot cross the sandbox boundary."""


class JudgeTimeout(BaseException):
    """The judge's own CPU timer ran out while it evaluated a test expression."""


_SAMPLE_EXCEPTIONS: dict[tuple[type, ...], type[SampleError]] = {}


def sample_exception(names: object) -> type[SampleError]:
    """SampleError that is also the builtin exception the sample raised (``ValueError``...),
    so ``hasattr``, a length hint or a setup helper's ``except ValueError`` sees it as such.

    ``names`` is the exception's class name or the names of its nearest builtin ancestors
    (``class E(ValueError)``: ``["ValueError"]``), as the worker read them. A name that is not
    a builtin ``Exception`` class is ignored; a builtin whose class cannot be combined or
    built this way (``UnicodeDecodeError`` needs five arguments, ``ExceptionGroup`` has its
    own layout) gives way to its own nearest ancestor that can (``UnicodeError``,
    ``ValueError``...), and at worst to a plain SampleError: this never raises.
    """
    if type(names) is str:
        names = [names]
    if type(names) is not list or not names or not all(type(n) is str for n in names):
        return SampleError
    bases: list[type] = []
    for name in names[:4]:
        base = getattr(builtins, name, None)
        if (
            isinstance(base, type)
            and issubclass(base, Exception)
            and not issubclass(base, SampleError)
            and base not in bases
        ):
            bases.append(base)
    if not bases:
        return SampleError
    key = tuple(bases)  # builtin classes only: the cache stays small whatever the worker says
    cls = _SAMPLE_EXCEPTIONS.get(key)
    if cls is None:
        cls = _SAMPLE_EXCEPTIONS[key] = _build_sample_exception(bases)
    return cls


def _build_sample_exception(bases: list[type]) -> type[SampleError]:
    if len(bases) > 1:
        cls = _try_sample_exception(tuple(bases))
        if cls is not None:
            return cls
    for base in bases:  # each alone, then its own ancestors, nearest first
        for ancestor in base.__mro__:
            if ancestor is Exception or not issubclass(ancestor, Exception):
                break
            cls = _try_sample_exception((ancestor,))
            if cls is not None:
                return cls
    return SampleError


def _try_sample_exception(bases: tuple[type, ...]) -> type[SampleError] | None:
    """The class, if Python lets it be made and raised as the judge raises it."""
    try:
        name = "Sample" + "".join(b.__name__ for b in bases)
        cls = type(name, (SampleError, *bases), {})
        cls("runtime_error", "probe")  # a constructor that needs other arguments fails here
    except Exception:
        return None
    return cls


def sample_error(names: object, cat: str, msg: str) -> SampleError:
    """The judge-side exception for a failure record of the sample's (never raises itself)."""
    try:
        return sample_exception(names)(cat, msg)
    except Exception:
        return SampleError(cat, msg)
