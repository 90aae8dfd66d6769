"""The diary's background passes: the retention sweep, the vector fill's table (``NOTES``, which
``libs.common.vector_passes`` runs the fill and orphan passes over), and the index rebuild.

Each is a one-shot function; ``services.runner`` wraps it in a lease claim (``diary-sweep``,
``diary-fill``), the all-in-one ticks it on its cadence, and a Kubernetes CronJob runs it as
``./run pass <name>``. All are idempotent: a pass started twice does the work once.
"""

from __future__ import annotations

from dataclasses import dataclass

from libs.common import vector_rows
from libs.common.config import PrivacyConfig
from libs.common.pass_report import emit_report
from libs.common.vector_rows import VectorRows
from services.diary import erasure
from services.diary.domain import COLLECTION_BASE
from services.diary.service import DiaryService, index_point

__all__ = ["NOTES", "SweepReport", "index_pending", "rebuild_index", "sweep"]


@dataclass
class SweepReport:
    expired_deleted: int = 0
    evicted_over_cap: int = 0
    seats_over_cap: int = 0
    retention_deleted: int = 0
    """Notes past their company's retention (privacy.retention.note_max_age_days)."""


async def sweep(service: DiaryService, privacy: PrivacyConfig | None = None) -> SweepReport:
    """Delete SHORT notes past their TTL; evict LONG notes past the per-seat cap by use; delete
    notes past their company's retention (``privacy``, issue 17)."""
    report = SweepReport()
    now = service.clock.now()
    if privacy is not None:
        report.retention_deleted = await erasure.prune_retention(service.store.pool, service.index, privacy, now)
    while True:
        gone = await service.store.sweep_expired(now)
        if not gone:
            break
        report.expired_deleted += len(gone)
        await vector_rows.drop_points(service.index, COLLECTION_BASE, gone, "swept notes")
    cap = service.config.long_cap_per_seat
    for company, seat in await service.store.seats_over_cap(cap):
        report.seats_over_cap += 1
        gone = await service.store.evict_over_cap(company, seat, cap)
        report.evicted_over_cap += len(gone)
        await vector_rows.drop_points(service.index, COLLECTION_BASE, gone, "swept notes")
        await service.events.emit("diary_evicted_over_cap", company=company, seat=seat, evicted=len(gone), cap=cap)
    await emit_report(service.events, "diary_sweep_completed", report)
    return report


NOTES = VectorRows(
    name="diary",
    table="agent_diary",
    seat_column="seat",
    collection_base=COLLECTION_BASE,
    order_column="create_time",
    text_columns=("content",),
    text=lambda r: r["content"],
    point_columns=("expire_time",),
    point=lambda r, vec, model: index_point(r["id"], r["company"], r["seat"], vec, model, r["expire_time"]),
    live="(expire_time IS NULL OR expire_time > $NOW)",
)
"""The diary's notes as ``libs.common.vector_rows`` keeps them (an expired note is neither indexed
nor filled)."""


async def index_pending(service: DiaryService, batch: int = 1000) -> int:
    """Index notes whose vector is stored but not yet in the index (the index was down)."""
    return await vector_rows.index_pending(NOTES, service.store.pool, service.index, service.clock, batch)


async def rebuild_index(service: DiaryService, batch: int = 1000) -> int:
    """Restore the index from the vectors Postgres keeps: no embedding call at all."""
    return await vector_rows.rebuild_index(NOTES, service.store.pool, service.index, service.clock, batch)
