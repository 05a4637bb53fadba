"""The verified cascade and pass-through, over the shared steps."""

from __future__ import annotations

from firstpass.pipeline._state import LadderState, RunRequest
from firstpass.pipeline._steps import Concluded, Steps
from firstpass.pipeline._trace import Served

__all__ = ["CascadeRunner"]


class CascadeRunner:
    """Cheapest rung first, every answer checked, up the ladder on failure; or, for
    pass-through, the cheapest rung's answer as it came."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    async def passthrough(self, req: RunRequest) -> Concluded:
        rung = req.route.ladder[0]
        req.trace.step("call:0")
        completion, error = await self.steps.call(req, 0, rung, purpose="passthrough", n=req.n)
        if completion is None:
            assert error is not None
            req.trace.step("upstream_failed")
            return self.steps.error(req, action="upstream_error", error=error)
        served = Served(
            rung=0,
            provider=rung.provider,
            model=rung.model,
            text=completion.texts[0] if completion.texts else "",
            verification="unchecked",
            completion=completion,
        )
        return self.steps.finish(req, action="passthrough", served=served, raw=completion.raw)

    async def cascade(self, req: RunRequest) -> Concluded:
        result = await self.steps.run_ladder(req, LadderState())
        return self.steps.conclude(req, result)
