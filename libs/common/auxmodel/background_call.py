"""A background pass's one model call for a draft, and its answer read as the JSON object it asked for.

The passes that draft from clusters of turns (the knowledge promotion; the skills' clustered
synthesis can import the same) make the call the same way: a failure is an outcome word a pass
report counts, never an exception out of the pass, and an answer that is not exactly a JSON object
(a fenced block accepted) is dropped rather than guessed at. The lenient reader that looks for an
object inside prose is :func:`libs.common.auxmodel.answers.parse_object`; a draft is written only
from an answer that is the object alone.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from libs.common.auxmodel import _seam

__all__ = ["background_completion", "json_object"]

_log = logging.getLogger(__name__)

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


async def background_completion(
    aux: _seam.AuxiliaryModel, attribution: _seam.Attribution, prompt: _seam.Prompt
) -> tuple[_seam.Completion | None, str]:
    """``(completion, "")``, or ``(None, why)``: "no_auxiliary_model" (the role's chain names no
    provider: nothing asked, nothing charged), "unavailable:<kind>" (every provider failed; the
    last one's kind), "attribution_missing" (a bug on the caller's side, not the model's: logged
    loudly, with the purpose)."""
    try:
        return await aux.complete(attribution, prompt), ""
    except _seam.NoAuxiliaryModel:
        return None, "no_auxiliary_model"
    except _seam.AuxiliaryUnavailable as err:
        return None, f"unavailable:{err.kind}"
    except _seam.AttributionMissing:
        _log.exception("%s call without attribution", attribution.purpose)
        return None, "attribution_missing"


def json_object(text: str) -> dict[str, Any] | None:
    """The answer as a JSON object (a fenced block accepted), or None when it is anything else."""
    try:
        obj = json.loads(_FENCE.sub("", text.strip()))
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None
