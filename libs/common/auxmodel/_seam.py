from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from libs.common.budgets import BudgetLedger, BudgetRoom
from libs.common.clock import Clock
from libs.common.config import Settings
from libs.common.events import EventSink
from libs.common.metrics import AUX_TOKENS

_log = logging.getLogger(__name__)


class Stage(StrEnum):
    TURN = "turn"
    REFLECTION = "reflection"
    BACKGROUND = "background"
    OPERATOR = "operator"


@dataclass(frozen=True)
class Attribution:
    """Whose cost a call is: the seat, its stage, its purpose and the turn it serves."""

    company: str
    seat: str
    stage: Stage | None
    purpose: str
    turn_id: str | None = None
    role: str | None = None


@dataclass(frozen=True)
class Prompt:
    """What a worker asks. ``system``/``user`` go to a model; ``data`` is the same question as
    structured inputs, which the offline rules answer from. ``purpose`` selects the rule."""

    purpose: str
    system: str
    user: str
    data: Mapping[str, Any] = field(default_factory=dict)
    max_tokens: int = 512
    json_output: bool = False


@dataclass(frozen=True)
class Completion:
    text: str
    provider: str
    model: str
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class ProviderError(Exception):
    """One provider did not answer. ``kind``: rate_limited, server_error (a malformed answer too),
    timeout, connection, refused, configuration, no_rule. A provider that raises anything else
    is recorded in the chain's failures as ``error`` (a bug: final for a reflector worker)."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class AttributionMissing(ValueError):
    """A call that does not say whose cost it is; refused before any model is resolved."""


class NoAuxiliaryModel(Exception):
    """The role's chain names no provider: no auxiliary model is configured for it."""


class AuxiliaryUnavailable(Exception):
    """Every provider of the chain failed; ``failures`` lists (provider, kind) in order."""

    def __init__(self, failures: list[tuple[str, str]]):
        super().__init__("no auxiliary provider answered: " + ", ".join(f"{p}={k}" for p, k in failures))
        self.failures = failures

    @property
    def kind(self) -> str:
        """The last provider's failure kind (what the caller records)."""
        return self.failures[-1][1] if self.failures else "unavailable"


class Provider(Protocol):
    name: str
    model: str
    timeout_seconds: float

    async def complete(self, prompt: Prompt) -> Completion: ...


class AuxiliaryModel:
    def __init__(
        self,
        settings: Settings,
        providers: Mapping[str, Provider],
        budget: BudgetLedger | None,
        events: EventSink | None,
        clock: Clock,
    ):
        self._settings = settings
        self._providers = dict(providers)
        self._budget = budget
        self._events = events
        self._clock = clock

    def chain(self, company: str, role: str | None = None) -> list[str]:
        """The provider names a call for this role would try, in order."""
        if not self._settings.providers.llm:
            return []
        role_cfg = self._settings.company(company).roles.get(role or "") if role else None
        names = role_cfg.llm_auxiliary if role_cfg and role_cfg.llm_auxiliary is not None else None
        if names is None:
            names = self._settings.providers.auxiliary_chain
        return [n for n in names if n in self._providers]

    async def room(self, company: str, seat: str) -> BudgetRoom | None:
        """What the seat's and the company's token budgets have left in the current window, read
        before work that would spend it starts (the turn-start budget park). None when the company
        sets no ceiling, or the counter cannot be read: unknown is not "no"."""
        config = self._settings.company(company).token_budget
        if self._budget is None or (config.seat_ceiling_tokens is None and config.company_ceiling_tokens is None):
            return None
        try:
            return await self._budget.room(company, seat, self._clock.now(), config)
        except Exception as exc:
            _log.warning("budget counter unreadable for %s/%s (%s); going ahead", company, seat, exc)
            return None

    def configured(self, company: str, role: str | None = None) -> bool:
        return bool(self.chain(company, role))

    def configured_anywhere(self) -> bool:
        """True when any chain (default or a role's) names a provider."""
        if self.chain("", None):
            return True
        companies = [self._settings.company_defaults, *self._settings.companies.values()]
        return any(r.llm_auxiliary for c in companies for r in c.roles.values())

    async def complete(self, attribution: Attribution, prompt: Prompt, *, timeout: float | None = None) -> Completion:
        """Ask the role's chain. ``timeout`` is one deadline for the whole chain (a block's bound
        holds however many providers fall back); each provider also keeps its own timeout."""
        if not attribution.stage or not attribution.purpose:
            raise AttributionMissing("an auxiliary call must state its stage and purpose")
        names = self.chain(attribution.company, attribution.role)
        if not names:
            raise NoAuxiliaryModel(f"no auxiliary model for role {attribution.role!r}")
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        failures: list[tuple[str, str]] = []
        for name in names:
            provider = self._providers[name]
            limit = provider.timeout_seconds
            if deadline is not None:
                limit = min(limit, deadline - loop.time())
                if limit <= 0:
                    failures.append((name, "timeout"))
                    break
            try:
                completion = await asyncio.wait_for(provider.complete(prompt), limit)
            except TimeoutError:
                failures.append((name, "timeout"))
                continue
            except ProviderError as err:
                failures.append((name, err.kind))
                _log.info("provider %s failed for %s: %s", name, attribution.purpose, err)
                continue
            except Exception:
                # A provider's bug is that provider's failure: the chain goes on to the next one
                # (DESIGN: the seam falls back along the chain), and the traceback is kept.
                failures.append((name, "error"))
                _log.exception("provider %s raised for %s", name, attribution.purpose)
                continue
            await self._account(attribution, completion)
            return completion
        raise AuxiliaryUnavailable(failures)

    async def _account(self, attribution: Attribution, completion: Completion) -> None:
        # Charged after the answer, in the window current when it returns (it may pass the ceiling).
        now = self._clock.now()
        if self._budget is not None:
            try:
                await self._budget.charge(
                    attribution.company,
                    attribution.seat,
                    completion.total_tokens,
                    now,
                    self._settings.company(attribution.company).token_budget,
                )
            except Exception as exc:
                _log.warning("auxiliary spend not charged: %s", exc)
        AUX_TOKENS.add(
            completion.prompt_tokens + completion.completion_tokens,
            {
                "agentlearn.purpose": attribution.purpose,
                "agentlearn.stage": str(attribution.stage),
                "agentlearn.model": completion.model,
            },
        )
        if self._events is not None:
            await self._events.emit(
                "auxiliary_spend",
                company=attribution.company,
                seat=attribution.seat,
                turn_id=attribution.turn_id,
                stage=str(attribution.stage),
                purpose=attribution.purpose,
                provider=completion.provider,
                model=completion.model,
                prompt_tokens=completion.prompt_tokens,
                completion_tokens=completion.completion_tokens,
            )
