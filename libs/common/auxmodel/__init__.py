"""The auxiliary-model seam: every completion made for a seat goes through :class:`AuxiliaryModel`.

It refuses a call whose attribution names no stage or purpose (before resolving any model),
resolves the role's provider chain and falls back along it, charges the seat's and the company's
token budget after the answer, and records an ``auxiliary_spend`` event. Providers: any
OpenAI-compatible endpoint, and a deterministic offline provider that answers every purpose from
rules, so the whole system runs with no model at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from libs.common.auxmodel._seam import (
    Attribution,
    AttributionMissing,
    AuxiliaryModel,
    AuxiliaryUnavailable,
    Completion,
    NoAuxiliaryModel,
    Prompt,
    Provider,
    ProviderError,
    Stage,
)
from libs.common.auxmodel.offline import OfflineProvider, OfflineRules

if TYPE_CHECKING:  # only for the annotation: the seam need not load the config models
    from libs.common.config import Settings

__all__ = [
    "Attribution",
    "AttributionMissing",
    "AuxiliaryModel",
    "AuxiliaryUnavailable",
    "Completion",
    "NoAuxiliaryModel",
    "OfflineProvider",
    "OfflineRules",
    "OpenAICompatibleProvider",
    "Prompt",
    "ProviderError",
    "Stage",
    "build_providers",
]


def __getattr__(name: str) -> Any:
    # The OpenAI SDK is a quarter of a process's import time (docs/perf/analysis.md §2.5): it is
    # imported when a provider of that kind is configured or the class is asked for, not before.
    if name == "OpenAICompatibleProvider":
        from libs.common.auxmodel.openai_provider import OpenAICompatibleProvider

        return OpenAICompatibleProvider
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_providers(settings: Settings, rules: OfflineRules) -> dict[str, Provider]:
    """One provider object per entry of ``providers.llm``."""
    out: dict[str, Provider] = {}
    for name, cfg in settings.providers.llm.items():
        if cfg.kind == "offline":
            out[name] = OfflineProvider(rules, name=name)
        else:
            from libs.common.auxmodel.openai_provider import OpenAICompatibleProvider

            out[name] = OpenAICompatibleProvider(cfg, name=name)
    return out
