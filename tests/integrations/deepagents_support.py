"""Fixtures and helpers of tests/integrations/test_deepagents.py: the daemon's independent
witness, the zero-leftovers check, and a scripted tool-calling chat model (offline).

A missing engine, image or framework fails these tests; nothing skips.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable

from tests.witness import PYTHON, SOCKET, Witness

LEFTOVER_WAIT_S = 10.0
"""How long the witness waits for the daemon to finish a removal sbxkit has already asked for."""


@pytest.fixture(scope="session", name="witness")
def witness_fixture() -> Witness:
    w = Witness()
    if not w.ping():
        pytest.fail(
            f"no Docker engine answers on {SOCKET}: run scripts/userns-engine-up and set "
            "SBXKIT_TEST_SOCKET and DOCKER_HOST to its socket; these tests never skip",
            pytrace=False,
        )
    if not w.image_exists(PYTHON):
        pytest.fail(f"test image {PYTHON} is missing: run scripts/userns-engine-up", pytrace=False)
    return w


def assert_none_left(witness: Witness, when: str) -> None:
    left = witness.wait_until_no_sbxkit_containers(seconds=LEFTOVER_WAIT_S)
    if left:
        for container in left:
            witness.remove(container["Id"])  # the next test's slate clean; this one still fails
        pytest.fail(f"leaked containers {when}: {[c['Id'][:12] for c in left]}")


@pytest.fixture(name="no_leftovers")
def no_leftovers_fixture(witness: Witness) -> Iterator[None]:
    before = witness.sbxkit_containers()
    if before:
        pytest.fail(f"sbxkit containers exist before the test: {[c['Id'][:12] for c in before]}")
    yield
    assert_none_left(witness, "after the test")


class ScriptedChatModel(GenericFakeChatModel):
    """A chat model that answers with the scripted messages in order (tool calls included)
    and accepts the tools it is bound to: what ``create_deep_agent`` needs of a model, with no
    model and no network."""

    def bind_tools(
        self, tools: Sequence[Any], *, tool_choice: str | None = None, **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self


def tool_call(name: str, call_id: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": call_id}])
