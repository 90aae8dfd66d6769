"""Cross-agent promotion, the third path (spec: "Cross-agent promotion is the third path").

A daily singleton pass (``skill-promotion``, under its lease): when at least
``learning.promotion.min_sibling_count`` DISTINCT seats of one unit converge on a similar tool run,
the cluster is distilled into ONE draft page of the team knowledge base under the unit's
"Auto-Drafted Skills" parent, for a lead to review. Its output is deliberately not a skill row: a
procedure four seats arrived at is something the team has, which makes it documentation.

- **Evidence**: each seat's newest settled raw turns (``skill_synthesis.min_tool_calls`` tools or
  more, ``episode_fetch_limit`` of them), read from the episodes service. A seat's unit is its
  role's ``unit`` as of its newest turn; only direct members pool — a parent unit does not pool its
  children's runs (there is no pooling across units at all), so a convergence is never drafted
  again one level up under a team that never converged.
- **Convergence**: the unit's runs are greedy-clustered by tool-set Jaccard
  (``promotion.cluster_jaccard_threshold``, the clustered pass's definition); a cluster qualifies
  by its distinct seats, not its size — one seat repeating itself is a habit, not a team practice.
  The representative is the medoid: a run that actually happened.
- **One draft per unit per pass**, the cluster with the most seats first. Its title is derived
  from the representative's tool set, and the writer (``PromotionWriter``: native pages or
  Confluence) keys on it. The representative moves as a cluster converges, so a cluster is
  looked up under the title of every tool set its members ran: one already drafted — or published
  by a lead — is found before any model call and the pass stays quiet about it; the next cluster
  is tried.
- **The distillation** is one auxiliary call (stage background, purpose ``skill_promotion``),
  attributed to the representative's seat and role, with an offline rule so the pass runs with no
  model.
- **A rejected draft stays rejected**: a lead rejects a draft by deleting it. A cluster with no
  page under any of its titles but an earlier filing (``draft_provenance``: under one of its
  titles, or resting on its runs) is drafted again only when the team converged again since —
  at least ``min_sibling_count`` distinct seats among the runs that filing did not rest on and
  that ended after it — never from the same runs re-clustered the next day.
- A unit with no container (``companies.<c>.knowledge.unit_containers.<unit>``) is soft-skipped and
  the log names the key to set. A write failure announces nothing; the next tick retries.
- Success publishes ``skill_promoted`` (unit, container_key, page_id, page_title, sibling_count,
  distinct_agents).
- Provenance (issue 17): a written draft's sources (seat and run id of every run of the cluster),
  the distillation's model and prompt version and the writer are recorded (``draft_provenance``)
  and read back by ``GetDraftProvenance``. A recording failure is logged and counted
  (``failures["provenance:..."]``); the draft stays.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import grpc

from libs.common.auxmodel import Attribution, AuxiliaryModel, Prompt, Stage
from libs.common.auxmodel.background_call import background_completion, json_object
from libs.common.clock import Clock
from libs.common.clustering import ToolCluster, greedy_groups, tool_set
from libs.common.config import Settings
from libs.common.events import EventSink
from libs.common.offline_draft import ClusterUsage
from libs.common.pass_report import SeatPassReport, emit_report
from libs.common.prompt_files import PromptFiles, cluster_fields, render_run
from services.knowledge.backends import BackendUnavailable, PromotionWriter
from services.knowledge.domain import DraftOrigin, PromotionDraft, PromotionResult
from services.knowledge.scope import unit_container
from services.skills.domain import Turn
from services.skills.episodes import EpisodeReader

__all__ = [
    "PROMPT_VERSION",
    "PURPOSE",
    "Distiller",
    "DraftProvenanceRecorder",
    "PromotionReport",
    "Run",
    "RunCluster",
    "cluster_runs",
    "converged_since",
    "draft_title",
    "drafted",
    "known_titles",
    "offline_rule",
    "promote",
    "title_of",
]

_log = logging.getLogger(__name__)

PURPOSE = "skill_promotion"
PROMPTS = Path(__file__).parent / "prompts"
MEMBERS_SHOWN = 8
"""Runs rendered into the prompt; the rest are counted, not shown."""
ASK_CHARS = 600
"""An ask longer than this is named by its size in the prompt rather than shown."""
QUOTE_CHARS = 160
"""The offline rule quotes an ask only up to this (whole or not at all)."""
TOOL_NAME_CHARS = 48
MAX_TOKENS = 2000
_PROMPT = PromptFiles(PROMPTS, PURPOSE, MAX_TOKENS)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
WRITER = "skill_promotion"
PROMPT_VERSION = hashlib.sha256(
    "\x1f".join((PROMPTS / f"{PURPOSE}.{part}.md").read_text() for part in ("system", "user")).encode()
).hexdigest()[:16]
"""The distillation prompt's version: a digest of its text, as every owner's provenance records it."""


class DraftProvenanceRecorder(Protocol):
    """Where a written draft's provenance is kept (``store.PostgresDraftProvenance``)."""

    async def record(self, origin: DraftOrigin) -> None: ...

    async def prior(
        self, company: str, container: str, unit: str, titles: Sequence[str], run_ids: Sequence[str]
    ) -> DraftOrigin | None:
        """The newest filing of the unit in ``container`` under one of ``titles`` or resting on one
        of ``run_ids``, its page there or not; None when there is none."""
        ...


def _ended(turn: Turn) -> datetime | None:
    """When the run ended, as an aware time (the episodes' timestamps arrive naive, in UTC)."""
    end = turn.end_time
    return end.replace(tzinfo=UTC) if end is not None and end.tzinfo is None else end


def converged_since(cluster: RunCluster, filing: DraftOrigin, min_seats: int) -> bool:
    """Whether the team converged again since ``filing``: the cluster's runs the filing did not
    rest on and that did not end before it was filed come from at least ``min_seats`` distinct
    seats on their own. The same runs re-clustered tick after tick are not a new convergence (a
    draft a lead rejected by deleting it is drafted again only if the team converges again), nor
    is one seat's run since. Only the runs still in the cluster and the filing's own record are
    read: an erased person's runs, gone from both, neither count nor are needed."""
    filed = set(filing.sources)
    fresh = {
        m.seat
        for m in cluster.members
        if (m.seat, m.turn.turn_id) not in filed and ((end := _ended(m.turn)) is None or end > filing.record_time)
    }
    return len(fresh) >= min_seats


def provenance_json(run_ids: Sequence[str], model: str, subjects: Sequence[str] = ()) -> str:
    """The draft's ``agentlearn.common.v1.Provenance`` JSON (proto field names): the runs, the
    model, the prompt version, the writer. The people behind the runs are found through their run
    ids (the episodes name them); the seats are kept beside it."""
    data: dict[str, object] = {
        "turn_ids": list(run_ids),
        "model": model,
        "prompt_version": PROMPT_VERSION,
        "writer": WRITER,
        # The people whose messages the runs answered (handles or external ids, as episodes keep them).
        "subjects": [{"handle": s} for s in sorted(set(subjects))],
    }
    return json.dumps({k: v for k, v in data.items() if v})


@dataclass(frozen=True)
class Run:
    """One settled turn of one seat: the evidence a convergence is made of."""

    seat: str
    turn: Turn

    @property
    def tools(self) -> tuple[str, ...]:
        return self.turn.tool_sequence


class RunCluster(ToolCluster[Run]):
    """One unit's runs, over its seats, that ran the same procedure."""

    @staticmethod
    def tools_of(member: Run) -> Sequence[str]:
        return member.tools

    @property
    def seats(self) -> list[str]:
        return sorted({m.seat for m in self.members})

    @property
    def distinct_agents(self) -> int:
        return len(self.seats)


def cluster_runs(runs: Sequence[Run], threshold: float) -> list[RunCluster]:
    """Greedy single pass over the unit's runs, newest first: each joins the first cluster whose
    seed's tool set is at least ``threshold`` similar, else seeds its own. Returned with the most
    distinct seats first, then the largest, then the newest seed."""
    ordered = sorted(runs, key=lambda r: (r.turn.end_time or _EPOCH, r.turn.turn_id), reverse=True)
    clusters = [RunCluster(group) for group in greedy_groups(ordered, RunCluster.tools_of, threshold)]
    order = {id(c): i for i, c in enumerate(clusters)}
    return sorted(clusters, key=lambda c: (-c.distinct_agents, -c.size, order[id(c)]))


def _distinct_in_order(tools: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(t for t in tools if t))


def draft_title(representative: Run) -> str:
    """The draft's title, a function of the representative's tool SET alone (sorted names, a digest
    of the whole set): the writer's dedup key, the same for every member that ran that set, in any
    order. The representative itself may move between ticks; :func:`known_titles` is how a tick
    finds the page an earlier representative titled. Never the ``[Auto-draft]`` prefix: the parent
    chain hides a draft, and a lead who publishes it by moving it keeps a title that does not hide
    it."""
    return title_of(tool_set(representative.tools))


def title_of(tools_run: frozenset[str]) -> str:
    """The title of a draft whose representative ran this tool set."""
    tools = sorted(tools_run)
    names = [t if len(t) <= TOOL_NAME_CHARS else t[: TOOL_NAME_CHARS - 1] + "…" for t in tools[:4]]
    digest = hashlib.sha1("\x1f".join(tools).encode()).hexdigest()[:8]
    more = f" +{len(tools) - 4} more" if len(tools) > 4 else ""
    return f"Team routine: {', '.join(names)}{more} ({digest})"


def known_titles(cluster: RunCluster, representative: Run) -> list[str]:
    """The titles this convergence may already be filed under: the representative's first, then
    that of every other tool set a member ran, the most-run first (ties: the newest run's).

    A draft is titled by the representative of the cluster it came from, and that medoid moves as
    the cluster converges: new runs of a neighbouring set make another member the most central,
    with another tool set and another title. A run of the drafted set still in the cluster is the
    drafted convergence's own evidence, so any member's set names a page this cluster would be a
    second copy of. Only runs that happened name a title, as only they title drafts."""
    counts: dict[frozenset[str], int] = {}
    for m in cluster.members:  # newest first: a tie keeps the newer run's place
        key = tool_set(m.tools)
        counts[key] = counts.get(key, 0) + 1
    first = tool_set(representative.tools)
    ordered = sorted(counts, key=lambda k: (k != first, -counts[k]))
    return list(dict.fromkeys(title_of(k) for k in ordered))


async def drafted(
    writer: PromotionWriter, company: str, container: str, cluster: RunCluster, representative: Run
) -> PromotionResult | None:
    """The page this convergence was already filed as (a draft, or a page a lead published under
    its title), or None. Asks the writer, which keys on the title, one title at a time
    (:func:`known_titles`); the first found answers. Raises :class:`BackendUnavailable`."""
    for title in known_titles(cluster, representative):
        found = await writer.existing_draft(company, container, title)
        if found is not None:
            return found
    return None


# ------------------------------------------------------------------------------ the distillation


def _line(text: str) -> str:
    return " ".join(text.split())


def cluster_data(unit: str, cluster: RunCluster, representative: Run) -> dict[str, Any]:
    """The question as structured inputs (what the offline rule reads)."""
    members = [representative, *[m for m in cluster.members if m is not representative]]
    shown = []
    for m in members[:MEMBERS_SHOWN]:
        ask = _line(m.turn.ask)
        shown.append(
            {
                "agent": m.seat,
                "woken_by": m.turn.label,
                "asked": ask if len(ask) <= ASK_CHARS else "",
                "asked_not_shown_bytes": 0 if len(ask) <= ASK_CHARS else len(m.turn.ask.encode()),
                "outcome": m.turn.outcome,
                "tool_sequence": list(m.tools),
            }
        )
    return {
        "unit": unit,
        "sibling_count": cluster.size,
        "distinct_agents": cluster.distinct_agents,
        "done_count": sum(1 for m in cluster.members if m.turn.outcome == "done"),
        "failed_count": sum(1 for m in cluster.members if m.turn.outcome == "failed"),
        "representative": list(representative.tools),
        "members": shown,
        "labels": [m.turn.label for m in cluster.members if m.turn.label],
    }


def _render_member(i: int, m: Mapping[str, Any]) -> str:
    heading = [
        f"Run {i} ({m['outcome'] or 'settled'}):",
        f"  agent: {m['agent']}",
        f"  woken by: {m['woken_by'] or '(no label)'}",
    ]
    return render_run(heading, m, (("asked", "asked", "ask"),))


def build_prompt(data: Mapping[str, Any]) -> Prompt:
    return _PROMPT.build(
        data,
        **cluster_fields(data, MEMBERS_SHOWN, _render_member),
        unit=data["unit"],
        distinct_agents=data["distinct_agents"],
        sibling_count=data["sibling_count"],
    )


def offline_rule(data: Mapping[str, Any]) -> str:
    """A deterministic page from the cluster alone: when the team uses it (the kinds of work and
    asks), the representative run's steps, and how often it ended done."""
    tools: list[str] = list(data["representative"])
    usage = ClusterUsage.of(data, QUOTE_CHARS)
    agents, size, done = int(data["distinct_agents"]), int(data["sibling_count"]), int(data["done_count"])
    summary = f"How the {data['unit']} team handles {usage.kind}: {' → '.join(_distinct_in_order(tools)[:4])}"
    lines = [
        f"{agents} agents of {data['unit']} ran this procedure independently ({size} runs, {done} done).",
        "",
        *usage.sections(tools, "runs"),
    ]
    return json.dumps({"summary": summary[:200], "body": "\n".join(lines) + "\n"})


def parse_page(text: str) -> tuple[str, str] | None:
    """(summary, body), or None when the answer has no body (nothing is written)."""
    obj = json_object(text)
    if obj is None:
        return None
    body, summary = obj.get("body"), obj.get("summary")
    if not isinstance(body, str) or not body.strip():
        return None
    return (" ".join(summary.split()) if isinstance(summary, str) else ""), body.strip()


class Distiller:
    """One auxiliary call per promoted cluster, charged as background work to the representative's
    seat through its role's chain."""

    def __init__(self, aux: AuxiliaryModel):
        self._aux = aux

    async def distil(
        self, company: str, seat: str, role: str, data: Mapping[str, Any]
    ) -> tuple[tuple[str, str] | None, str]:
        """((summary, body), "distilled"), or (None, why): "dropped" (no body), "no_auxiliary_model",
        or the failure."""
        page, outcome, _ = await self.distil_with_model(company, seat, role, data)
        return page, outcome

    async def distil_with_model(
        self, company: str, seat: str, role: str, data: Mapping[str, Any]
    ) -> tuple[tuple[str, str] | None, str, str]:
        """As :meth:`distil`, with the model that answered ("" when none did)."""
        completion, why = await background_completion(
            self._aux, Attribution(company, seat, Stage.BACKGROUND, PURPOSE, role=role or None), build_prompt(data)
        )
        if completion is None:
            return None, why, ""
        page = parse_page(completion.text)
        return (page, "distilled", completion.model) if page else (None, "dropped", completion.model)


def page_body(unit: str, summary: str, body: str, cluster: RunCluster, representative: Run) -> str:
    """The draft as filed: the distilled page, then where it came from and how a lead adopts it."""
    head = f"{summary}\n\n" if summary else ""
    return (
        f"{head}{body}\n\n---\n\n"
        f"Drafted by agentlearn from {cluster.size} runs by {cluster.distinct_agents} agents of unit {unit} "
        f"({', '.join(cluster.seats)}); representative run: {' → '.join(representative.tools)}.\n\n"
        "To publish it, move it out of the Auto-Drafted Skills page; to reject it, delete it (it is "
        "drafted again only if the team converges again).\n"
    )


# ------------------------------------------------------------------------------------- the pass


@dataclass
class PromotionReport(SeatPassReport):
    seats: int = 0
    units: int = 0
    units_without_container: int = 0
    units_converged: int = 0
    """Units with at least one cluster of min_sibling_count distinct seats."""
    promoted: int = 0
    already_drafted: int = 0
    """Converging clusters whose draft (or published page) was already there: quiet."""
    rejected: int = 0
    """Converging clusters filed before whose page is gone (a lead rejected the draft by deleting
    it) and that did not converge again since: quiet, no model call."""
    dropped: int = 0
    write_failures: int = 0
    sources_gone: int = 0
    """Drafts not written because a source run was gone (erased) by the time the model answered."""


async def _sources_gone(episodes: EpisodeReader, company: str, cluster: RunCluster) -> bool:
    """Whether any of ``cluster``'s runs is no longer its seat's (``EpisodeReader.missing``)."""
    by_seat: dict[str, list[str]] = {}
    for m in cluster.members:
        by_seat.setdefault(m.seat, []).append(m.turn.turn_id)
    for seat, turn_ids in sorted(by_seat.items()):
        if await episodes.missing(company, seat, turn_ids):
            return True
    return False


async def promote(
    settings: Settings,
    episodes: EpisodeReader,
    writer: PromotionWriter,
    distiller: Distiller,
    events: EventSink,
    provenance: DraftProvenanceRecorder | None = None,
    clock: Clock | None = None,
) -> PromotionReport:
    """One tick: read every seat's runs, pool them by unit, and draft one page per converging
    unit. One seat's or one unit's failure is logged, counted and passed over; the completion
    event is always emitted. With ``provenance`` (and its ``clock``), each written draft's sources
    are recorded."""
    synthesis = settings.learning.skill_synthesis
    report = PromotionReport()
    try:
        units: dict[tuple[str, str], list[Run]] = {}
        async for company, seat in episodes.seats():
            report.seats += 1
            try:
                turns = await episodes.recent_settled(
                    company, seat, synthesis.min_tool_calls, synthesis.episode_fetch_limit
                )
            except grpc.aio.AioRpcError as err:
                _log.warning("promotion: runs of %s/%s unreadable: %s", company, seat, err.code())
                report.seat_failed(f"episodes:{err.code().name}")
                continue
            turns = [t for t in turns if t.tool_sequence]
            if not turns:
                continue
            # The seat's unit as of its newest turn: direct membership, nothing inherited.
            role = settings.company(company).roles.get(turns[0].role) if turns[0].role else None
            if role is None or not role.unit:
                continue
            units.setdefault((company, role.unit), []).extend(Run(seat, t) for t in turns)
        for (company, unit), runs in sorted(units.items()):
            report.units += 1
            try:
                await _one_unit(
                    settings, episodes, writer, distiller, events, company, unit, runs, report, provenance, clock
                )
            except Exception as err:  # one unit's fault must not cost the others their promotion
                _log.exception("promotion for unit %s of %s failed; next unit", unit, company)
                report.fail(f"unit:{type(err).__name__}")
    finally:
        # Every count of the report but seats_failed, which the event has never carried.
        await emit_report(events, "skill_promotion_completed", report, leave_out=("seats_failed",))
    return report


async def _one_unit(
    settings: Settings,
    episodes: EpisodeReader,
    writer: PromotionWriter,
    distiller: Distiller,
    events: EventSink,
    company: str,
    unit: str,
    runs: list[Run],
    report: PromotionReport,
    provenance: DraftProvenanceRecorder | None = None,
    clock: Clock | None = None,
) -> None:
    cfg = settings.learning.promotion
    clusters = [
        c for c in cluster_runs(runs, cfg.cluster_jaccard_threshold) if c.distinct_agents >= cfg.min_sibling_count
    ]
    if not clusters:
        return
    report.units_converged += 1
    container = unit_container(settings, company, unit)
    if container is None:
        # A company that configured knowledge for one team and not another is supported: skip
        # softly, and say which field would make this unit's drafts land.
        report.units_without_container += 1
        _log.info(
            "promotion: unit %s of %s converged but has no knowledge container; set %s.knowledge.unit_containers.%s",
            unit,
            company,
            settings.company_key(company),
            unit,
        )
        return
    for cluster in clusters:  # most seats first
        representative = cluster.representative()
        title = draft_title(representative)
        try:
            existing = await drafted(writer, company, container, cluster, representative)
        except BackendUnavailable as err:
            report.write_failures += 1
            report.fail(f"existing:{err.reason}")
            _log.warning("promotion: drafts of %s/%s unreadable: %s", company, container, err.detail)
            return
        if existing is not None:
            # Drafted on an earlier tick (or published by a lead): stay quiet, try the next one.
            report.already_drafted += 1
            continue
        if provenance is not None:
            # No page, but filed before: a lead rejected it (a delete), or published it under another
            # title. Drafted again only when the team converged again since.
            try:
                filing = await provenance.prior(
                    company,
                    container,
                    unit,
                    known_titles(cluster, representative),
                    [m.turn.turn_id for m in cluster.members],
                )
            except Exception as err:  # cannot tell whether a lead rejected it: draft nothing this tick
                report.fail(f"prior:{type(err).__name__}")
                _log.warning("promotion: earlier drafts of %s/%s unreadable: %s", company, container, err)
                return
            if filing is not None and not converged_since(cluster, filing, cfg.min_sibling_count):
                report.rejected += 1
                continue
        data = cluster_data(unit, cluster, representative)
        page, outcome, model = await distiller.distil_with_model(
            company, representative.seat, representative.turn.role, data
        )
        if page is None:
            if outcome == "dropped":
                report.dropped += 1
            else:
                report.fail(outcome)
            _log.info("promotion: unit %s of %s: nothing drafted (%s)", unit, company, outcome)
            return
        # Its source runs read again after the model call: an erasure of the people they answered
        # may have taken them meanwhile, and a draft (and its provenance record) written now would
        # carry their run ids and handles after the erasure was verified. Any gone: nothing written.
        if await _sources_gone(episodes, company, cluster):
            report.sources_gone += 1
            _log.info("promotion: unit %s of %s: a source run of %r is gone since it was drafted", unit, company, title)
            return
        summary, body = page
        draft = PromotionDraft(
            company=company,
            unit=unit,
            container_key=container,
            title=title,
            body=page_body(unit, summary, body, cluster, representative),
            tool_sequence=tuple(representative.tools),
            sibling_count=cluster.size,
            distinct_agents=cluster.distinct_agents,
        )
        try:
            result = await writer.write_draft(draft)
        except Exception as err:  # PromotionRefused, BackendUnavailable, a store fault: all the same here
            # Nothing is announced; the next tick retries.
            report.write_failures += 1
            report.fail(f"write:{type(err).__name__}")
            _log.warning("promotion: draft %r for %s/%s not written: %s", title, company, container, err)
            return
        if not result.created:
            report.already_drafted += 1
            return
        report.promoted += 1
        if provenance is not None and clock is not None:
            sources = tuple((m.seat, m.turn.turn_id) for m in cluster.members)
            try:
                await provenance.record(
                    DraftOrigin(
                        company,
                        result.page_id,
                        str(result.backend),
                        container,
                        title,
                        unit,
                        sources,
                        provenance_json(
                            [t for _, t in sources], model, [s for m in cluster.members for s in m.turn.subjects]
                        ),
                        clock.now(),
                    )
                )
            except Exception as err:  # the draft is written: a lost record is reported, not fatal
                report.fail(f"provenance:{type(err).__name__}")
                _log.warning("promotion: provenance of draft %s not recorded: %s", result.page_id, err)
        await events.emit(
            "skill_promoted",
            company=company,
            unit=unit,
            container_key=container,
            page_id=result.page_id,
            page_title=result.page_title,
            sibling_count=cluster.size,
            distinct_agents=cluster.distinct_agents,
            backend=str(result.backend),
        )
        return  # one draft per unit per pass
