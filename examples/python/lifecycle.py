"""One agent turn against agentlearn, with the Python client (pip install agentlearn-client).

    python examples/python/lifecycle.py --address 127.0.0.1:50051 --company acme --seat ana --role swe

``--reflector-address`` (SubmitTurn's) defaults to ``--address``: split or on Kubernetes the
reflector is a service at an address of its own.

What an engine does each turn: the turn-start context into the system prompt, the builtin tools
handed to the model and its tool calls forwarded with CallTool, and the finished turn submitted
for reflection. The "model" here is scripted: it saves a fact, then re-reads its memory, then makes
a mistake (a call without its required argument) to show what a refusal carries. The last line
printed is a JSON summary (the tests read it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

import grpc
from agentlearn_client import AgentLearn, Outcome, Sender, error_details


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--address", default=os.environ.get("AGENTLEARN_ADDRESS", "127.0.0.1:50051"))
    p.add_argument("--reflector-address", default=os.environ.get("AGENTLEARN_REFLECTOR_ADDRESS"))
    p.add_argument("--token", default=os.environ.get("AGENTLEARN_TOKEN"))
    p.add_argument("--company", default="acme")
    p.add_argument("--seat", default="ana")
    p.add_argument("--role", default="swe")
    p.add_argument("--turn-id", default=f"py-example-{int(time.time())}")
    args = p.parse_args()
    turn = args.turn_id
    bob = Sender(handle="bob", platform="slack", display_name="Bob")

    async with AgentLearn(
        args.address,
        company=args.company,
        seat=args.seat,
        role=args.role,
        token=args.token,
        reflector_address=args.reflector_address,
    ) as al:
        # 1. Turn start: the learned context goes at the end of the system prompt.
        context = await al.turn_start(turn, "Who approves prod deploys? I need one today.", senders=[bob])
        print(context.summary_line)
        print(context.markdown)

        # 2. The builtins, as OpenAI-style tools for the model.
        tools = await al.tools()
        print("tools:", ", ".join(t["function"]["name"] for t in tools))

        # 3. The model's tool calls, forwarded as they come (no table per tool).
        saved = await al.call_tool(turn, "reflect_and_persist", {"content": "Dana approves prod deploys in #releases."})
        print(saved.text)
        recalled = await al.call_tool(turn, "refresh_memory", {"context_hint": "who approves prod deploys"})
        print(recalled.text)
        try:
            await al.call_tool(turn, "reflect_and_persist", {"tier": "short"})
            refusal = None
        except grpc.aio.AioRpcError as err:
            details = error_details(err)  # hand details.message back to the model as the tool result
            refusal = {
                "code": details.code.name,
                "reason": details.reason,
                "fields": [f for f, _ in details.field_violations],
            }
            print("refused:", details.message)

        # 4. Turn end: the reflector learns from it in the background.
        submitted = await al.turn_end(
            turn,
            outcome=Outcome.DONE,
            label="Message from Bob: Slack message",
            what_it_did="Told Bob that Dana approves prod deploys in #releases.",
        )
        print(
            json.dumps(
                {
                    "turn_id": turn,
                    "offered_skills": list(context.offered_skill_ids),
                    "note_id": saved.result["note_id"],
                    "refresh_note_ids": recalled.result.get("note_ids", []),
                    "refusal": refusal,
                    "queued": submitted.queued,
                }
            )
        )


if __name__ == "__main__":
    asyncio.run(main())
