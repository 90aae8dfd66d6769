"""Completions from any OpenAI-compatible endpoint through the ``openai`` package."""

from __future__ import annotations

from typing import Any

import openai
from openai.types.shared_params import ResponseFormatJSONObject

from libs.common.auxmodel._seam import Completion, Prompt, ProviderError
from libs.common.config import ProviderConfig

__all__ = ["OpenAICompatibleProvider"]


def _kind(exc: Exception) -> str:
    if isinstance(exc, openai.RateLimitError):
        return "rate_limited"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError | openai.NotFoundError):
        return "configuration"
    if isinstance(exc, openai.BadRequestError | openai.UnprocessableEntityError):
        return "refused"
    if isinstance(exc, openai.InternalServerError):
        return "server_error"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    if isinstance(exc, openai.APIStatusError):
        return "server_error" if exc.status_code >= 500 else "refused"
    return "server_error"


def _said(exc: Exception) -> str:
    """What a failed request says in a log line: the error's type and HTTP status, never its text.
    An endpoint's error message may echo the prompt or the answer (a person's words), and the seam
    logs the failure where no erasure reaches it."""
    status = getattr(exc, "status_code", None)
    return f"{type(exc).__name__} (HTTP {status})" if isinstance(status, int) else type(exc).__name__


class OpenAICompatibleProvider:
    def __init__(self, config: ProviderConfig, *, name: str):
        self.name = name
        self.model = config.model
        self.timeout_seconds = config.timeout_seconds
        self._client = openai.AsyncOpenAI(
            base_url=config.base_url,
            api_key=config.api_key.get_secret_value() if config.api_key else "unset",
            max_retries=0,
            timeout=config.timeout_seconds,
        )

    async def complete(self, prompt: Prompt) -> Completion:
        # omit leaves the field out of the request, as an absent keyword did.
        response_format: ResponseFormatJSONObject | openai.Omit = (
            {"type": "json_object"} if prompt.json_output else openai.omit
        )
        try:
            resp = await self._client.chat.completions.create(
                model=self.model,
                messages=[
                    {"role": "system", "content": prompt.system},
                    {"role": "user", "content": prompt.user},
                ],
                max_tokens=prompt.max_tokens,
                temperature=0,
                response_format=response_format,
            )
        except Exception as exc:
            raise ProviderError(_kind(exc), _said(exc)) from exc
        return self._completion(resp)

    def _completion(self, resp: Any) -> Completion:
        """The answer as a :class:`Completion`, or the server's bad answer as ``server_error``: a
        proxy's 200 HTML page (the client hands it back as a string), no choices, a choice without
        a message or whose content is not text. Never another exception: the seam falls back along
        the chain on a provider's failure, and a bug-shaped one would end the call instead."""
        try:
            choices = resp.choices
            if not choices:
                raise ProviderError("server_error", "the endpoint answered no choices")
            text = choices[0].message.content or ""
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}, not text")
            usage = resp.usage
            model = resp.model or self.model
            return Completion(
                text=text,
                provider=self.name,
                model=model if isinstance(model, str) else self.model,
                prompt_tokens=int(usage.prompt_tokens or 0) if usage else 0,
                completion_tokens=int(usage.completion_tokens or 0) if usage else 0,
            )
        except ProviderError:
            raise
        except Exception as exc:
            raise ProviderError(
                "server_error",
                f"the endpoint answered something that is not a chat completion ({type(exc).__name__}: {exc})",
            ) from exc

    async def close(self) -> None:
        await self._client.close()
