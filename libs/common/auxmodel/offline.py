"""The offline provider: deterministic answers from rules, one rule per purpose.

Each worker registers the rule for its purpose next to its prompt (the rule reads the prompt's
structured ``data``, never the rendered text), so the whole loop runs with no model and the same
turn always teaches the same lesson. Token counts are estimated (four characters a token) so
budgets and spend figures still move.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from libs.common.auxmodel._seam import Completion, Prompt, ProviderError

__all__ = ["OfflineProvider", "OfflineRules"]

Rule = Callable[[Mapping[str, Any]], str]


class OfflineRules:
    """The registry of purpose → rule a process knows."""

    def __init__(self) -> None:
        self._rules: dict[str, Rule] = {}

    def register(self, purpose: str, rule: Rule) -> None:
        self._rules[purpose] = rule

    def get(self, purpose: str) -> Rule | None:
        return self._rules.get(purpose)

    def purposes(self) -> list[str]:
        return sorted(self._rules)


def _tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


class OfflineProvider:
    timeout_seconds = 5.0

    def __init__(self, rules: OfflineRules, *, name: str = "offline", model: str = "offline-rules"):
        self.name = name
        self.model = model
        self._rules = rules

    async def complete(self, prompt: Prompt) -> Completion:
        rule = self._rules.get(prompt.purpose)
        if rule is None:
            raise ProviderError("no_rule", f"the offline provider has no rule for {prompt.purpose!r}")
        text = rule(prompt.data)
        return Completion(
            text=text,
            provider=self.name,
            model=self.model,
            prompt_tokens=_tokens(prompt.system) + _tokens(prompt.user),
            completion_tokens=_tokens(text),
        )
