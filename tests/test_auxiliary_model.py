"""The auxiliary seam: attribution or refusal, the provider chain with fallback, tokens charged to
the seat and the company, an auxiliary_spend event for every answered call."""

from __future__ import annotations

import contextlib

import pytest

from libs.common.auxmodel import (
    Attribution,
    AttributionMissing,
    AuxiliaryModel,
    AuxiliaryUnavailable,
    Completion,
    NoAuxiliaryModel,
    Prompt,
    Stage,
)
from libs.common.auxmodel.openai_provider import OpenAICompatibleProvider
from libs.common.budgets import window_start
from libs.common.events import read_events
from libs.common.infra import open_infra
from tests.support.scripted_openai import Reply, openai_provider


def chain_settings(make_settings, server, secondary_timeout=0.5, **extra):  # type: ignore[no-untyped-def]
    return make_settings(
        providers={
            "llm": {
                "primary": openai_provider(server, "big", timeout_seconds=0.5),
                "secondary": openai_provider(server, "small", timeout_seconds=secondary_timeout),
                "offline": {"kind": "offline"},
            },
            "auxiliary_chain": ["primary", "secondary", "offline"],
        },
        **extra,
    )


@contextlib.asynccontextmanager
async def infra_for(settings, dsn, clock):  # type: ignore[no-untyped-def]
    async with contextlib.AsyncExitStack() as stack:
        infra = await open_infra(settings, stack, [], clock=clock, embedder=None, dsn=dsn, index=_NoIndex())
        infra.rules.register("echo", lambda data: f"rule says {data['word']}")
        yield infra


class _NoIndex:
    name = "none"

    async def close(self) -> None:
        pass


ATTR = Attribution(company="acme", seat="ana", stage=Stage.REFLECTION, purpose="echo", turn_id="run-1")
PROMPT = Prompt(purpose="echo", system="Repeat the word.", user="word: hi", data={"word": "hi"})


@pytest.mark.parametrize(
    "attribution",
    [
        Attribution(company="acme", seat="ana", stage=None, purpose="echo"),
        Attribution(company="acme", seat="ana", stage=Stage.TURN, purpose=""),
    ],
)
async def test_a_call_that_does_not_say_whose_cost_it_is_is_refused_before_any_model(
    make_settings, dsn, clock, scripted_openai, attribution
):
    async with infra_for(chain_settings(make_settings, scripted_openai), dsn, clock) as infra:
        with pytest.raises(AttributionMissing):
            await infra.aux.complete(attribution, PROMPT)
        assert scripted_openai.received("chat") == []


async def test_the_first_provider_answers_and_the_call_is_charged_and_recorded(
    make_settings, dsn, clock, scripted_openai
):
    scripted_openai.chat_handler = lambda body: "hello from " + body["model"]
    async with infra_for(chain_settings(make_settings, scripted_openai), dsn, clock) as infra:
        done = await infra.aux.complete(ATTR, PROMPT)
        assert done.text == "hello from big" and done.provider == "primary"
        [event] = await read_events(infra.pool, "auxiliary_spend")
        assert event["seat"] == "ana" and event["turn_id"] == "run-1"
        assert event["payload"]["stage"] == "reflection" and event["payload"]["purpose"] == "echo"
        assert event["payload"]["provider"] == "primary"
        rows = await infra.pool.fetch("SELECT seat, tokens, window_start FROM token_spend ORDER BY seat")
        assert [(r["seat"], r["tokens"]) for r in rows] == [("", done.total_tokens), ("ana", done.total_tokens)]
        assert rows[0]["window_start"] == window_start(clock.now(), 24)


@pytest.mark.parametrize(
    "failure",
    [
        Reply(status=429),
        Reply(status=500),
        Reply(delay=1.5),
        Reply(status=401),
        # A 200 that is no chat completion: a proxy's HTML page (a string to the client), a choice
        # without a message. The server's bad answer, so the next provider is asked.
        Reply(raw=b"<html>proxy login page</html>", content_type="text/html"),
        Reply(body={"choices": [{"index": 0, "message": None}]}),
    ],
)
async def test_a_failing_provider_falls_back_along_the_chain(make_settings, dsn, clock, scripted_openai, failure):
    scripted_openai.chat_handler = lambda body: "from " + body["model"]
    scripted_openai.push("chat", failure)
    # The second provider answers at once, but on a loaded machine not always within 0.5 s: its own
    # timeout is generous here, so the test is about the first one failing, not about a race.
    async with infra_for(chain_settings(make_settings, scripted_openai, secondary_timeout=30.0), dsn, clock) as infra:
        done = await infra.aux.complete(ATTR, PROMPT)
        assert done.text == "from small" and done.provider == "secondary"
        [event] = await read_events(infra.pool, "auxiliary_spend")
        assert event["payload"]["provider"] == "secondary"  # only the answered call is charged


class _Buggy:
    """A provider with a bug: it raises outside ``ProviderError``."""

    name, model, timeout_seconds = "buggy", "none", 5.0

    async def complete(self, prompt: Prompt) -> Completion:
        raise KeyError("a bug in a provider")


async def test_a_provider_that_raises_anything_else_is_its_failure_and_the_chain_goes_on(
    make_settings, dsn, clock, scripted_openai, caplog
):
    scripted_openai.chat_handler = lambda body: "from " + body["model"]
    settings = chain_settings(make_settings, scripted_openai, secondary_timeout=30.0)
    secondary = OpenAICompatibleProvider(settings.providers.llm["secondary"], name="secondary")
    aux = AuxiliaryModel(settings, {"primary": _Buggy(), "secondary": secondary}, None, None, clock)
    done = await aux.complete(ATTR, PROMPT)
    assert done.text == "from small" and done.provider == "secondary"
    assert any(r.exc_info and isinstance(r.exc_info[1], KeyError) for r in caplog.records)  # with its traceback
    scripted_openai.push("chat", Reply(status=503))
    with pytest.raises(AuxiliaryUnavailable) as exc:
        await aux.complete(ATTR, PROMPT)
    assert exc.value.failures == [("primary", "error"), ("secondary", "server_error")]
    await secondary.close()


async def test_the_offline_rules_answer_when_every_model_fails(make_settings, dsn, clock, scripted_openai):
    scripted_openai.rule("chat", lambda body: Reply(status=503))
    async with infra_for(chain_settings(make_settings, scripted_openai), dsn, clock) as infra:
        done = await infra.aux.complete(ATTR, PROMPT)
        assert done.text == "rule says hi" and done.provider == "offline" and done.total_tokens > 0


async def test_every_provider_failing_names_each_failure(make_settings, dsn, clock, scripted_openai):
    scripted_openai.push("chat", Reply(status=429), Reply(status=500))
    settings = chain_settings(make_settings, scripted_openai)
    async with infra_for(settings, dsn, clock) as infra:
        attr = Attribution(company="acme", seat="ana", stage=Stage.BACKGROUND, purpose="unknown-purpose")
        with pytest.raises(AuxiliaryUnavailable) as exc:
            await infra.aux.complete(attr, Prompt(purpose="unknown-purpose", system="s", user="u"))
        assert exc.value.failures == [
            ("primary", "rate_limited"),
            ("secondary", "server_error"),
            ("offline", "no_rule"),
        ]
        assert await read_events(infra.pool, "auxiliary_spend") == []


async def test_a_roles_own_chain_is_used_and_an_empty_one_means_no_model(make_settings, dsn, clock, scripted_openai):
    settings = chain_settings(
        make_settings,
        scripted_openai,
        company_defaults={"roles": {"quiet": {"llm_auxiliary": []}, "cheap": {"llm_auxiliary": ["offline"]}}},
    )
    async with infra_for(settings, dsn, clock) as infra:
        cheap = Attribution("acme", "ana", Stage.TURN, "echo", role="cheap")
        assert (await infra.aux.complete(cheap, PROMPT)).provider == "offline"
        with pytest.raises(NoAuxiliaryModel):
            await infra.aux.complete(Attribution("acme", "ana", Stage.TURN, "echo", role="quiet"), PROMPT)
        assert scripted_openai.received("chat") == []


async def test_budget_room_reads_both_ceilings(make_settings, dsn, clock):
    settings = make_settings(
        company_defaults={"token_budget": {"seat_ceiling_tokens": 10, "company_ceiling_tokens": 15}}
    )
    async with infra_for(settings, dsn, clock) as infra:
        budget = settings.company("acme").token_budget
        await infra.budget.charge("acme", "ana", 8, clock.now(), budget)
        room = await infra.budget.room("acme", "ana", clock.now(), budget)
        assert not room.exhausted and (room.seat_spent, room.company_spent) == (8, 8)
        await infra.budget.charge("acme", "bob", 8, clock.now(), budget)
        room = await infra.budget.room("acme", "ana", clock.now(), budget)
        assert room.exhausted and room.which == "company"
        clock.advance(hours=24)
        assert not (await infra.budget.room("acme", "ana", clock.now(), budget)).exhausted  # a new window


async def test_a_timeout_is_one_deadline_for_the_whole_chain(make_settings, dsn, clock, scripted_openai):
    """Both models are slow (each provider's own timeout is 0.5 s); the call's deadline is 0.6 s.
    The first provider spends 0.5 s, the second gets what is left, and the offline rules at the end
    of the chain are never asked: had each provider had its own 0.6 s, they would have answered."""
    scripted_openai.rule("chat", lambda body: Reply(delay=2.0))
    async with infra_for(chain_settings(make_settings, scripted_openai), dsn, clock) as infra:
        with pytest.raises(AuxiliaryUnavailable) as exc:
            await infra.aux.complete(ATTR, PROMPT, timeout=0.6)
        assert exc.value.failures == [("primary", "timeout"), ("secondary", "timeout"), ("offline", "timeout")]
        done = await infra.aux.complete(ATTR, PROMPT, timeout=5.0)  # without the tight deadline, rules answer
        assert done.provider == "offline"
