"""Completions from any OpenAI-compatible endpoint through the ``openai`` package."""

from __future__ import annotations

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
            raise ProviderError(_kind(exc), str(exc)) from exc
        if not resp.choices:
            raise ProviderError("server_error", "the endpoint answered no choices")
        text = resp.choices[0].message.content or ""
        usage = resp.usage
        return Completion(
            text=text,
            provider=self.name,
            model=resp.model or self.model,
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        )

    async def close(self) -> None:
        await self._client.close()
