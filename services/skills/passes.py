"""The skills' background passes: the curator and clustered synthesis.

Each is a one-shot function; ``services.runner`` wraps it in a lease claim (``skill-curator``,
``skill-synthesis``), the all-in-one ticks it on its cadence, and a Kubernetes CronJob runs it as
``./run pass <name>``. Both are idempotent: the curator's transitions are conditional on the state
they leave, and the turns a pass drafted a skill from are stamped consolidated — by the pass that
drafted it, or, when that stamp failed, by the next pass, which finds them among the skill's
``source_turn_ids`` — so they are never evidence twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import grpc

from agentlearn.common.v1.erasure_pb2 import ErasureSubject
from agentlearn.common.v1.provenance_pb2 import Provenance
from libs.common.auxmodel.answers import digest
from libs.common.config import SkillSynthesisConfig
from libs.common.errors import AgentLearnError
from libs.common.pass_report import SeatPassReport, emit_report
from services.skills.domain import (
    Skill,
    SkillDraft,
    SkillState,
    SkillTrigger,
    Turn,
    best_match,
    greedy_clusters,
)
from services.skills.drafting import ClusterDrafter
from services.skills.episodes import EpisodeReader
from services.skills.service import SkillService

__all__ = ["CuratorReport", "SynthesisReport", "curate", "synthesize_clustered"]

_log = logging.getLogger(__name__)

CURATOR_BATCH = 10_000
"""Skills one curator statement moves; a large transition is a few short transactions."""


@dataclass
class CuratorReport:
    staled: int = 0
    archived: int = 0
    stale_after_days: int = 0
    archive_after_days: int = 0
    """The archive window applied (widened to the stale window when configured inside it)."""
    widened: bool = False


async def curate(service: SkillService) -> CuratorReport:
    """active → stale after stale_after_days unused, stale → archived after archive_after_days
    unused; pinned skills exempt. An archive window inside the stale window is widened to it.

    Archiving runs first, so one pass moves a skill one step at most: a skill always spends at
    least one curator interval stale — listed with its ageing marker — before it is archived, even
    when the curator has not run for months or the two windows are equal."""
    cfg = service.curator
    now = service.clock.now()
    stale_days = cfg.stale_after_days
    archive_days = max(cfg.archive_after_days, stale_days)
    report = CuratorReport(stale_after_days=stale_days, archive_after_days=archive_days)
    if archive_days != cfg.archive_after_days:
        report.widened = True
        _log.warning(
            "learning.skill_curator.archive_after_days (%d) is inside the stale window (%d); widened to %d",
            cfg.archive_after_days,
            stale_days,
            archive_days,
        )
    report.archived = await service.store.curate(
        SkillState.STALE, SkillState.ARCHIVED, "skill_archived", now - timedelta(days=archive_days), now, CURATOR_BATCH
    )
    report.staled = await service.store.curate(
        SkillState.ACTIVE, SkillState.STALE, "skill_staled", now - timedelta(days=stale_days), now, CURATOR_BATCH
    )
    await emit_report(service.events, "skill_curator_completed", report)
    return report


@dataclass
class SynthesisReport(SeatPassReport):
    seats: int = 0
    seats_with_clusters: int = 0
    drafted: int = 0
    dropped: int = 0
    """Drafts with a gap (no name, summary or body), or refused by CreateSkill."""
    skipped_duplicate: int = 0
    """Qualifying clusters the seat had already learned (skipped, not a stop)."""
    catalogue_full: int = 0
    seats_without_model: int = 0
    """Seats whose role's auxiliary chain names no provider: nothing drafted, nothing charged."""
    sources_gone: int = 0
    """Drafts dropped because a source turn was gone (erased) by the time the model answered."""
    restamped: int = 0
    """Turns stamped with the clustered skill drafted from them on an earlier pass whose own stamp
    failed (counted as the episodes service stamped them)."""


REFUSED_MOVE_ON = frozenset({"SKILL_NAME_TAKEN", "SKILL_DUPLICATE_TOOL_SET"})
"""CreateSkill refusals about the draft's identity (its name is the seat's already, or a skill with
its tool set arrived meanwhile): the cluster cannot be written as drafted, but the next one may."""


async def synthesize_clustered(
    service: SkillService, episodes: EpisodeReader, drafter: ClusterDrafter, cfg: SkillSynthesisConfig
) -> SynthesisReport:
    """Per seat: cluster its recent settled raw turns, and draft ONE skill from the largest
    qualifying cluster it has not already learned. One seat's failure is logged, counted and
    passed over; the completion event is always emitted."""
    report = SynthesisReport()
    try:
        async for company, seat in episodes.seats():
            report.seats += 1
            try:
                await _one_seat(service, episodes, drafter, cfg, company, seat, report)
            except grpc.aio.AioRpcError as err:
                # One seat's unreadable rows must not stop every other seat's synthesis.
                _log.warning("clustered synthesis for %s/%s: episodes call failed: %s", company, seat, err.code())
                report.seat_failed(f"episodes:{err.code().name}")
            except Exception as err:
                # Nor must any other fault confined to one seat (a draft the store cannot hold, ...).
                _log.exception("clustered synthesis for %s/%s failed; next seat", company, seat)
                report.seat_failed(f"seat:{type(err).__name__}")
    finally:
        # Every count of the report but seats_with_clusters, which the event has never carried.
        await emit_report(service.events, "skill_synthesis_completed", report, leave_out=("seats_with_clusters",))
    return report


async def _one_seat(
    service: SkillService,
    episodes: EpisodeReader,
    drafter: ClusterDrafter,
    cfg: SkillSynthesisConfig,
    company: str,
    seat: str,
    report: SynthesisReport,
) -> None:
    turns = await episodes.recent_settled(company, seat, cfg.min_tool_calls, cfg.episode_fetch_limit)
    # The seat's role as of its newest turn: whose llm_auxiliary chain drafts (and is charged).
    role = next((t.role for t in turns), "") or None
    # A turn a skill was already drafted from is not evidence twice; a turn with no tools has no
    # run to compare.
    turns = [t for t in turns if t.run and not t.consolidated_into_skill_id]
    if not turns:
        return
    # What the seat has learned is every skill it has, archived ones included: restoring an
    # archived skill is an operator's edit, not a re-synthesis (and a redraft would collide with
    # its name for ever).
    learned = await service.store.all_skills(company, seat)
    turns = await _restamp(episodes, company, seat, turns, learned, report)
    clusters = [c for c in greedy_clusters(turns, cfg.cluster_jaccard_threshold) if c.size >= cfg.cluster_min_size]
    if not clusters:
        return
    report.seats_with_clusters += 1
    live = [s for s in learned if s.live]
    if len(live) >= cfg.max_skills_per_agent:
        report.catalogue_full += 1
        return
    for cluster in clusters:  # largest first
        representative = cluster.representative()
        match = best_match(representative.run, learned)
        if match is not None and match[1] >= cfg.duplicate_jaccard_threshold:
            report.skipped_duplicate += 1
            # A skill is logged by id and a draft (no id yet) by the digest of its name, never by the
            # name: the model wrote it from people's messages and it may name one, and a log line is
            # kept where no erasure reaches. The id is the operator's handle (GetSkill, the events).
            _log.info(
                "%s/%s: a cluster of %d duplicates skill %s (%s, %.2f); next cluster",
                company,
                seat,
                cluster.size,
                match[0].id,
                match[0].state,
                match[1],
            )
            continue
        # One draft per seat per pass: whatever becomes of it, this seat is done until next pass —
        # unless the catalogue refuses the draft for its identity, which the next cluster may not share.
        data = drafter.data(cluster, representative, service.refinement.max_body_chars)
        draft, outcome = await drafter.draft(company, seat, data, role=role)
        if draft is None:
            if outcome == "dropped":
                report.dropped += 1
                _log.info("%s/%s: clustered draft dropped (no name, summary or body)", company, seat)
            elif outcome == "no_auxiliary_model":
                report.seats_without_model += 1
                _log.info("%s/%s (role %r): no auxiliary chain; nothing drafted", company, seat, role)
            else:
                report.fail(outcome)
            return
        turn_ids = [m.turn_id for m in cluster.members]
        subjects = sorted({s for m in cluster.members for s in m.subjects})
        # Its sources read again after the model call (seconds, or minutes): an erasure of the people
        # they answered may have taken them meanwhile, and a skill written now would carry her turns
        # and handles after the erasure was verified. Any gone: nothing is written this pass.
        gone = await episodes.missing(company, seat, turn_ids)
        if gone:
            report.sources_gone += 1
            _log.info(
                "%s/%s: %d source turns of draft %s gone since it was drafted; dropped",
                company,
                seat,
                len(gone),
                digest(draft.name),
            )
            return
        try:
            skill = await service.create(
                company,
                seat,
                SkillDraft.clustered(draft.name, draft.summary, draft.body, representative.run, turn_ids),
                archived_are_learned=True,
                provenance=Provenance(
                    turn_ids=turn_ids,
                    # The people whose messages the cluster's turns answered (issue 17).
                    subjects=[ErasureSubject(handle=s) for s in subjects],
                    model=draft.model,
                    prompt_version=draft.prompt_version,
                    writer="skill_synthesis:clustered",
                ),
            )
        except AgentLearnError as err:
            # A draft the catalogue refuses is dropped, not retried with a second completion. A
            # refusal of its identity (a name the seat has, a tool set that arrived meanwhile) is
            # this cluster's alone: the next cluster is tried. Any other (a body past the cap, a
            # catalogue a concurrent draft filled) ends the seat's pass.
            report.dropped += 1
            if err.reason in REFUSED_MOVE_ON:
                _log.info(
                    "%s/%s: clustered draft %s refused (%s); next cluster",
                    company,
                    seat,
                    digest(draft.name),
                    err.reason,
                )
                continue
            _log.info("%s/%s: clustered draft %s refused: %s", company, seat, digest(draft.name), err.reason)
            return
        report.drafted += 1
        try:
            await episodes.mark_consolidated(company, seat, turn_ids, str(skill.id))
        except grpc.aio.AioRpcError as err:
            # The skill stands; the next pass finds these turns among its source_turn_ids and
            # stamps them (``_restamp``), so nothing is redrafted and they are not evidence again.
            _log.warning("%s/%s: source turns of %s not stamped: %s", company, seat, skill.id, err.code())
            report.fail(f"consolidate:{err.code().name}")
        return


async def _restamp(
    episodes: EpisodeReader,
    company: str,
    seat: str,
    turns: list[Turn],
    learned: Sequence[Skill],
    report: SynthesisReport,
) -> list[Turn]:
    """Stamp the unstamped ``turns`` a clustered skill of the seat (in any state) was drafted from,
    and return the others, the pass's evidence.

    Such a turn is one whose stamp failed on the pass that drafted the skill (spec: "When the
    synthesizer drafts a skill from a cluster of episodes it stamps consolidated_into_skill_id on
    each source row"). Left alone it was stamped by nothing: its cluster is the skill's duplicate
    and is skipped, and with the catalogue full the pass stops before looking at clusters at all.
    Only a skill's own source turns are stamped: a turn that merely resembles a skill was not
    consolidated into it, and a stamp lets the episode lifecycle delete it after the grace, where
    it would otherwise be kept raw or folded into a summary. A single-turn skill's source is the
    reflector's synthesizer's to stamp (it retries its own). A stamp that fails again is logged and
    counted; the turns are still kept out of the evidence, and the next pass tries again."""
    source: dict[str, Skill] = {}
    for skill in learned:
        if skill.trigger is SkillTrigger.CLUSTERED:
            for turn_id in skill.source_turn_ids:
                source.setdefault(turn_id, skill)
    unstamped: dict[str, tuple[Skill, list[str]]] = {}
    for turn in turns:
        if turn.turn_id in source:
            skill = source[turn.turn_id]
            unstamped.setdefault(str(skill.id), (skill, []))[1].append(turn.turn_id)
    for skill, turn_ids in unstamped.values():
        try:
            report.restamped += await episodes.mark_consolidated(company, seat, turn_ids, str(skill.id))
        except grpc.aio.AioRpcError as err:
            _log.warning("%s/%s: source turns of %s still not stamped: %s", company, seat, skill.id, err.code())
            report.fail(f"consolidate:{err.code().name}")
            continue
        _log.info(
            "%s/%s: %d source turns of %s stamped (its pass's stamp had failed)",
            company,
            seat,
            len(turn_ids),
            skill.id,
        )
    return [t for t in turns if t.turn_id not in source]
