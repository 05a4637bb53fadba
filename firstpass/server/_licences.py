"""The server's licence monitor: opened with the pipeline, fed by it, asked by enforce.

``open_monitor`` builds the monitor for the licences in force (none: no monitor), on the store
the receipts sink implies: ``<receipts dir>/licences.json`` for log files (every worker and every
server sharing the directory), the database for ``sink = "postgresql"``. A revocation this
replica decides is written as a chained ``revocation`` line through the receipt writer; at start
the monitor re-applies every such line the store lost (``LicenceStore.recorded``), and after
``monitor_stale_s`` without a sync it stops the licences skipping. The
monitor is ``app[MONITOR]`` and ``app[PIPELINE].monitor``; ``observe_label`` is its hook for
labels that arrive later (``POST /v1/feedback``).
"""

from __future__ import annotations

import structlog
from aiohttp import web

from firstpass.config import Config, ElasticConfig
from firstpass.errors import ReceiptError
from firstpass.monitor import (
    LICENCES_FILE,
    POLL_S,
    FileLicenceStore,
    LicenceMonitor,
    LicenceStore,
    Revocation,
    licence_terms,
)
from firstpass.receipts import revocation_record
from firstpass.server._keys import RECEIPT_WRITER

__all__ = ["MONITOR", "open_monitor", "revoked_summary"]

log = structlog.get_logger("firstpass.server")

#: the app's licence monitor (absent without a monitored licence)
MONITOR = web.AppKey("licence_monitor", LicenceMonitor)


async def open_monitor(app: web.Application, config: Config) -> LicenceMonitor | None:
    """The started monitor (resumed from its store), or None when no licence is monitored."""
    elastic = config.elastic
    terms = licence_terms(elastic)
    if elastic is None or not terms:
        return None
    if elastic.mode == "enforce" and elastic.audit_rate == 0:
        log.warning(
            "audits_off",
            advice="[escalation.elastic] audit_rate = 0: skipped answers are never labelled, so "
            "a drift from the calibration data goes unseen and no licence can be revoked; set "
            f"audit_rate > 0 (default {ElasticConfig.audit_rate:g}) to monitor the licences",
        )
    r = config.receipts
    store: LicenceStore
    if r.sink == "postgresql":
        from firstpass.db import PostgresLicenceStore, dsn_from_env

        store = PostgresLicenceStore(dsn_from_env(r.dsn_env))
        replica = r.replica_id
    else:
        store = FileLicenceStore(r.path.parent / LICENCES_FILE)
        replica = r.path.name

    async def receipted(revocation: Revocation) -> None:
        try:
            await app[RECEIPT_WRITER].write(revocation_record(revocation.to_dict()))
        except ReceiptError as exc:  # the revocation holds (it is in the store); say so
            log.error("revocation_not_receipted", licence=revocation.key.text(), error=str(exc))

    if elastic.monitor_stale_s < 2 * POLL_S:
        log.warning(
            "monitor_stale_s_short",
            advice=f"[escalation.elastic] monitor_stale_s = {elastic.monitor_stale_s:g} is under "
            f"two polls of the licence store ({POLL_S:g} s each): licences will stop skipping "
            f"between polls of a healthy store; raise it to at least {2 * POLL_S:g}",
        )
    monitor = LicenceMonitor(
        terms=terms,
        replica=replica,
        store=store,
        poll_s=POLL_S,
        on_revoke=receipted,
        stale_s=elastic.monitor_stale_s,
    )
    await monitor.start()
    app[MONITOR] = monitor
    return monitor


def revoked_summary(monitor: LicenceMonitor | None) -> dict[str, object]:
    """For the ready line: each revoked licence in force (it gates until a new certificate)."""
    if monitor is None:
        return {}
    revoked = {rev.key.text(): rev.evidence() for rev in monitor.revoked}
    # calibrated on data from before a revocation at their (route, rung): revoked too
    revoked.update({why.key.text(): why.evidence() for why in monitor.predated})
    return {"revoked_licences": revoked}
