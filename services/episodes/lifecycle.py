"""The episode lifecycle pass (spec "Episode lifecycle"): ``./run pass episode-lifecycle``, hourly,
lease-claimed by the runner.

For each seat with raw rows it runs one indexed count; a seat at or under
``max_raw_episodes_per_agent`` costs nothing more. A seat over it gets, in this order:

1. drop ``self_iterate`` rows older than ``non_terminal_max_age_days`` (14);
2. drop tool-free rows older than ``tool_free_max_age_days`` (90) — counted alone as
   ``tool_free_dropped``, the one sweep whose deletions cannot be recovered;
3. drop rows a skill was drafted from, once older than ``consolidated_grace_days`` (30) and
   stamped at least that long ago (the grace is an audit window after the consolidation);
4. compact: the oldest ``compaction_batch_size`` (200) foldable raw rows older than
   ``compaction_min_age_days`` (30) — settled, tool-using, not a summary's exemplar, not absorbed
   by a skill — are greedy-clustered by the Jaccard similarity of their tool SETS; each cluster of
   ``compaction_min_cluster_size`` (3) or more is summarised by the seat's own auxiliary chain into
   one compacted row, 2–3 members kept raw as exemplars, the rest deleted, in one transaction;
   what the summary read of each member (and its run ids and senders) is kept in
   ``compaction_members`` for the row's provenance and for re-deriving it when a member's person
   is erased (``rederive``, issue 17; docs/privacy.md);
5. optionally evict compacted rows older than ``compacted_max_age_days`` (0 = off), with the
   exemplars they kept.

Each member reaches the summary as its date, how it ended, its whole tool sequence, its task and
its outcome; a task or outcome past ``condense_bytes`` (280) is first condensed by the same chain
and labelled ``(condensed)``, never cut, at most ``rewrite_concurrency`` (4) rewrites at once, and
one whose rewrite fails is carried whole. A summary that does not answer, or answers something
that is not the JSON asked for, leaves its cluster raw (nothing deleted) and is counted.

With no auxiliary model configured anywhere the pass does not run at all — no deletes either:
deleting is the half an operator least wants unsupervised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import re
import string
import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from libs.common.auxmodel import (
    Attribution,
    AuxiliaryModel,
    AuxiliaryUnavailable,
    NoAuxiliaryModel,
    OfflineRules,
    Prompt,
    Stage,
)
from libs.common.config import EpisodeLifecycleConfig
from libs.common.errors import Unavailable
from libs.common.events import EventSink
from libs.common.pass_report import SeatPassReport, add_counts, emit_report
from services.episodes.domain import DOMAIN, Episode, EpisodeKind, TurnOutcome, tool_set
from services.episodes.service import EpisodeService, drop_points
from services.episodes.store import Fold

__all__ = [
    "COMPACTION_PROMPT_VERSION",
    "COMPACTION_PURPOSE",
    "CONDENSED_LABEL",
    "CONDENSE_PURPOSE",
    "PASSING_FAILURES",
    "EpisodeLifecycle",
    "LifecycleReport",
    "compaction_rule",
    "condense_rule",
    "greedy_clusters",
    "jaccard",
    "member_record",
    "register_rules",
]

_log = logging.getLogger(__name__)
_PROMPTS = Path(__file__).parent / "prompts"

COMPACTION_PURPOSE = "episode_compaction"
CONDENSE_PURPOSE = "episode_condense"
CONDENSED_LABEL = "(condensed)"
SEATS_PER_READ = 500


def _prompt_file(name: str) -> string.Template:
    """A prompt file as a ``$name`` template (a file's final newline is not part of the prompt)."""
    return string.Template((_PROMPTS / name).read_text().rstrip("\n"))


_COMPACTION_SYSTEM = _prompt_file("episode_compaction.system.txt").template
_COMPACTION_USER = _prompt_file("episode_compaction.user.txt")
_CONDENSE_SYSTEM = _prompt_file("episode_condense.system.txt")
_CONDENSE_USER = _prompt_file("episode_condense.user.txt")
COMPACTION_PROMPT_VERSION = hashlib.sha256(
    "\x1f".join([_COMPACTION_SYSTEM, _COMPACTION_USER.template]).encode()
).hexdigest()[:16]
"""The compaction prompt's version (a digest of its text, as the reflector's workers version
theirs): recorded with each compacted row's provenance."""


# ------------------------------------------------------------------------------------ clustering


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 0.0
    return len(a & b) / len(a | b)


def greedy_clusters(rows: Sequence[Episode], threshold: float) -> list[list[Episode]]:
    """Greedy single pass, oldest first: a row joins the first cluster whose seed's tool set it
    overlaps at ``threshold`` or more, else seeds a cluster of its own. Sets, so neither the order
    of a turn's tools nor their repetition matters."""
    clusters: list[tuple[frozenset[str], list[Episode]]] = []
    for row in rows:
        tools = tool_set(row.tool_sequence, row.tools_called)
        for seed, members in clusters:
            if jaccard(seed, tools) >= threshold:
                members.append(row)
                break
        else:
            clusters.append((tools, [row]))
    return [members for _, members in clusters]


def pick_exemplars(members: Sequence[Episode]) -> list[Episode]:
    """2–3 members kept raw as drill-down anchors: three from a cluster of six or more, else two.
    The newest done member and the newest failed one first (both endings stay readable), then the
    newest of the rest."""
    want = 3 if len(members) >= 6 else 2
    newest = sorted(members, key=lambda e: (e.end_time, str(e.id)), reverse=True)
    picked: list[Episode] = []
    for outcome in (TurnOutcome.DONE, TurnOutcome.FAILED):
        found = next((e for e in newest if e.outcome is outcome), None)
        if found is not None and len(picked) < want:
            picked.append(found)
    for e in newest:
        if len(picked) >= want:
            break
        if e not in picked:
            picked.append(e)
    return picked


def _mode(values: Sequence[Any], prefer: Sequence[Any] = ()) -> Any:
    """The most common value; ties go to the earlier in ``prefer``, then to the latest seen."""
    counts = Counter(values)
    best = max(counts.values())
    tied = [v for v in counts if counts[v] == best]
    for p in prefer:
        if p in tied:
            return p
    return next(v for v in reversed(values) if v in tied)


def _union(groups: Sequence[Sequence[str]]) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for group in groups:
        for v in group:
            seen.setdefault(v, None)
    return tuple(seen)


# ------------------------------------------------------------------------------------ summaries


@dataclass(frozen=True)
class Summary:
    common_task_pattern: str
    common_outcome: str
    subjects_involved: tuple[str, ...]
    notable_patterns: tuple[str, ...]


def _strings(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value.strip(),) if value.strip() else ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(v.strip() for v in value if v.strip())
    return None


PASSING_FAILURES = frozenset({"rate_limited", "timeout", "server_error", "connection"})
"""Provider failure kinds that pass (``ProviderError``): the same call may answer a little later.
The others (refused, configuration, no_rule) and a chain naming no model are final."""


class _PassingFailure(Exception):
    """The chain did not answer, and a provider's failure was a passing one (``kind``)."""

    def __init__(self, kind: str):
        super().__init__(kind)
        self.kind = kind


def parse_summary(text: str) -> Summary | None:
    """The model's JSON object, or ``None`` when it is not the object asked for."""
    body = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", body, flags=re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    pattern, outcome = obj.get("common_task_pattern"), obj.get("common_outcome", "")
    if not isinstance(pattern, str) or not pattern.strip() or not isinstance(outcome, str):
        return None
    subjects, notable = _strings(obj.get("subjects_involved")), _strings(obj.get("notable_patterns"))
    if subjects is None or notable is None:
        return None
    return Summary(pattern.strip(), outcome.strip(), subjects, notable)


# ------------------------------------------------------------------------------------ offline rules

_STOP = frozenset(
    """a an and are as at be by for from has have in into is it its of on or that the this to was were
    with message slack email from assigned work scheduled""".split()
)
_WORD = re.compile(r"[a-z][a-z0-9_-]{2,}")


def _common(groups: Sequence[Sequence[str]], at_least: float) -> list[str]:
    """Items present in at least ``at_least`` of the groups, most frequent first (then first seen)."""
    order = _union(groups)
    df = Counter(v for g in groups for v in set(g))
    need = max(1, int(len(groups) * at_least + 0.999))
    return sorted((v for v in order if df[v] >= need), key=lambda v: (-df[v], order.index(v)))


def compaction_rule(data: Mapping[str, Any]) -> str:
    """The offline summary: what the members share, read off their labels, tools and endings."""
    members = list(data.get("members", []))
    n = len(members)
    words = _common([_WORD.findall(str(m.get("label", "")).lower()) for m in members], 0.5)
    words = [w for w in words if w not in _STOP][:6]
    tools = _common([list(m.get("tools", [])) for m in members], 0.5)[:6]
    ended = Counter(str(m.get("ended", "")) for m in members)
    about = f"work on {' '.join(words)}" if words else "recurring work"
    pattern = f"{about}, using {', '.join(tools)}" if tools else about
    tally = f"{ended.get('done', 0)} of {n} ended done"
    if ended.get("failed"):
        tally += f", {ended['failed']} failed"
    notable = [
        f"sometimes also {tool} ({sum(tool in m.get('tools', []) for m in members)} of {n})"
        for tool in _union([list(m.get("tools", [])) for m in members])
        if tool not in tools
    ][:4]
    dates = sorted(str(m.get("date", "")) for m in members if m.get("date"))
    if dates:
        notable.append(f"between {dates[0]} and {dates[-1]}")
    return json.dumps(
        {
            "common_task_pattern": pattern[:1].upper() + pattern[1:],
            "common_outcome": tally,
            "subjects_involved": list(_union([list(m.get("subjects", [])) for m in members])),
            "notable_patterns": notable,
        }
    )


def condense_rule(data: Mapping[str, Any]) -> str:
    """The offline rewrite: the text's first and last sentences (what it was for, how it ended),
    each trimmed between words to half the limit."""
    text = " ".join(str(data.get("text", "")).split())
    limit = int(data.get("limit_bytes", 280))
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s]

    def fit(s: str, budget: int) -> str:
        out = ""
        for word in s.split():
            candidate = f"{out} {word}".strip()
            if len(candidate.encode()) > budget:
                break
            out = candidate
        return out

    half = max(16, limit // 2 - 4)
    if len(sentences) <= 1:
        return fit(text, limit - 4) + " …"
    return f"{fit(sentences[0], half)} … {fit(sentences[-1], half)}"


def register_rules(rules: OfflineRules) -> None:
    rules.register(COMPACTION_PURPOSE, compaction_rule)
    rules.register(CONDENSE_PURPOSE, condense_rule)


# ------------------------------------------------------------------------------------ the pass


@dataclass
class SeatCounts:
    """What one seat's pass did, counted (added into the pass's report, and announced as the seat's
    ``compaction_completed``)."""

    non_terminal_dropped: int = 0
    tool_free_dropped: int = 0
    consolidated_dropped: int = 0
    clusters_compacted: int = 0
    episodes_compacted: int = 0
    """Members of the clusters folded (exemplars included)."""
    episodes_deleted: int = 0
    """Members deleted by folds (the exemplars stay)."""
    exemplars_kept: int = 0
    compaction_failed: int = 0
    """Clusters left raw: the summary did not answer, or not with the JSON asked for."""
    compacted_evicted: int = 0


@dataclass
class LifecycleReport(SeatCounts, SeatPassReport):
    """The pass: every seat's counts summed, and what only the pass counts."""

    ran: bool = True
    reason: str | None = None
    seats_checked: int = 0
    seats_due: int = 0
    compaction_conflicts: int = 0
    """Clusters left raw because a member changed while the summary was being written."""
    seats_without_model: int = 0
    """Seats over the threshold whose role has no auxiliary chain: dropped, not compacted."""
    condensed: int = 0
    condense_failed: int = 0
    exemplars_evicted: int = 0
    retention_deleted: int = 0
    """Episodes past their company's retention (privacy.retention.episode_max_age_days)."""


class EpisodeLifecycle:
    def __init__(self, service: EpisodeService, aux: AuxiliaryModel, config: EpisodeLifecycleConfig, events: EventSink):
        self.service = service
        self.store = service.store
        self.aux = aux
        self.config = config
        self.events = events

    async def run(self) -> LifecycleReport:
        report = LifecycleReport()
        if not self.aux.configured_anywhere():
            report.ran, report.reason = False, "no_auxiliary_model"
            _log.warning("episode lifecycle: no auxiliary model is configured anywhere; the pass does not run")
            await emit_report(self.events, "episode_lifecycle_pass", report)
            return report
        now = self.service.clock.now()
        self._rewrites = asyncio.Semaphore(max(1, self.config.rewrite_concurrency))
        after: tuple[str, str] | None = None
        try:
            while True:
                seats = await self.store.seats(None, after, SEATS_PER_READ)
                for company, seat in seats:
                    report.seats_checked += 1
                    try:
                        # The gate: one indexed count; "not yet" is the common answer and costs only this.
                        raw = await self.store.raw_count(company, seat)
                        if raw <= self.config.max_raw_episodes_per_agent:
                            continue
                        report.seats_due += 1
                        # The spec's compaction_requested: this seat is due, its pass starts (its
                        # compaction_completed says what it did, or how it failed).
                        await self.events.emit(
                            "compaction_requested",
                            company=company,
                            seat=seat,
                            raw_episodes=raw,
                            max_raw_episodes=self.config.max_raw_episodes_per_agent,
                        )
                        await self._seat(company, seat, now, report)
                    except Exception as err:
                        # One seat's fault (a row the store refuses, a statement that fails) must not
                        # stop every other seat's lifecycle: logged with the seat, counted, and on.
                        _log.exception("episode lifecycle: %s/%s failed; next seat", company, seat)
                        report.seat_failed(type(err).__name__)
                if len(seats) < SEATS_PER_READ:
                    break
                after = seats[-1]
        finally:
            # Always announced, even when the seat listing itself failed, with what was done.
            await emit_report(self.events, "episode_lifecycle_pass", report)
        return report

    async def _seat(self, company: str, seat: str, now: datetime, report: LifecycleReport) -> None:
        counts = SeatCounts()
        failure: str | None = None
        try:
            await self._seat_steps(company, seat, now, counts, report)
        except BaseException as err:
            failure = type(err).__name__
            raise
        finally:
            # What was done is reported even when a later step failed, in the pass's report and in
            # the seat's compaction_completed (``failure`` names why it stopped): a drop is
            # irrecoverable. The spec's CompactionCompleted folds the tool-free drops into
            # non_terminal_dropped; only episode_lifecycle_pass reports them alone.
            add_counts(report, counts)
            payload: dict[str, Any] = asdict(counts)
            payload["non_terminal_dropped"] += payload.pop("tool_free_dropped")
            await self.events.emit("compaction_completed", company=company, seat=seat, failure=failure, **payload)

    async def _seat_steps(
        self, company: str, seat: str, now: datetime, counts: SeatCounts, report: LifecycleReport
    ) -> None:
        cfg = self.config

        def ago(days: int) -> datetime:
            return now - timedelta(days=days)

        gone = await self.store.drop("non_terminal", company, seat, ago(cfg.non_terminal_max_age_days))
        counts.non_terminal_dropped = len(gone)
        tool_free = await self.store.drop("tool_free", company, seat, ago(cfg.tool_free_max_age_days))
        counts.tool_free_dropped = len(tool_free)
        consolidated = await self.store.drop("consolidated", company, seat, ago(cfg.consolidated_grace_days))
        counts.consolidated_dropped = len(consolidated)
        await drop_points(self.service.index, [*gone, *tool_free, *consolidated])

        role = await self.store.seat_role(company, seat)
        if self.aux.configured(company, role):
            await self._compact(company, seat, role, ago(cfg.compaction_min_age_days), now, counts, report)
        else:
            report.seats_without_model += 1
            _log.info("episode lifecycle: %s/%s (role %r) has no auxiliary chain; not compacted", company, seat, role)

        if cfg.compacted_max_age_days > 0:
            evicted, exemplars = await self.store.evict_compacted(company, seat, ago(cfg.compacted_max_age_days))
            counts.compacted_evicted = evicted
            report.exemplars_evicted += len(exemplars)
            await drop_points(self.service.index, exemplars)

    # ---------------------------------------------------------------- compaction

    async def _compact(
        self,
        company: str,
        seat: str,
        role: str | None,
        before: datetime,
        now: datetime,
        counts: SeatCounts,
        report: LifecycleReport,
    ) -> None:
        cfg = self.config
        rows = await self.store.fold_candidates(company, seat, before, cfg.compaction_batch_size)
        clusters = [
            c
            for c in greedy_clusters(rows, cfg.compaction_jaccard_threshold)
            if len(c) >= cfg.compaction_min_cluster_size
        ]
        if not clusters:
            return
        # Every long task and outcome of the batch, rewritten at most `rewrite_concurrency` at once.
        texts = {t for c in clusters for e in c for t in (_task(e), e.what_it_did) if self._too_long(t)}
        rewrites = await self._condense_all(company, seat, role, sorted(texts), report)
        for cluster in clusters:
            await self._fold(company, seat, role, cluster, rewrites, before, now, counts, report)

    def _too_long(self, text: str) -> bool:
        return len(text.encode()) > self.config.condense_bytes

    async def _condense_all(
        self, company: str, seat: str, role: str | None, texts: list[str], report: LifecycleReport
    ) -> dict[str, str]:
        out: dict[str, str] = {}

        async def one(text: str) -> None:
            async with self._rewrites:
                rewritten = await self._condense(company, seat, role, text)
            if rewritten is None:
                report.condense_failed += 1  # carried whole
            else:
                report.condensed += 1
                out[text] = f"{CONDENSED_LABEL} {rewritten}"

        async with asyncio.TaskGroup() as group:
            for text in texts:
                group.create_task(one(text))
        return out

    async def _condense(self, company: str, seat: str, role: str | None, text: str) -> str | None:
        limit = self.config.condense_bytes
        prompt = Prompt(
            purpose=CONDENSE_PURPOSE,
            system=_CONDENSE_SYSTEM.substitute(limit=limit),
            user=_CONDENSE_USER.substitute(text=text),
            data={"text": text, "limit_bytes": limit},
            max_tokens=max(64, limit // 2),
        )
        try:
            completion = await self.aux.complete(
                Attribution(company, seat, Stage.BACKGROUND, CONDENSE_PURPOSE, role=role), prompt
            )
        except (AuxiliaryUnavailable, NoAuxiliaryModel) as err:
            _log.info("condensation failed for %s/%s (%s); the text is carried whole", company, seat, err)
            return None
        rewritten = completion.text.strip()
        return rewritten or None

    async def _fold(
        self,
        company: str,
        seat: str,
        role: str | None,
        cluster: list[Episode],
        rewrites: Mapping[str, str],
        before: datetime,
        now: datetime,
        counts: SeatCounts,
        report: LifecycleReport,
    ) -> None:
        members = [_member(e, rewrites) for e in cluster]
        summary, why, model = await self._summarise(company, seat, role, members)
        if summary is None:
            counts.compaction_failed += 1
            _log.warning("compaction of %d episodes of %s/%s left raw: %s", len(cluster), company, seat, why)
            await self.events.emit("compaction_failed", company=company, seat=seat, members=len(cluster), reason=why)
            return
        exemplars = pick_exemplars(cluster)
        compacted = _compacted(company, seat, role, cluster, summary, exemplars)
        records = [member_record(e, m) for e, m in zip(cluster, members, strict=True)]
        fold = Fold(
            compacted,
            [e.id for e in cluster],
            [e.id for e in exemplars],
            members=records,
            model=model,
            prompt_version=COMPACTION_PROMPT_VERSION,
        )
        deleted = await self.store.fold(fold, before, now)
        if deleted is None:
            report.compaction_conflicts += 1
            return
        await drop_points(self.service.index, deleted)
        counts.clusters_compacted += 1
        counts.episodes_compacted += len(cluster)
        counts.episodes_deleted += len(deleted)
        counts.exemplars_kept += len(exemplars)

    async def _summarise(
        self,
        company: str,
        seat: str,
        role: str | None,
        members: list[dict[str, Any]],
        *,
        give_up_on_passing: bool = True,
    ) -> tuple[Summary | None, str, str]:
        """The seat's chain's summary of ``members`` (what ``_member`` renders of each): (the
        summary or None, why not, the model that answered). The one path a compacted row's text is
        written by: folding a cluster, and re-deriving it when a member's person is erased.
        ``give_up_on_passing`` False: a chain that failed passingly somewhere (``PASSING_FAILURES``)
        raises :class:`_PassingFailure` instead of answering None."""
        prompt = Prompt(
            purpose=COMPACTION_PURPOSE,
            system=_COMPACTION_SYSTEM,
            user=_COMPACTION_USER.substitute(count=len(members), seat=seat, members=_render(members)),
            data={"seat": seat, "members": members},
            max_tokens=600,
            json_output=True,
        )
        try:
            completion = await self.aux.complete(
                Attribution(company, seat, Stage.BACKGROUND, COMPACTION_PURPOSE, role=role), prompt
            )
        except AuxiliaryUnavailable as err:
            passing = [kind for _, kind in err.failures if kind in PASSING_FAILURES]
            if passing and not give_up_on_passing:
                raise _PassingFailure(passing[-1]) from err
            return None, err.kind, ""
        except NoAuxiliaryModel:
            return None, "no_auxiliary_model", ""
        summary = parse_summary(completion.text)
        return summary, "invalid_json" if summary is None else "", completion.model

    async def rederive(
        self, company: str, seat: str, role: str | None, records: Sequence[Mapping[str, Any]], exemplars: Sequence[str]
    ) -> tuple[Episode, str] | None:
        """A compacted row re-derived from ``records`` (its remaining members' ``compaction_members``
        records) by the summary that folded it, with ``exemplars`` (the run ids of the exemplars
        still kept): the new row's columns (its id is a placeholder) and the model; None when the
        chain refused for good (no model, a refusal, an answer that is not the summary: the caller
        deletes the row instead).

        A chain only briefly down (a provider rate limited, timed out, erring or out of reach) is
        no reason to delete: the row holds everyone else's summarised turns, whose raw rows were
        folded away. That raises ``Unavailable`` (``SUMMARY_MODEL_UNAVAILABLE``), failing this
        owner's ``EraseRows`` before anything is erased, so the privacy worker tries the erasure
        again after ``privacy.retry_seconds`` (up to ``privacy.max_attempts``)."""
        try:
            summary, why, model = await self._summarise(
                company, seat, role, [dict(r["member"]) for r in records], give_up_on_passing=False
            )
        except _PassingFailure as err:
            kind = err.kind
            _log.warning(
                "re-deriving a compacted row of %s/%s failed (%s); the erasure is retried", company, seat, kind
            )
            raise Unavailable(
                f"the summary model of seat {seat} did not answer ({kind}) re-deriving a compacted episode; "
                "the erasure is retried rather than the row deleted",
                reason="SUMMARY_MODEL_UNAVAILABLE",
                domain=DOMAIN,
                metadata={"seat": seat, "failure": kind},
            ) from err
        if summary is None:
            _log.warning("re-deriving a compacted row of %s/%s failed (%s); it is deleted", company, seat, why)
            return None
        cluster = [_episode_of_record(company, seat, r) for r in records]
        row = _compacted(company, seat, role, cluster, summary, [])
        return dataclasses.replace(row, exemplar_turn_ids=tuple(exemplars)), model


def member_record(e: Episode, member: Mapping[str, Any]) -> dict[str, Any]:
    """What ``compaction_members`` keeps of a member: what the summary read (``member``) and the
    columns the compacted row counts from its members (so a re-derivation counts the same way)."""
    return {
        "member": dict(member),
        "episode": {
            "turn_id": e.turn_id,
            "outcome": str(e.outcome),
            "start_time": e.start_time.isoformat(),
            "end_time": e.end_time.isoformat(),
            "label": e.label,
            "review_outcome": e.review_outcome,
            "tool_sequence": list(e.tool_sequence),
            "tools_called": list(e.tools_called),
            "skills_used": list(e.skills_used),
            "subjects": list(e.subjects),
            "duration_ms": e.duration_ms,
            "conversation_id": e.conversation_id,
        },
    }


def _episode_of_record(company: str, seat: str, record: Mapping[str, Any]) -> Episode:
    e = record["episode"]
    return Episode(
        id=uuid.uuid4(),
        company=company,
        seat=seat,
        kind=EpisodeKind.RAW,
        outcome=TurnOutcome(e["outcome"]),
        start_time=datetime.fromisoformat(e["start_time"]),
        end_time=datetime.fromisoformat(e["end_time"]),
        turn_id=e["turn_id"],
        label=e["label"],
        review_outcome=e["review_outcome"],
        tool_sequence=tuple(e["tool_sequence"]),
        tools_called=tuple(e["tools_called"]),
        skills_used=tuple(e["skills_used"]),
        subjects=tuple(e["subjects"]),
        duration_ms=int(e["duration_ms"]),
        conversation_id=e["conversation_id"],
    )


def _task(e: Episode) -> str:
    """A member's task: what it was asked, or — told nothing — the label of what woke it."""
    return e.ask if e.ask.strip() else e.label


def _member(e: Episode, rewrites: Mapping[str, str]) -> dict[str, Any]:
    task, outcome = _task(e), e.what_it_did
    return {
        "date": e.end_time.date().isoformat(),
        "ended": str(e.outcome),
        "tools": list(e.tool_sequence or e.tools_called),
        "task": rewrites.get(task, task),
        "outcome": rewrites.get(outcome, outcome),
        "label": e.label,
        "subjects": list(e.subjects),
    }


def _render(members: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for i, m in enumerate(members, 1):
        lines.append(f"{i}. {m['date']} · ended {m['ended']} · tools: {' → '.join(m['tools'])}")
        lines.append(f"   task: {m['task']}")
        lines.append(f"   outcome: {m['outcome']}")
    return "\n".join(lines)


def _compacted(
    company: str,
    seat: str,
    role: str | None,
    cluster: Sequence[Episode],
    summary: Summary,
    exemplars: Sequence[Episode],
) -> Episode:
    """The compacted row: the model's aggregate, with everything countable counted from the members
    (count, done_count, success_rate, window) and the cluster's common values in the per-turn
    columns."""
    oldest_first = sorted(cluster, key=lambda e: (e.end_time, str(e.id)))
    done = sum(e.outcome is TurnOutcome.DONE for e in cluster)
    # Filed under a conversation only when every member was in that one: the conversation path
    # then returns the summary beside its exemplars ("its recency and conversation paths return
    # both kinds"); a cluster spanning several conversations belongs to none of them.
    conversations = {e.conversation_id for e in cluster}
    conversation_id = conversations.pop() if len(conversations) == 1 else None
    sequences = [e.tool_sequence for e in oldest_first if e.tool_sequence] or [e.tools_called for e in oldest_first]
    return Episode(
        id=uuid.uuid4(),
        company=company,
        seat=seat,
        kind=EpisodeKind.COMPACTED,
        outcome=_mode(
            [e.outcome for e in oldest_first], prefer=(TurnOutcome.DONE, TurnOutcome.FAILED, TurnOutcome.SKIPPED)
        ),
        start_time=min(e.start_time for e in cluster),
        end_time=max(e.end_time for e in cluster),
        role=role,
        label=_mode([e.label for e in oldest_first]),
        what_it_did=summary.common_outcome,
        review_outcome=_mode([e.review_outcome for e in oldest_first]),
        tool_sequence=tuple(_mode(sequences)),
        tools_called=_union([e.tools_called or e.tool_sequence for e in oldest_first]),
        skills_used=_union([e.skills_used for e in oldest_first]),
        subjects=_union([e.subjects for e in oldest_first]),
        duration_ms=sum(e.duration_ms for e in cluster),
        count=len(cluster),
        common_task_pattern=summary.common_task_pattern,
        common_outcome=summary.common_outcome,
        success_rate=done / len(cluster),
        done_count=done,
        subjects_involved=_union([summary.subjects_involved, *(e.subjects for e in oldest_first)]),
        notable_patterns=summary.notable_patterns,
        exemplar_turn_ids=tuple(e.turn_id or "" for e in exemplars),
        conversation_id=conversation_id,
    )
