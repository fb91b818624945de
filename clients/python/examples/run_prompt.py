"""Submit one prompt to a drover session and follow its events to the end of the turn.

    python examples/run_prompt.py [--home DIR] [--session ID] [--approve once|deny] PROMPT

The daemon must be running (`drover daemon`, or any `drover run` starts it). Streamed text is
printed as it arrives; tool calls and prompts are shown on their own lines. Kill and restart
the daemon while this runs: the stream picks up where it was, and the lost turn shows up as
`unknown` (resolve it with `prompt.resolve_unknown`, as this script offers to).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Literal

from drover_client import Client, DroverError, Session
from drover_client.types import OpenPrompt


async def answer(session: Session, prompt: OpenPrompt, approve: Literal["once", "deny"]) -> None:
    """Answers an approval with `approve`, a clarify question from stdin; says where a spend
    limit paused the turn (a person raises it with `drover budget`)."""
    if prompt["kind"] == "approval":
        print(f"\n[approval: {prompt['command']} -> {approve}]", file=sys.stderr)
        await session.respond_approval(prompt, approve)
    elif prompt["kind"] == "clarify":
        await session.respond_clarify(prompt, input(f"\n{prompt['question']} "))
    else:
        print(
            f"\n[paused (budget): {prompt['spent_usd']:.4f} USD spent; "
            f"`drover budget {session.id} --add-usd N` lets it go on]",
            file=sys.stderr,
        )


async def run(home: str | None, session_id: str | None, approve: Literal["once", "deny"], prompt: str) -> int:
    async with await Client.connect(home) as client:
        session = await client.resume(session_id) if session_id else await client.create_session(title=prompt[:40])
        print(f"session {session.id}", file=sys.stderr)
        receipt = await session.submit(prompt)
        # `event["type"]` says which payload the event carries (types.SessionEvent).
        async for event in session.events():
            if event["type"] == "message.delta":
                print(event["payload"]["text"], end="", flush=True)
            elif event["type"] == "tool.start":
                tool = event["payload"]
                print(f"\n[tool {tool['name']}: {tool['context']}]", file=sys.stderr)
            elif event["type"] == "approval.request" or event["type"] == "clarify.request":
                await answer(session, event["payload"], approve)
            elif event["type"] == "turn.settled" and event["payload"]["admission_id"] == receipt["admission_id"]:
                outcome, error = event["payload"]["outcome"], event["payload"].get("error")
                print(f"\n[turn {outcome}{': ' + error if error else ''}]", file=sys.stderr)
                if outcome == "unknown":
                    await session.resolve_unknown(receipt["admission_id"])
                    print("[resolved the unknown turn as interrupted]", file=sys.stderr)
                return 0 if outcome == "completed" else 1
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--home", help="the drover home (default $DROVER_HOME, else ~/.drover)")
    parser.add_argument("--session", help="resume this session instead of creating one")
    parser.add_argument("--approve", choices=["once", "deny"], default="deny")
    parser.add_argument("prompt")
    args = parser.parse_args()
    try:
        return asyncio.run(run(args.home, args.session, args.approve, args.prompt))
    except DroverError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
