"""The builtin tools an engine hands its model mid-turn (``BuiltinService``).

Every refusal is a rich status (``ErrorInfo`` reason, domain ``prefetch.agentlearn.dev``, the field
in ``BadRequest``); a refusal from the service behind a tool (the diary's ``NOTE_TOO_LONG``, the
skills' ``REFINEMENT_DISABLED``) passes through with its own code, reason, domain and field.
Answers that are not refusals (nothing found, a search that could not run) are tool-result text
that says in words what happened and where to go next.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from libs.common.embeddings import (
    EmbeddingConfigurationError,
    EmbeddingError,
    EmbeddingRefused,
    embed_query,
)
from libs.common.errors import PermissionDenied, ResourceExhausted, field_error
from libs.common.validation import require_text, seat_ref
from services.knowledge.domain import ReadContext, Reader, ReadSource, SearchOutcome
from services.prefetch import memory
from services.prefetch.calltool import tool_request_id
from services.prefetch.deps import Deps, Who
from services.prefetch.domain import (
    DOMAIN,
    HINT_MAX_CHARS,
    QUERY_EPISODES_LIMIT,
    QUERY_MAX_CHARS,
    REFRESH_LIMIT,
    SEARCH_KNOWLEDGE_LIMIT,
    Limit,
    Sender,
    chain_hash,
    hint_key,
    one_line,
)
from services.prefetch.downstream_errors import passthrough
from services.prefetch.knowledge_block import render_search_result, search
from services.prefetch.past_turns import PastTurns
from services.prefetch.store import LedgerEntry, RunKey
from services.prefetch.turn_context import mark_used

__all__ = [
    "Builtins",
    "EpisodesAnswer",
    "KnowledgeAnswer",
    "RefreshAnswer",
]

_log = logging.getLogger(__name__)
_R = TypeVar("_R")

_OUTCOME_FILTER = {
    "done": ep_pb.TURN_OUTCOME_DONE,
    "failed": ep_pb.TURN_OUTCOME_FAILED,
    "self_iterate": ep_pb.TURN_OUTCOME_SELF_ITERATE,
    "skipped": ep_pb.TURN_OUTCOME_SKIPPED,
}
_OTHER_PATHS = (
    "Your turns can still be read by conversation (query_episodes with conversation_id) or by recency "
    "(query_episodes with no query)."
)
_CANNOT_RUN = {
    "no_embeddings": (
        "query_episodes cannot search by meaning: this company has no embeddings configured, so stop asking by meaning."
    ),
    "configuration": (
        "query_episodes cannot search by meaning: the embedder refuses its configuration (a rejected "
        "key, a missing model or endpoint, or a vector width the store was not sized for). No query will "
        "get past it until an operator fixes providers.embeddings, so stop asking by meaning until then."
    ),
    "refused": (
        "query_episodes could not search by meaning: the embedder refused this query. A differently "
        "worded query may get past it."
    ),
    "unavailable": (
        "query_episodes could not search by meaning: the embedder could not answer now ({detail}). "
        "Asking again may work."
    ),
    "store": "query_episodes could not search: the episode store could not be read ({detail}).",
}


@dataclass(frozen=True)
class RefreshAnswer:
    text: str
    note_ids: list[str]
    spent: int
    allowed: int
    from_ledger: bool


@dataclass(frozen=True)
class EpisodesAnswer:
    text: str
    episode_ids: list[str]
    unreachable: int


@dataclass(frozen=True)
class KnowledgeAnswer:
    text: str
    outcome: SearchOutcome


def _limit(value: int, field: str, limit: Limit) -> int:
    default, maximum = limit.default, limit.maximum
    if value < 0:
        raise field_error(
            field,
            "LIMIT_OUT_OF_RANGE",
            f"{field} must not be negative, got {value}",
            domain=DOMAIN,
            value=value,
            maximum=maximum,
        )
    return default if value == 0 else min(value, maximum)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class Builtins:
    def __init__(self, deps: Deps, past_turns: PastTurns):
        self.deps = deps
        self.past_turns = past_turns

    async def _call(self, service: str, rpc: Callable[..., Awaitable[_R]], request: Message) -> _R:
        """One call on ``service`` under the tools' deadline; its refusal is passed through as the
        tool's own (its code, reason, domain and details: ``passthrough``)."""
        try:
            return await rpc(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as err:
            raise passthrough(service, err) from err

    @property
    def _timeout(self) -> float:
        return self.deps.clients.timeout

    async def _budget_spent(self, company: str, seat: str) -> bool:
        """True while the seat's or the company's token window is full: an in-turn builtin then
        makes no model call (spec "What the auxiliary calls cost": the turn's meter makes none
        "while it holds a full window") and answers without one. Unknown (no ceiling, an unreadable
        counter) is not spent."""
        room = await self.deps.aux.room(company, seat)
        return room is not None and room.exhausted

    # ------------------------------------------------------------------ refresh_memory

    async def refresh_memory(
        self, company: str, seat: str, turn_id: str, hint: str, limit: int, senders: tuple[Sender, ...], role: str
    ) -> RefreshAnswer:
        """Re-run the similarity half and the filter on the model's own hint. Capped per run id;
        a repeat of a normalised hint is answered from the run's ledger (the rows it cached, so a
        larger limit gets more); a failed filter spends its slot and is not cached, so the same
        hint may be retried (which spends another)."""
        seat_ref(company, seat, domain=DOMAIN)
        require_text(turn_id, "turn_id", domain=DOMAIN, max_chars=200)
        require_text(hint, "context_hint", domain=DOMAIN, max_chars=HINT_MAX_CHARS)
        limit = _limit(limit, "limit", REFRESH_LIMIT)
        # One run's refreshes go one at a time, on every replica: two parallel calls with the same
        # hint would otherwise both spend a slot and both call the filter, and two repeats would
        # both count the same newly shown notes as uses. The lease is held no longer than the work
        # can take: the filter's bound and the diary calls' (recall, uses) with one more to spare.
        settings = self.deps.settings.learning
        hold_for = settings.prefetch.aux_timeout_seconds + 3 * self._timeout
        run = RunKey(company, seat, turn_id)
        keep = settings.personal_memory.refresh_ledger_runs
        async with self.deps.store.one_at_a_time(run, hold_for=hold_for, keep_runs=keep, now=self.deps.clock.now()):
            return await self._refresh_memory(company, seat, turn_id, hint, limit, senders, role)

    async def _refresh_memory(
        self, company: str, seat: str, turn_id: str, hint: str, limit: int, senders: tuple[Sender, ...], role: str
    ) -> RefreshAnswer:
        settings = self.deps.settings.learning.personal_memory
        cap = settings.max_refreshes_per_turn
        key = hint_key(hint)
        store, now = self.deps.store, self.deps.clock.now()
        reservation = await store.reserve(company, seat, turn_id, key, cap, settings.refresh_ledger_runs, now)
        if reservation.outcome == "refused":
            raise ResourceExhausted.of_field(
                "turn_id",
                "REFRESH_LIMIT_REACHED",
                f"refresh_memory refused: this turn has already spent {reservation.spent} of its {cap} "
                "refreshes. Work with the notes you have; a hint you already used this turn is still "
                "answered from the turn's ledger at no cost.",
                domain=DOMAIN,
                spent=reservation.spent,
                allowed=cap,
                turn_id=turn_id,
            )
        if reservation.outcome == "cached":
            assert reservation.entry is not None
            notes = [memory.MemoryNote.from_row(r) for r in reservation.entry.notes]
            shown = notes[:limit]
            fresh = [n.id for n in notes[reservation.entry.shown : limit]]
            if fresh:  # selected by the filter and shown for the first time now: a use
                await mark_used(self.deps, company, seat, fresh)
                await store.record_shown(company, seat, turn_id, key, len(shown), now)
            tail = (
                f"(A repeat of a hint already used this turn, answered from the turn's ledger: no refresh "
                f"spent; {reservation.spent} of {cap} spent.)"
            )
            return RefreshAnswer(
                _refresh_text(hint, shown, len(notes), tail), [n.id for n in shown], reservation.spent, cap, True
            )
        spent = reservation.spent
        counted = f"(Refresh {spent} of {cap} this turn.)"
        try:
            resp = await self.deps.clients.diary.RecallNotes(
                diary_pb.RecallNotesRequest(company=company, seat=seat, query=hint), timeout=self._timeout
            )
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            await store.record_failure(company, seat, turn_id, key, hint, now)
            detail = err.code().name if isinstance(err, grpc.aio.AioRpcError) else "DEADLINE_EXCEEDED"
            return RefreshAnswer(
                f"Your diary could not be read ({detail}). {counted} You may retry the same hint; the retry "
                "reads the diary again and counts as another refresh.",
                [],
                spent,
                cap,
                False,
            )
        pool = [memory.MemoryNote.from_candidate(c) for c in resp.candidates]
        who = Who(company, seat, role, turn_id)
        # An in-turn call goes through the turn's meter: none is made while the window is full
        # (spec "What the auxiliary calls cost"). The pool is then ranked by the offline rule, at no
        # cost, rather than the tool refused.
        spent_out = bool(pool) and await self._budget_spent(company, seat)
        if spent_out:
            counted = f"{counted} {_BUDGET_SPENT_FILTER}"
        try:
            selected = await memory.select_notes(
                self.deps.aux,
                who.attribution(memory.FILTER_PURPOSE),
                hint,
                senders,
                pool,
                REFRESH_LIMIT.maximum,
                self.deps.settings.learning.prefetch.aux_timeout_seconds,
                model=not spent_out,
            )
        except memory.FilterFailed as err:
            await store.record_failure(company, seat, turn_id, key, hint, now)
            return RefreshAnswer(
                f"The memory filter could not run for this hint ({err.kind}). {counted} You may retry the "
                "same hint; the retry runs the filter again and counts as another refresh.",
                [],
                spent,
                cap,
                False,
            )
        shown = selected[:limit]
        answer = LedgerEntry([n.row() for n in selected], len(shown))
        await store.record_answer(company, seat, turn_id, key, hint, answer, now)
        await mark_used(self.deps, company, seat, [n.id for n in shown])
        return RefreshAnswer(
            _refresh_text(hint, shown, len(selected), counted), [n.id for n in shown], spent, cap, False
        )

    # ------------------------------------------------------------------ query_episodes

    async def query_episodes(
        self,
        company: str,
        seat: str,
        query: str,
        conversation_id: str,
        outcome_filter: str,
        limit: int,
        turn_id: str,
        role: str,
    ) -> EpisodesAnswer:
        """Similarity (raw turns) when a query is given, one conversation when a conversation is,
        recency otherwise. Never summarised; asks and accounts past 600 bytes condensed or named by
        size through the same renderer as the turn-start block."""
        seat_ref(company, seat, domain=DOMAIN)
        limit = _limit(limit, "limit", QUERY_EPISODES_LIMIT)
        outcome = None
        if outcome_filter.strip():
            outcome = _OUTCOME_FILTER.get(outcome_filter.strip().lower())
            if outcome is None:
                raise field_error(
                    "outcome_filter",
                    "FIELD_INVALID",
                    f"outcome_filter must be one of {', '.join(_OUTCOME_FILTER)}, got {outcome_filter!r}",
                    domain=DOMAIN,
                    value=outcome_filter[:100],
                )
        if len(query) > QUERY_MAX_CHARS:
            require_text(query, "query", domain=DOMAIN, max_chars=QUERY_MAX_CHARS)
        who = Who(company, seat, role, turn_id)
        if query.strip():
            return await self._episodes_by_similarity(who, query, outcome, limit)
        flt = ep_pb.EpisodeFilter(conversation_id=conversation_id.strip(), outcomes=[outcome] if outcome else [])
        try:
            resp = await self.deps.clients.episodes.ListEpisodes(
                ep_pb.ListEpisodesRequest(company=company, seat=seat, page_size=limit, filter=flt),
                timeout=self._timeout,
            )
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise passthrough("episodes", err) from err
            return EpisodesAnswer(
                f"query_episodes could not read your turns: the episode store could not be read ({err.code().name}).",
                [],
                0,
            )
        episodes = list(resp.episodes)
        where = f"in conversation {conversation_id.strip()}" if conversation_id.strip() else "most recent"
        if not episodes:
            text = (
                f"You have no recorded turns in conversation {conversation_id.strip()}."
                if conversation_id.strip()
                else "You have no recorded turns yet."
            )
            return EpisodesAnswer(text, [], 0)
        rendered = await self.past_turns.render(who, episodes, condense=not await self._budget_spent(company, seat))
        head = (
            f"Your turns {where}, newest first ({len(episodes)} of {resp.total_size}):"
            if conversation_id.strip()
            else f"Your {where} turns, newest first ({len(episodes)} of {resp.total_size}):"
        )
        return EpisodesAnswer(f"{head}\n{rendered.text}", list(rendered.ids), 0)

    async def _episodes_by_similarity(
        self, who: Who, query: str, outcome: ep_pb.TurnOutcome | None, limit: int
    ) -> EpisodesAnswer:
        embedder = self.deps.embedder
        if embedder is None:
            return _cannot_run("no_embeddings")
        try:
            async with asyncio.timeout(self.deps.settings.learning.episodes.embed_budget_seconds):
                vec = await embed_query(embedder, query)
        except EmbeddingConfigurationError:
            return _cannot_run("configuration")
        except EmbeddingRefused:
            return _cannot_run("refused")
        except TimeoutError:
            return _cannot_run("unavailable", "it did not answer in time")
        except EmbeddingError as err:
            return _cannot_run("unavailable", err.kind.replace("_", " "))
        if vec is None:  # a vector with no direction: no query of this text can rank anything
            return _cannot_run("refused")
        request = ep_pb.SearchEpisodesRequest(
            company=who.company, seat=who.seat, query=query, limit=limit, lexical_limit=limit
        )
        request.query_embedding.values.extend(vec.tolist())
        request.query_embedding.model = vec.model
        request.query_embedding.dimensions = vec.dimensions
        if outcome is not None:
            request.outcome_filter = outcome
        try:
            resp = await self.deps.clients.episodes.SearchEpisodes(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise passthrough("episodes", err) from err
            return _cannot_run("store", err.code().name)
        except TimeoutError:
            return _cannot_run("store", "DEADLINE_EXCEEDED")
        unreachable = int(resp.unreachable_by_vector_count)
        unreached = (
            f"{_plural(unreachable, 'turn')} of yours could not be searched by meaning yet (their vectors "
            f"are still being filled). {_OTHER_PATHS}"
        )
        episodes = [h.episode for h in resp.hits][:limit]
        if not episodes:
            if unreachable == 0:
                return EpisodesAnswer(
                    f'None of your past turns resembles "{one_line(query)}": this is new work.', [], 0
                )
            return EpisodesAnswer(
                f'None of the past turns the search could reach resembles "{one_line(query)}". {unreached}',
                [],
                unreachable,
            )
        rendered = await self.past_turns.render(
            who, episodes, condense=not await self._budget_spent(who.company, who.seat)
        )
        text = f'Your past turns most like "{one_line(query)}", most similar first:\n{rendered.text}'
        if unreachable:
            text += f"\n\n{unreached}"
        return EpisodesAnswer(text, list(rendered.ids), unreachable)

    # ------------------------------------------------------------------ reflect_and_persist

    async def reflect_and_persist(
        self, company: str, seat: str, turn_id: str, content: str, tier: str, ttl_days: int
    ) -> tuple[str, str]:
        seat_ref(company, seat, domain=DOMAIN)
        tiers = {"": diary_pb.NOTE_TIER_LONG, "long": diary_pb.NOTE_TIER_LONG, "short": diary_pb.NOTE_TIER_SHORT}
        pb_tier = tiers.get(tier.strip().lower())
        if pb_tier is None:
            raise field_error(
                "tier",
                "FIELD_INVALID",
                f"tier must be 'long' or 'short', got {tier!r}",
                domain=DOMAIN,
                value=tier[:100],
            )
        resp = await self._call(
            "diary",
            self.deps.clients.diary.WriteNote,
            diary_pb.WriteNoteRequest(
                company=company,
                seat=seat,
                content=content,
                tier=pb_tier,
                ttl_days=ttl_days,
                source=diary_pb.NOTE_SOURCE_REFLECT_AND_PERSIST,
                turn_id=turn_id,
                request_id=tool_request_id(),
            ),
        )
        if resp.note_removed:
            # A retry of a call whose note was deleted since: the diary writes nothing
            # again (the key outlives the note), and the model is told so rather than "saved".
            return "", (
                "Not saved: this call already saved its note once, and that note was deleted "
                "since, so it is not written again."
            )
        note = resp.note
        if note.tier == diary_pb.NOTE_TIER_SHORT:
            until = note.expire_time.ToDatetime().date().isoformat()
            kind = f"a situational note, read until {until}"
        else:
            kind = "a durable fact"
        return note.id, f"Saved to your diary as {kind}. It is offered to you in later turns when it bears on the task."

    # ------------------------------------------------------------------ skills

    async def use_skill(self, company: str, seat: str, name: str, turn_id: str) -> tuple[str, str]:
        seat_ref(company, seat, domain=DOMAIN)
        require_text(name, "name", domain=DOMAIN, max_chars=200)
        resp = await self._call(
            "skills",
            self.deps.clients.skills.UseSkill,
            # The CallTool's key: a retried call is the same use, counted once (skills' UseSkill).
            skill_pb.UseSkillRequest(
                company=company, seat=seat, skill_name=name.strip(), turn_id=turn_id, request_id=tool_request_id()
            ),
        )
        return resp.skill.body, resp.skill.id

    async def refine_skill(
        self, company: str, seat: str, name: str, content: str, reason: str, turn_id: str
    ) -> tuple[int, str]:
        seat_ref(company, seat, domain=DOMAIN)
        require_text(name, "skill_name", domain=DOMAIN, max_chars=200)
        resp = await self._call(
            "skills",
            self.deps.clients.skills.RefineSkill,
            skill_pb.RefineSkillRequest(
                company=company,
                seat=seat,
                skill_name=name.strip(),
                body=content,
                reason=reason,
                turn_id=turn_id,
                request_id=tool_request_id(),
            ),
        )
        version = resp.skill.version
        return version, (
            f"Skill {resp.skill.name} now reads as you wrote it (version {version}); the previous body is "
            "kept in its history."
        )

    # ------------------------------------------------------------------ distill_skill

    async def distill_skill(
        self,
        company: str,
        seat: str,
        role: str,
        *,
        name: str,
        summary: str,
        body: str,
        tool_sequence: list[str],
        turn_id: str,
        session_id: str,
    ) -> tuple[str, str, str]:
        """Propose a skill through SkillService.ProposeSkill (the same checks as a session learning
        check's candidate); never a live skill. Returns (proposal id, disposition, tool result text).

        The role's ``distill_skill`` permission is rechecked: ``deny`` refuses; ``ask`` is the engine's
        to put to a person before it calls, so a call that arrives was approved."""
        seat_ref(company, seat, domain=DOMAIN)
        require_text(role, "role", domain=DOMAIN, max_chars=200)
        if self.deps.settings.tool_permission(company, role, "distill_skill") == "deny":
            raise PermissionDenied(
                f"role {role} may not propose skills (its distill_skill permission is deny)",
                reason="TOOL_DENIED",
                domain=DOMAIN,
                metadata={"tool": "distill_skill", "role": role},
            )
        resp = await self._call(
            "skills",
            self.deps.clients.skills.ProposeSkill,
            skill_pb.ProposeSkillRequest(
                company=company,
                seat=seat,
                name=name,
                summary=summary,
                body=body,
                tool_sequence=tool_sequence,
                origin=skill_pb.PROPOSAL_ORIGIN_DISTILL_SKILL,
                source=skill_pb.ProposalSource(session_id=session_id, turn_id=turn_id),
                request_id=distill_key(turn_id, name),
            ),
        )
        disposition = skill_pb.ProposalDisposition.Name(resp.disposition).removeprefix("PROPOSAL_DISPOSITION_").lower()
        match = resp.match.name
        text = {
            "created": f"Proposed skill {name.strip()}: a person reviews it before it is offered to you.",
            "already_proposed": f"Skill {name.strip()} was already proposed from this turn; it awaits review.",
            "duplicate_proposal": f"A pending proposal ({match}) already covers this; nothing new was filed.",
            "duplicate_skill": f"You already have this skill ({match}): load it with use_skill instead.",
            "suppressed": f"A person rejected a proposal like this one ({match}); it is not proposed again.",
        }.get(disposition, f"Proposal answered {disposition}.")
        return (resp.proposal.id if resp.HasField("proposal") else ""), disposition, text

    # ------------------------------------------------------------------ search_knowledge

    async def search_knowledge(
        self, company: str, seat: str, role: str, query: str, limit: int, turn_id: str
    ) -> KnowledgeAnswer:
        seat_ref(company, seat, domain=DOMAIN)
        require_text(role, "role", domain=DOMAIN, max_chars=200)
        require_text(query, "query", domain=DOMAIN, max_chars=QUERY_MAX_CHARS)
        # Omitted: the configured knowledge_results, the default the tool's schema shows.
        configured = SEARCH_KNOWLEDGE_LIMIT.configured(self.deps.settings.learning.prefetch.knowledge_results)
        limit = _limit(limit, "limit", configured)
        # The same seam, scope, auto-draft exclusion and credential as the turn-start block; the
        # knowledge service records the knowledge_read.
        outcome = await search(
            self.deps,
            Reader(company, seat, role),
            query,
            limit,
            ReadContext(ReadSource.SEARCH_KNOWLEDGE, turn_id),
        )
        return KnowledgeAnswer(render_search_result(outcome, query), outcome)

    # ------------------------------------------------------------------ mark_onboarded

    async def mark_onboarded(self, company: str, seat: str, unit_chain: list[str]) -> tuple[str, str]:
        seat_ref(company, seat, domain=DOMAIN)
        for i, unit in enumerate(unit_chain):
            if not unit.strip():
                raise field_error(f"unit_chain[{i}]", "FIELD_REQUIRED", f"unit_chain[{i}] is empty", domain=DOMAIN)
        digest = chain_hash(unit_chain)
        await self.deps.store.mark_onboarded(company, seat, digest, list(unit_chain), self.deps.clock.now())
        chain = " › ".join(unit_chain) or "no unit"
        return digest, (
            f"Onboarding recorded for your current team structure ({chain}). The First-turn onboarding "
            "section will not appear again unless your unit chain changes."
        )


# ------------------------------------------------------------------------------------ keys


def distill_key(turn_id: str, name: str) -> str:
    """ProposeSkill's idempotency key for a distill_skill call: one proposal per skill name per run,
    so a retried call (or the model asking again in the turn) is answered "already proposed".

    The name enters as a digest, so the key is at most 249 characters (a run id is at most 200)
    whatever the name, within ProposeSkill's 400, and never cut: it was "distill:<run>:<name>" cut
    to 200, so with a long run id two skills distilled in one turn shared a key and the second was
    answered the first's proposal and never filed."""
    if not turn_id:
        return ""
    return f"distill:{turn_id}:{hashlib.sha256(name.strip().encode()).hexdigest()[:40]}"


# ------------------------------------------------------------------------------------ texts


_BUDGET_SPENT_FILTER = (
    "(The token budget is spent for this window, so no model filtered these notes: they are the "
    "diary's best matches for the hint, ranked by its own search.)"
)


def _refresh_text(hint: str, shown: list[memory.MemoryNote], selected: int, tail: str) -> str:
    about = one_line(hint)
    if len(about) > 200:
        about = about[:200].rsplit(" ", 1)[0] + " …"
    if not shown:
        return f'Nothing in your diary bears on "{about}". {tail}'
    more = f" ({selected - len(shown)} more selected: ask again with a larger limit)" if selected > len(shown) else ""
    return f'Notes from your diary that bear on "{about}"{more}:\n{memory.render_notes(shown)}\n{tail}'


def _cannot_run(cause: str, detail: str = "") -> EpisodesAnswer:
    return EpisodesAnswer(f"{_CANNOT_RUN[cause].format(detail=detail)} {_OTHER_PATHS}", [], 0)
