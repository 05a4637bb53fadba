"""The Prometheus text exposition of a registry (what ``GET /metrics`` answers)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

__all__ = ["CONTENT_TYPE", "render_metrics"]

#: the exposition format's content type (text format 0.0.4)
CONTENT_TYPE = CONTENT_TYPE_LATEST


def render_metrics(registry: CollectorRegistry) -> bytes:
    """Every metric of ``registry`` in the text format; CPU work: call it off the event loop."""
    return generate_latest(registry)
