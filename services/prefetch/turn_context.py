"""BuildTurnContext: the turn-start blocks, in order, and the prefetch_summary.

The ask is embedded ONCE (``learning.prefetch.embed_budget_seconds``) and the vector handed to the
diary's and the episodes' reads and to the knowledge search as ``query_embedding``: a turn start runs
the embedding model once (the knowledge service embeds its keyword query itself only when the turn
has no vector). The independent blocks run concurrently,
each read under its own deadline and each block under one budget (``_block_seconds``); a source
that cannot be read in time degrades its block and never fails the turn (the block's
``source_error`` and the summary say so).

The thin-trigger gate (``requires_recon``, or an ask with nothing in it) makes no auxiliary call,
no vector query and no embedding: personal memory reads its cheap recency list only to know
whether the seat has notes (the hint then), relevant knowledge asks ``can_search`` only, and
similar prior work renders its conditional hint unconditionally.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import grpc
from opentelemetry import trace

from agentlearn.common.v1 import embedding_pb2
from agentlearn.diary.v1 import diary_service_pb2 as diary_pb
from agentlearn.episodes.v1 import episode_service_pb2 as ep_pb
from agentlearn.profiles.v1 import profile_service_pb2 as prof_pb
from agentlearn.skills.v1 import skill_service_pb2 as skill_pb
from libs.common.attributes import agentlearn_attributes
from libs.common.budgets import window_start
from libs.common.contract import string_max_len, violations
from libs.common.embeddings import EmbeddingError, embed_query
from libs.common.erasure import platform_key
from libs.common.errors import InvalidArgument, InvalidFields, ResourceExhausted
from libs.common.events import Bookkeeping, bookkeeping
from libs.common.metrics import PREFETCH_BLOCKS
from libs.common.validation import require_ident, require_text
from services.prefetch import hints, knowledge_block, memory
from services.prefetch.deps import Deps, Who
from services.prefetch.domain import (
    DOMAIN,
    HEADINGS,
    MAX_SENDERS,
    MEMORY_BLOCK_NOTES,
    Block,
    BlockKind,
    Sender,
    Summary,
    TurnContext,
    TurnEmbedding,
    TurnStart,
    one_line,
)
from services.prefetch.downstream_errors import rpc_failure
from services.prefetch.past_turns import PastTurns
from services.prefetch.store import RunKey

__all__ = ["TurnContextBuilder", "distinct_senders"]

_log = logging.getLogger(__name__)
_tracer = trace.get_tracer("agentlearn.prefetch")

_READ_ERRORS = (grpc.aio.AioRpcError, TimeoutError)
_DETACHED: set[asyncio.Future[None]] = set()
_PRUNE_EVERY_SECONDS = 60.0


def _log_failed_followers(results: list[Any]) -> None:
    """A stamp that raised past its own handling (a bug: read errors are handled where they
    happen) is logged with its traceback, never lost silently."""
    for result in results:
        if isinstance(result, Exception):
            _log.error("a turn-start write beside the blocks raised", exc_info=result)


def _detach(write: Any) -> asyncio.Future[None]:
    """Run ``write`` to its end whatever happens to the caller (held until done)."""
    task: asyncio.Future[None] = asyncio.ensure_future(write)
    _DETACHED.add(task)
    task.add_done_callback(_DETACHED.discard)
    return task


Stamp = Callable[[], Awaitable[None]]
_shown_stamps: contextvars.ContextVar[list[Stamp] | None] = contextvars.ContextVar(
    "agentlearn_turn_shown_stamps", default=None
)
"""The stamps of what a turn-start build selected (note uses, skill offers), held while it builds:
they are written only once the context they are in is the one the run answers with."""


def _when_shown(stamp: Stamp) -> bool:
    """Inside a turn-start build, hold ``stamp`` for when its context is shown (True); else False:
    the caller writes it now."""
    held = _shown_stamps.get()
    if held is None:
        return False
    held.append(stamp)
    return True


async def _write_stamps(stamps: list[Stamp]) -> None:
    """The held stamps side by side, each to its end whatever happens to the caller."""
    if stamps:
        _log_failed_followers(await asyncio.gather(*(_detach(s()) for s in stamps), return_exceptions=True))


_EPSILON = timedelta(microseconds=1)
"""A claim is taken over only if it is still the one read (compare-and-set on its time)."""

Embedded = tuple[embedding_pb2.Embedding | None, TurnEmbedding]


SEARCH_QUERY_CHARS = min(
    string_max_len(diary_pb.RecallNotesRequest, "query"),
    string_max_len(ep_pb.SearchEpisodesRequest, "query"),
)
"""The longest query the diary's and the episodes' searches take (their contracts' bound)."""


def search_query(ask: str) -> str:
    """The ask as the memory and episode searches' text query: whole when it fits their contracts,
    else its beginning cut between words. The ask's vector is of the whole ask (embedded whole,
    pieces pooled: spec); only what their lexical halves match is bounded — a long task description
    leads with what it is about."""
    if len(ask) <= SEARCH_QUERY_CHARS:
        return ask
    head = ask[:SEARCH_QUERY_CHARS]
    cut = max(head.rfind(" "), head.rfind("\n"), head.rfind("\t"))
    return head[:cut].rstrip() if cut > 0 else head


def distinct_senders(senders: tuple[Sender, ...]) -> list[Sender]:
    """The counterparties whose profiles are looked up: one entry per (platform, handle-or-external-id),
    in order; a sender naming no platform or no identity is not a counterparty that can have a
    profile. The memory filter is told more (a handle alone too): :func:`memory.party_senders`."""
    seen: dict[tuple[str, str], Sender] = {}
    for s in senders:
        platform, ident = s.key
        if platform and ident:
            seen.setdefault((platform, ident), s)
    return list(seen.values())[:MAX_SENDERS]


class TurnContextBuilder:
    def __init__(self, deps: Deps, past_turns: PastTurns):
        self.deps = deps
        self.past_turns = past_turns
        self._next_prune: datetime | None = None

    @property
    def _timeout(self) -> float:
        return self.deps.clients.timeout

    # ------------------------------------------------------------------ the use case

    async def build(self, start: TurnStart) -> TurnContext:
        # Every bad field at once, as SubmitTurn's and CallTool's own checks answer (one bad field:
        # the answer it always was; docs/integrating.md "Errors").
        invalid = InvalidFields()
        with invalid.check():
            require_ident(start.company, "company", domain=DOMAIN)
        with invalid.check():
            require_ident(start.seat, "seat", domain=DOMAIN)
        with invalid.check():
            require_text(start.turn_id, "turn_id", domain=DOMAIN, max_chars=200)
        with invalid.check():
            require_text(start.role, "role", domain=DOMAIN, max_chars=200)
        for i, unit in enumerate(start.unit_chain):
            if not unit.strip():
                invalid.add(
                    InvalidArgument(
                        f"unit_chain[{i}] is empty", reason="FIELD_REQUIRED", domain=DOMAIN, field=f"unit_chain[{i}]"
                    )
                )
        invalid.raise_any()
        who = Who(start.company, start.seat, start.role, start.turn_id)
        with _tracer.start_as_current_span(
            "prefetch",
            attributes=agentlearn_attributes(
                company=start.company,
                seat=start.seat,
                turn_id=start.turn_id,
                trigger_requires_recon=start.requires_recon,
            ),
        ):
            return await self._frozen_or_built(start, who)

    # ------------------------------------------------------------------ frozen per run id

    def _block_seconds(self) -> float:
        """One block's whole budget: the ask's embed, one read and the auxiliary model's deadline
        (2 + 10 + 30 = 42 s by default). Each step has its own deadline, but a block runs several in
        a row (relevant knowledge: can_search, the query model, the search; personal memory: the
        recall, the filter, the use stamp), so without this a slow source made BuildTurnContext
        wait the sum (about 54 s) past what an engine is told to expect. A block that misses it
        degrades as a failed one does (``source_error``: DEADLINE_EXCEEDED); the others stand."""
        prefetch = self.deps.settings.learning.prefetch
        return prefetch.embed_budget_seconds + prefetch.aux_timeout_seconds + self._timeout

    def _claim_seconds(self) -> float:
        """How long a build may take before its claim counts as dead: its embed, every block's
        reads and its model calls (each bounded), with room to spare."""
        prefetch = self.deps.settings.learning.prefetch
        return prefetch.embed_budget_seconds + prefetch.aux_timeout_seconds + 2 * self._timeout

    async def _frozen_or_built(self, start: TurnStart, who: Who) -> TurnContext:
        """Frozen at turn start (spec): the first call for a run id builds the context and keeps
        it; every later call for the same run — a self_iterate round, a retry, another replica — is
        answered with it, so no model is asked again and no note use is counted twice. A call that
        arrives while the first is still building waits for it rather than build a second one."""
        key = RunKey(start.company, start.seat, start.turn_id)
        # The ask's one embed starts beside the claim rather than after it: the model runs in its
        # own thread while the claim's commit is on its way, so the memory and episode searches
        # (the critical path) get their vector a round trip sooner. It has no effect of its own
        # (nothing is charged, written or emitted): a run answered from its frozen context or
        # parked by the budget cancels it.
        embedding = None if start.gated else asyncio.create_task(self._embed(start.ask))
        try:
            return await self._claimed_or_frozen(start, who, key, embedding)
        finally:
            if embedding is not None and not embedding.done():
                embedding.cancel()

    async def _claimed_or_frozen(
        self, start: TurnStart, who: Who, key: RunKey, embedding: asyncio.Task[Embedded] | None
    ) -> TurnContext:
        store = self.deps.store
        # The first call of a run (nearly every call) claims at once: one statement, not a read
        # then a claim. A claimed build that the budget parks gives its claim back.
        claim = self.deps.clock.now()
        claimed, marker = await store.claim_context_reading_marker(key, claim)
        if claimed:
            try:
                await self._park_if_spent(start)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.shield(store.release_context(key, claim))
                raise
            return await self._build_and_freeze(start, who, key, claim, embedding, (marker,))
        frozen = await store.frozen_context(key)
        if frozen is not None and frozen.state == "built" and frozen.context is not None:
            return TurnContext.from_json(frozen.context)
        await self._park_if_spent(start)
        loop = asyncio.get_running_loop()
        limit = self._claim_seconds()
        give_up = loop.time() + limit
        while True:
            claim = self.deps.clock.now()
            if await store.claim_context(key, claim):
                break
            frozen = await store.frozen_context(key)
            if frozen is None:
                continue  # its builder gave up meanwhile: claim it again
            if frozen.state == "built" and frozen.context is not None:
                return TurnContext.from_json(frozen.context)
            now = self.deps.clock.now()
            stale = (now - frozen.claim_time).total_seconds() > limit or loop.time() > give_up
            taken = await store.take_over_context(key, frozen.claim_time + _EPSILON, now) if stale else None
            if taken is not None:
                # Dead, or only slow: should its builder finish after all, its save does not land
                # (the claim is this call's now) and it answers with the context frozen here.
                _log.warning("turn context of %s/%s/%s: a build died mid-way; building it here", *key)
                claim = taken
                break
            await asyncio.sleep(0.1)
        return await self._build_and_freeze(start, who, key, claim, embedding)

    async def _build_and_freeze(
        self,
        start: TurnStart,
        who: Who,
        key: RunKey,
        claim: datetime,
        embedding: asyncio.Task[Embedded] | None,
        marker: tuple[str | None] | None = None,
    ) -> TurnContext:
        """Build the run's context under this call's ``claim`` and freeze it (the claim is released
        if the build fails)."""
        store = self.deps.store
        # The turn's bookkeeping (the auxiliary calls' charges and auxiliary_spend events, the
        # prefetch_summary, the knowledge service's knowledge_read) is gathered while the blocks
        # build and written in the transaction that freezes the context. The note uses and the
        # skills' offered stamps are held too (``_when_shown``) and written on their services once
        # the context they are in is the one the run answers with (beside the save when its claim
        # is too young to have been taken over) — every one of them before the turn is answered.
        stamps: list[Stamp] = []
        held = _shown_stamps.set(stamps)
        try:
            with bookkeeping() as batch:
                try:
                    context = await self._build(start, who, embedding, marker)
                except BaseException:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(store.release_context(key, claim))
                    # An auxiliary call is charged and reported whether or not its turn was built;
                    # nothing it selected was shown, so nothing is stamped.
                    await asyncio.shield(self._settle_failed(batch))
                    raise
                now = self.deps.clock.now()
                frozen = await asyncio.shield(self._settle(key, claim, context, now, batch, stamps))
        finally:
            _shown_stamps.reset(held)
        self._prune_now_and_then(now)
        return frozen

    async def _settle(
        self,
        key: RunKey,
        claim: datetime,
        context: TurnContext,
        now: datetime,
        batch: Bookkeeping,
        stamps: list[Stamp],
    ) -> TurnContext:
        """Freeze the context with the batch in one statement and, if the run answers with this
        build's context, stamp what it shows (``stamps``: note uses, skill offers) — beside the
        save when no one can have taken its claim over, else after it lands; the context the run
        answers with. Shielded: a caller going away does not lose them.

        The spec's prefetch_summary is "once per turn" and the context "frozen at turn start": the
        summary is announced on the save, written only if this call's context is the one frozen.
        A save that does not land (the claim was taken over as stale while this build was slow)
        writes no summary and stamps nothing — the notes and skills it selected are never shown
        (the run answers with the taker's context, whose build stamps its own); the build's
        auxiliary charges and reads are still written (each call is charged whether or not its
        turn was built).

        The stamps are other services' RPCs, so they cannot join the save's statement. A save can
        only fail to land once its claim has been taken over, and a claim is taken over only once
        it is older than :meth:`_claim_seconds`: a build settling well inside that lifetime
        (:meth:`_stamps_beside_save`) stamps beside its save, saving the turn start a round trip;
        a slower one, which a taker may have overtaken, stamps only after its save lands."""
        summary: dict[str, Any] = context.summary.payload()
        company, seat, turn_id = key
        batch.announce("prefetch_summary", now, company=company, seat=seat, turn_id=turn_id, **summary)
        beside = self._stamps_beside_save(claim, now)
        saved = self.deps.store.save_context(key, context.to_json(), now, claim, batch)
        early = [_write_stamps(stamps)] if beside else []
        results = await asyncio.gather(saved, *early, *batch.followers, return_exceptions=True)
        _log_failed_followers(results[1:])
        unwritten = batch.withdraw()
        if isinstance(results[0], BaseException):
            raise results[0]
        if results[0]:
            if unwritten:  # a store that does not carry announcements (in memory)
                await self.deps.events.emit("prefetch_summary", company=company, seat=seat, turn_id=turn_id, **summary)
            if not beside:
                await _write_stamps(stamps)
            return context
        if beside:  # a claim taken over while fresh: replicas' clocks far apart
            _log.warning("turn context of %s/%s/%s: taken over while fresh; its stamps were written", *key)
        await self.deps.store.write_bookkeeping(batch)
        answer, mine = await self._frozen_by_another(key, claim, context)
        if mine and not beside:
            await _write_stamps(stamps)
        return answer

    def _stamps_beside_save(self, claim: datetime, now: datetime) -> bool:
        """Whether a build settling at ``now`` under ``claim`` may stamp beside its save: no other
        builder can take a claim over before it is :meth:`_claim_seconds` old, and half of that
        lifetime is left for the save itself to land (far more than one statement takes)."""
        return (now - claim).total_seconds() < self._claim_seconds() / 2

    async def _frozen_by_another(self, key: RunKey, claim: datetime, built: TurnContext) -> tuple[TurnContext, bool]:
        """The context frozen for the run by the builder that took this one's claim over, once it
        is frozen (within a claim's lifetime), and whether it is this build's after all: frozen
        under this build's ``claim`` (a save whose commit's answer was lost had landed). Should
        none be frozen by then (that builder failed in turn), this build's context answers,
        unfrozen: the turn still starts."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self._claim_seconds()
        while True:
            frozen = await self.deps.store.frozen_context(key)
            if frozen is not None and frozen.state == "built" and frozen.context is not None:
                return TurnContext.from_json(frozen.context), frozen.claim_time == claim
            if frozen is None or loop.time() > give_up:
                _log.warning("turn context of %s/%s/%s: taken over, and not frozen by its taker", *key)
                return built, True
            await asyncio.sleep(0.1)

    async def _settle_failed(self, batch: Bookkeeping) -> None:
        _log_failed_followers(await asyncio.gather(*batch.followers, return_exceptions=True))
        await self.deps.store.write_bookkeeping(batch)

    def _prune_now_and_then(self, now: datetime) -> None:
        """Forget old frozen contexts, at most once a minute (by the service's clock) per process
        and beside the turns (retention is housekeeping: it never fails, nor slows, a turn)."""
        if self._next_prune is not None and now < self._next_prune:
            return
        self._next_prune = now + timedelta(seconds=_PRUNE_EVERY_SECONDS)
        hours = self.deps.settings.learning.prefetch.frozen_context_hours

        async def prune() -> None:
            try:
                await self.deps.store.prune_contexts(now - timedelta(hours=hours))
            except Exception as err:
                _log.warning("frozen turn contexts not pruned: %s", err)

        _detach(prune())

    async def _park_if_spent(self, start: TurnStart) -> None:
        """The budget park (spec "What the auxiliary calls cost": "a seat with no room has its
        delivery parked, so no prefetch runs"): a turn may not start while the seat or the company
        is at its token ceiling, so none of its blocks is built. Refused with RESOURCE_EXHAUSTED /
        BUDGET_EXHAUSTED naming the ceiling and when the window rolls over — the engine parks the
        delivery until then. A run whose context was frozen before the ceiling was reached keeps
        it (its rounds run no model call). An unreadable counter lets the turn start."""
        room = await self.deps.aux.room(start.company, start.seat)
        if room is None or not room.exhausted:
            return
        config = self.deps.settings.company(start.company).token_budget
        now = self.deps.clock.now()
        window_end = window_start(now, config.window_hours) + timedelta(hours=max(1, config.window_hours))
        which = room.which or "seat"
        spent, ceiling = (
            (room.seat_spent, room.seat_ceiling) if which == "seat" else (room.company_spent, room.company_ceiling)
        )
        raise ResourceExhausted(
            f"the {which}'s token budget is spent ({spent} of {ceiling} tokens this window): the turn's "
            f"delivery is parked until the window rolls over at {window_end.isoformat()}, and no prefetch runs",
            reason="BUDGET_EXHAUSTED",
            domain=DOMAIN,
            metadata={
                "ceiling": which,
                "spent": spent,
                "limit": ceiling or 0,
                "window_end": window_end.isoformat(),
            },
        )

    async def _build(
        self,
        start: TurnStart,
        who: Who,
        embedding: asyncio.Task[Embedded] | None,
        marker: tuple[str | None] | None = None,
    ) -> TurnContext:
        """The blocks side by side; ``embedding`` is the ask's one embed, already running (None
        on a thin trigger: the gate embeds nothing)."""
        async with asyncio.TaskGroup() as tg:
            prior = tg.create_task(
                self._guard(BlockKind.SIMILAR_PRIOR_WORK, lambda: self._similar_prior_work(start, who, embedding))
            )
            mem = tg.create_task(
                self._guard(BlockKind.PERSONAL_MEMORY, lambda: self._personal_memory(start, who, embedding))
            )
            skills = tg.create_task(self._guard(BlockKind.SKILLS, lambda: self._skills(start)))
            know = tg.create_task(
                self._guard(BlockKind.RELEVANT_KNOWLEDGE, lambda: self._knowledge(start, who, embedding))
            )
            parties = tg.create_task(self._guard_many(BlockKind.COUNTERPARTY, lambda: self._counterparties(start)))
            onboarding = tg.create_task(self._guard(BlockKind.ONBOARDING, lambda: self._onboarding(start, marker)))
        blocks = (
            prior.result(),
            mem.result(),
            skills.result(),
            know.result(),
            *parties.result(),
            onboarding.result(),
        )
        # Absent where no search asked for the vector (the gate embedded nothing). Done by now:
        # the memory and episode blocks awaited it.
        turn_embedding = None if embedding is None else (await embedding)[1]
        summary = Summary(
            blocks=blocks,
            knowledge_selection_count=know.result().selection_count,
            trigger_requires_recon=start.requires_recon,
            turn_embedding=turn_embedding,
            gated=start.gated,
        )
        # The prefetch_summary is announced on the save that freezes the context (``_settle``).
        for b in blocks:
            PREFETCH_BLOCKS.add(1, agentlearn_attributes(block=str(b.kind), hit=b.hit))
        return TurnContext(blocks, summary)

    async def _guard(self, kind: BlockKind, make: Callable[[], Awaitable[Block]]) -> Block:
        """A block that raised degrades to an empty block naming why; the turn goes on. Each block
        is a span of the turn's prefetch trace."""
        with _tracer.start_as_current_span(f"block {kind}") as span:
            try:
                async with asyncio.timeout(self._block_seconds()):
                    block = await make()
            except Exception as err:
                _log.warning("prefetch block %s degraded: %s", kind, err, exc_info=not isinstance(err, _READ_ERRORS))
                block = Block(kind, source_error=rpc_failure(str(kind), err))
            _label(span, [block])
            return block

    async def _guard_many(self, kind: BlockKind, make: Callable[[], Awaitable[list[Block]]]) -> list[Block]:
        with _tracer.start_as_current_span(f"block {kind}") as span:
            try:
                async with asyncio.timeout(self._block_seconds()):
                    blocks = await make()
            except Exception as err:
                _log.warning("prefetch blocks %s degraded: %s", kind, err, exc_info=not isinstance(err, _READ_ERRORS))
                blocks = [Block(kind, source_error=rpc_failure(str(kind), err))]
            _label(span, blocks)
            return blocks

    # ------------------------------------------------------------------ the shared vector

    async def _embed(self, ask: str) -> Embedded:
        embedder = self.deps.embedder
        if embedder is None:
            return None, TurnEmbedding.UNCONFIGURED
        try:
            async with asyncio.timeout(self.deps.settings.learning.prefetch.embed_budget_seconds):
                vec = await embed_query(embedder, ask)
        except (TimeoutError, EmbeddingError) as err:
            _log.info("turn embedding failed: %s", err)
            return None, TurnEmbedding.FAILED
        except Exception:  # an embedder bug must not fail the turn either
            _log.exception("turn embedding raised")
            return None, TurnEmbedding.FAILED
        if vec is None:
            return None, TurnEmbedding.FAILED
        return (
            embedding_pb2.Embedding(values=vec.tolist(), model=vec.model, dimensions=vec.dimensions),
            TurnEmbedding.EMBEDDED,
        )

    # ------------------------------------------------------------------ ## Similar prior work

    async def _similar_prior_work(self, start: TurnStart, who: Who, embedding: asyncio.Task[Embedded] | None) -> Block:
        block = Block(BlockKind.SIMILAR_PRIOR_WORK)
        heading = HEADINGS[BlockKind.SIMILAR_PRIOR_WORK]
        if embedding is None:  # gated: only the skipped vector query could say whether such turns exist
            block.markdown = f"{heading}\n{hints.EMPTY_RECALL_HINT}"
            return block
        vector, status = await asyncio.shield(embedding)  # shared: a block's budget must not cancel it
        if status is TurnEmbedding.FAILED:
            # The search did not run (sending the ask alone would make the episodes service embed it
            # again); the summary's turn_embedding says an empty block is not "nothing similar".
            return block
        learning = self.deps.settings.learning
        limit = learning.episodes.similar_prior_work_limit
        request = ep_pb.SearchEpisodesRequest(
            company=start.company, seat=start.seat, query=search_query(start.ask), limit=limit, lexical_limit=limit
        )
        if vector is not None:
            request.query_embedding.CopyFrom(vector)
        try:
            resp = await self.deps.clients.episodes.SearchEpisodes(request, timeout=self._timeout)
        except _READ_ERRORS as err:
            block.source_error = rpc_failure("episodes", err)
            return block
        found = [h.episode for h in resp.hits][:limit]
        if not found:
            return block
        rendered = await self.past_turns.render(
            who,
            found,
            summarize=learning.summarize_episodes,
            ask=start.ask,
            timeout=min(learning.prefetch.aux_timeout_seconds, learning.episodes.rewrite_timeout_seconds),
        )
        intro = (
            hints.PRIOR_WORK_BRIEFING_INTRO.format(count=len(found)) if rendered.briefing else hints.PRIOR_WORK_INTRO
        )
        block.markdown = f"{heading}\n{intro}\n{rendered.text}"
        block.selection_count = len(found)
        block.ids = list(rendered.ids)
        return block

    # ------------------------------------------------------------------ ## Personal memory

    async def _personal_memory(self, start: TurnStart, who: Who, embedding: asyncio.Task[Embedded] | None) -> Block:
        block = Block(BlockKind.PERSONAL_MEMORY)
        diary = self.deps.clients.diary
        if embedding is None:
            # Gated: the cheap recency read (no vector, no lexical, no filter) only to know whether
            # the seat has notes to refresh.
            request = diary_pb.RecallNotesRequest(
                company=start.company, seat=start.seat, vector_limit=0, recency_limit=1, lexical_limit=0
            )
            try:
                resp = await diary.RecallNotes(request, timeout=self._timeout)
            except _READ_ERRORS as err:
                block.source_error = rpc_failure("diary", err)
                return block
            block.markdown = memory.render_block([], has_notes=bool(resp.candidates))
            return block
        vector, _status = await asyncio.shield(embedding)
        request = diary_pb.RecallNotesRequest(company=start.company, seat=start.seat, query=search_query(start.ask))
        if vector is not None:
            request.query_embedding.CopyFrom(vector)
        else:
            request.vector_limit = 0  # failed or unconfigured: the diary must not embed the ask again
        try:
            resp = await diary.RecallNotes(request, timeout=self._timeout)
        except _READ_ERRORS as err:
            block.source_error = rpc_failure("diary", err)
            return block
        pool = [memory.MemoryNote.from_candidate(c) for c in resp.candidates]
        try:
            selected = await memory.select_notes(
                self.deps.aux,
                who.attribution(memory.FILTER_PURPOSE),
                start.ask,
                start.senders,
                pool,
                MEMORY_BLOCK_NOTES,
                self.deps.settings.learning.prefetch.aux_timeout_seconds,
            )
        except memory.FilterFailed as err:
            _log.info("memory filter failed for %s/%s: %s", start.company, start.seat, err)
            selected = []
        block.markdown = memory.render_block(selected, has_notes=bool(pool))
        if selected:
            block.selection_count = len(selected)
            block.ids = [n.id for n in selected]
            await mark_used(self.deps, start.company, start.seat, block.ids)
        return block

    # ------------------------------------------------------------------ ## Synthesized skills

    async def _skills(self, start: TurnStart) -> Block:
        block = Block(BlockKind.SKILLS)
        stub = self.deps.clients.skills
        skills: list[Any] = []
        token = ""
        for _ in range(10):  # a catalogue is capped (max_skills_per_agent); 10 pages of 200 is plenty
            resp = await stub.ListSkills(
                skill_pb.ListSkillsRequest(
                    company=start.company,
                    seat=start.seat,
                    page_size=200,
                    page_token=token,
                    view=skill_pb.SKILL_VIEW_BASIC,
                ),
                timeout=self._timeout,
            )
            skills.extend(resp.skills)
            token = resp.next_page_token
            if not token:
                break
        budget = self.deps.settings.learning.prefetch.skills_char_budget
        lines, offered, used = [], [], 0
        for skill in skills:
            if skill.state not in (skill_pb.SKILL_STATE_ACTIVE, skill_pb.SKILL_STATE_STALE):
                continue
            line = f"- **{skill.name}**: {one_line(skill.summary)}"
            if skill.state == skill_pb.SKILL_STATE_STALE:
                line += f" (unused for {skill.days_unused} days)"
            if used + len(line) + 1 > budget:
                continue  # its menu line does not fit: not offered, so its clock does not move
            used += len(line) + 1
            lines.append(line)
            offered.append(skill)
        if not offered:
            return block
        block.markdown = "\n".join([HEADINGS[BlockKind.SKILLS], hints.SKILLS_INTRO, *lines])
        block.selection_count = len(offered)
        block.ids = [s.id for s in offered]
        ids = list(block.ids)

        async def stamp() -> None:
            await self._stamp_offered(start, ids)

        if not _when_shown(stamp):  # held for when this context is shown, awaited before it answers
            await asyncio.shield(_detach(stamp()))
        return block

    async def _stamp_offered(self, start: TurnStart, ids: list[str]) -> None:
        """Being offered is being used (spec): the offered skills' clocks move; a stamp that
        cannot be written is announced, never swallowed."""
        stub = self.deps.clients.skills
        try:
            stamp = await stub.MarkSkillsOffered(
                skill_pb.MarkSkillsOfferedRequest(
                    company=start.company, seat=start.seat, skill_ids=ids, turn_id=start.turn_id
                ),
                timeout=self._timeout,
            )
            if stamp.telemetry_write_failed:
                _log.warning(
                    "skills offered to %s/%s not stamped: %s", start.company, start.seat, stamp.telemetry_failure
                )
        except _READ_ERRORS as err:
            # The skills service could not be reached: it could not announce the stopped clock
            # itself, so the prefetch does (an operator must see it before the curator archives).
            _log.warning("skills offered to %s/%s not stamped: %s", start.company, start.seat, err)
            await self.deps.events.emit(
                "skill_telemetry_write_failed",
                company=start.company,
                seat=start.seat,
                turn_id=start.turn_id,
                write="skill_offered",
                error=rpc_failure("skills", err),
                skill_ids=ids,
            )

    # ------------------------------------------------------------------ ## Relevant knowledge

    async def _knowledge(self, start: TurnStart, who: Who, embedding: asyncio.Task[Embedded] | None) -> Block:
        if embedding is None:  # gated: no search runs
            return await knowledge_block.relevant_knowledge(self.deps, start, who)

        async def turn_vector() -> embedding_pb2.Embedding | None:
            # The ask's one vector of the turn, or none (failed, unconfigured): the knowledge
            # service then embeds its query itself, as it does for search_knowledge.
            return (await asyncio.shield(embedding))[0]

        return await knowledge_block.relevant_knowledge(self.deps, start, who, turn_vector)

    # ------------------------------------------------------------------ counterparties

    async def _counterparties(self, start: TurnStart) -> list[Block]:
        senders = distinct_senders(start.senders)
        if not senders:
            return []
        # A sender the profiles' contract refuses (a blank identity, one past its bounds) can have no
        # profile (the profiler's write is refused alike) and would fail the whole batch, every
        # other sender's block with it: it is left out of the call, the others are looked up.
        asked = [prof_pb.Subject(handle=s.handle, external_id=s.external_id, platform=s.platform) for s in senders]
        subjects = [subject for subject in asked if not violations(subject)]
        if not subjects:
            return []
        try:
            resp = await self.deps.clients.profiles.GetProfiles(
                prof_pb.GetProfilesRequest(company=start.company, observer=start.seat, subjects=subjects),
                timeout=self._timeout,
            )
        except _READ_ERRORS as err:
            return [Block(BlockKind.COUNTERPARTY, source_error=rpc_failure("profiles", err))]
        by_key: dict[tuple[str, str], Any] = {}
        for p in resp.profiles:
            # Profiles file a platform folded (``platform_key``: "Straße" as "strasse"), a sender
            # keeps the engine's spelling: both sides are compared folded, identities stripped.
            platform = platform_key(p.subject.platform)
            for ident in (p.subject.handle.strip(), p.subject.external_id.strip()):
                if ident:
                    by_key.setdefault((platform, ident), p)
        blocks = []
        for s in senders:
            platform = platform_key(s.platform)
            profile = by_key.get((platform, s.handle.strip())) or by_key.get((platform, s.external_id.strip()))
            if profile is None:
                continue
            blocks.append(
                Block(
                    BlockKind.COUNTERPARTY,
                    markdown=render_profile(s, profile),
                    selection_count=1,
                    ids=[profile.id],
                    counterparty=s,
                )
            )
        return blocks

    # ------------------------------------------------------------------ ## First-turn onboarding

    async def _onboarding(self, start: TurnStart, marker: tuple[str | None] | None) -> Block:
        return await knowledge_block.onboarding_block(self.deps, start, marker)


# ------------------------------------------------------------------------------------ shared


def render_profile(sender: Sender, profile: Any) -> str:
    name = sender.name or profile.subject.handle or profile.subject.external_id
    platform = profile.subject.platform or sender.platform
    lines = [f"## Counterparty: {name} ({platform})", hints.COUNTERPARTY_INTRO.format(name=name, platform=platform)]
    if profile.communication_style:
        lines.append(f"- Communication style: {one_line(profile.communication_style)}")
    for label, items in (
        ("Past decisions", profile.past_decisions),
        ("Sensitivities", profile.sensitivities),
        ("Topics", profile.topics),
    ):
        if items:
            lines.append(f"- {label}: {'; '.join(one_line(i) for i in list(items)[:5])}")
    return "\n".join(lines)


def _label(span: trace.Span, blocks: list[Block]) -> None:
    if span.is_recording():
        span.set_attribute("agentlearn.block.hit", any(b.hit for b in blocks))
        span.set_attribute("agentlearn.block.bytes", sum(b.bytes for b in blocks))
        span.set_attribute("agentlearn.block.selection_count", sum(b.selection_count for b in blocks))


async def mark_used(deps: Deps, company: str, seat: str, note_ids: list[str]) -> None:
    """Record a use of each note the filter selected and the seat was shown. Shielded: a use the
    seat already benefited from is recorded even when the caller goes away; a failure is logged."""

    async def call() -> None:
        try:
            await deps.clients.diary.MarkNotesUsed(
                diary_pb.MarkNotesUsedRequest(company=company, seat=seat, note_ids=note_ids),
                timeout=deps.clients.timeout,
            )
        except _READ_ERRORS as err:
            _log.warning("uses of %d notes of %s/%s not recorded: %s", len(note_ids), company, seat, err)

    # A turn start's are held for when its context is shown (``_when_shown``); a builtin's are
    # written now, held until done, so a caller going away cannot lose the write.
    if note_ids and not _when_shown(call):
        await asyncio.shield(_detach(call()))
