"""What tests/integrations/test_openai_agents.py shares: the witness fixtures, a scripted
agent (the SDK's own ``ScriptedModel``: no LLM, no network) and the second process of the
resume test (``python -m tests.integrations.openai_agents_support STATE_FILE detach|delete``)
and the process killed with its session open (``... hold IMAGE``).

The real-engine rules of tests/engine hold: a missing engine or image fails, and each test
ends with the independent witness finding none of its containers.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, RunConfig, Runner
from agents.items import ToolCallOutputItem
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.testing import ModelCall, ModelStep, ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseCustomToolCall

from sbxkit.integrations.openai_agents import (
    SbxkitSandboxClient,
    SbxkitSandboxClientOptions,
    SbxkitSandboxSession,
)
from tests.witness import PYTHON, SOCKET, Witness

SESSION_ID = re.compile(r"Process running with session ID (\d+)")

# A program that reads numbers until stdin ends, printing the running total: a long-running
# process the model feeds through write_stdin.
TOTAL = (
    "import sys\ntotal = 0\nfor line in sys.stdin:\n"
    "    total += int(line)\n    print(total, flush=True)\n"
)


@pytest.fixture(scope="module")
def witness() -> Witness:
    w = Witness()
    if not w.ping():
        pytest.fail(f"no Docker engine answers on {SOCKET}: run scripts/userns-engine-up")
    images = {tag for image in w.get("/images/json") for tag in image.get("RepoTags") or []}
    if PYTHON not in images:
        pytest.fail(f"test image {PYTHON} missing on {SOCKET}: run scripts/userns-engine-up")
    return w


@pytest.fixture
def no_leftovers(witness: Witness) -> Iterator[None]:
    """After the test: none of this session's sandbox containers on the daemon."""
    yield
    left = witness.wait_until_no_sbxkit_containers(seconds=10.0)
    for container in left:
        witness.remove(container["Id"])
    assert left == [], f"leaked containers: {[c['Id'][:12] for c in left]}"


def exec_command(call_id: str, cmd: str, **extra: Any) -> Any:
    return function_call("exec_command", {"cmd": cmd, **extra}, call_id=call_id)


def write_stdin(call_id: str, chars: str, *, after: str) -> ModelStep:
    """Feed ``chars`` to the process the tool output of call ``after`` started."""

    def respond(call: ModelCall) -> list[Any]:
        session_id = SESSION_ID.search(tool_output(call, after))
        assert session_id is not None, f"no running process in {tool_output(call, after)!r}"
        arguments = {"session_id": int(session_id.group(1)), "chars": chars}
        arguments["yield_time_ms"] = 2000
        return [function_call("write_stdin", arguments, call_id=call_id)]

    return ModelStep.respond(respond)


def create_file(call_id: str, path: str, text: str) -> ResponseCustomToolCall:
    """The model's apply_patch call that creates ``path`` (the SDK writes it: session.write)."""
    diff = "".join(f"+{line}\n" for line in text.splitlines())
    operation = {"type": "create_file", "path": path, "diff": diff}
    return ResponseCustomToolCall(
        type="custom_tool_call", call_id=call_id, name="apply_patch", input=json.dumps(operation)
    )


def tool_output(call: ModelCall, call_id: str) -> str:
    for item in call.input if isinstance(call.input, list) else []:
        if isinstance(item, dict) and item.get("call_id") == call_id and "output" in item:
            return str(item["output"])
    raise AssertionError(f"no output for tool call {call_id} in the model's input")


def outputs(result: Any) -> dict[str, str]:
    """Each tool call's output, by call id."""
    found = {}
    for item in result.new_items:
        if isinstance(item, ToolCallOutputItem):
            raw = item.raw_item
            call_id = raw.get("call_id") if isinstance(raw, dict) else raw.call_id
            found[str(call_id)] = str(item.output)
    return found


def scripted_agent(
    steps: Sequence[Any], *, run_as: str | None = None
) -> tuple[Agent[Any], ScriptedModel]:
    model = ScriptedModel([*steps, [assistant_message("done")]])
    agent = SandboxAgent(
        name="builder", instructions="Work in the sandbox.", model=model, run_as=run_as
    )
    return agent, model


async def run(agent: Agent[Any], sandbox: SandboxRunConfig) -> Any:
    """``Runner.run`` with no tracing export (offline)."""
    config = RunConfig(sandbox=sandbox, tracing_disabled=True)
    return await Runner.run(agent, "go", run_config=config)


async def run_agent(
    steps: Sequence[Any], sandbox: SandboxRunConfig, *, check: Callable[[Any], None] | None = None
) -> dict[str, str]:
    agent, model = scripted_agent(steps)
    result = await Runner.run(
        agent, "go", run_config=RunConfig(sandbox=sandbox, tracing_disabled=True)
    )
    model.assert_complete()
    assert result.final_output == "done"
    if check is not None:
        check(result)
    return outputs(result)


async def second_process(state_file: Path) -> None:
    """Resume the detached session of ``state_file``, let an agent read the workspace, then
    detach again or delete (argv[2]: ``detach`` or ``delete``); print what happened as JSON."""
    client = SbxkitSandboxClient()
    payload = json.loads(state_file.read_text())  # noqa: ASYNC240 - this process's only task
    session = await client.resume(client.deserialize_session_state(payload))
    inner = session._inner
    assert isinstance(inner, SbxkitSandboxSession)
    report: dict[str, Any] = {"container": inner.sandbox.container_id}
    async with session:
        steps = [[exec_command("c1", "cat notes.txt; id -u")]]
        report["seen"] = (await run_agent(steps, SandboxRunConfig(session=session)))["c1"]
        if sys.argv[2] == "detach":
            again = await client.detach(session, keep_s=60)
            state_file.write_text(json.dumps(again))  # noqa: ASYNC240 - its only task
    await client.delete(session)  # after a detach: nothing left here to remove
    print(json.dumps(report))


async def hold(image: str) -> None:
    """Open a session, say its container on stdout, and wait to be killed."""
    client = SbxkitSandboxClient()
    session = await client.create(options=SbxkitSandboxClientOptions(image=image))
    async with session:
        inner = session._inner
        assert isinstance(inner, SbxkitSandboxSession)
        print(inner.sandbox.container_id, flush=True)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    if sys.argv[1] == "hold":
        asyncio.run(hold(sys.argv[2]))
    else:
        asyncio.run(second_process(Path(sys.argv[1])))
