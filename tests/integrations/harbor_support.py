"""What tests/integrations/test_harbor.py shares: the witness fixtures, Harbor tasks written in
a temporary directory, a task image made from the python image (no Dockerfile: a container of
it, the task's files put through the archive endpoint, committed) and the real ``harbor`` CLI
run as a process of its own.

The real-engine rules of tests/engine hold: a missing engine, image or ``harbor`` fails, and
each test ends with the independent witness finding none of its containers. Harbor runs
offline: its oracle agent needs no model, and LiteLLM is told to keep to its local price list.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.engine.helpers import image_with_files
from tests.witness import LEASE_LABEL, PYTHON, SOCKET, Witness

ENVIRONMENT = "sbxkit.integrations.harbor:SbxkitEnvironment"
HARBOR = Path(sys.executable).parent / "harbor"
OFFLINE = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # else it fetches a price list at import
    "COLUMNS": "400",  # Rich wraps a refusal's message at the terminal's width
}


@pytest.fixture(scope="module")
def witness() -> Witness:
    w = Witness()
    if not w.ping():
        pytest.fail(f"no Docker engine answers on {SOCKET}: run scripts/userns-engine-up")
    if not w.image_exists(PYTHON):
        pytest.fail(f"test image {PYTHON} missing on {SOCKET}: run scripts/userns-engine-up")
    if not HARBOR.is_file():
        pytest.fail(f"no harbor CLI at {HARBOR}: pip install 'sbxkit[harbor]' (Python 3.12)")
    return w


@pytest.fixture(autouse=True)
def no_leftovers(witness: Witness) -> Iterator[None]:
    """Before: none of this session's sandboxes; after: none again (the witness decides)."""
    assert witness.sbxkit_containers() == []
    yield
    left = witness.wait_until_no_sbxkit_containers(seconds=10.0)
    for container in left:
        witness.remove(container["Id"])
    assert left == [], f"leaked containers: {[c['Id'][:12] for c in left]}"


def write_task(
    where: Path,
    *,
    environment: Mapping[str, Any],
    solve: str,
    test: str,
    agent_timeout: float = 120.0,
    agent_user: str | None = None,
    verifier: Mapping[str, Any] | None = None,
    files: Mapping[str, bytes] | None = None,
) -> Path:
    """A Harbor task directory: task.toml, instruction.md, solution/solve.sh, tests/test.sh,
    and ``files`` (relative name → bytes) beside them (``environment/...``, ``tests/...``)."""
    where.mkdir(parents=True)
    lines = ['schema_version = "1.4"', "", "[metadata]", "", "[agent]"]
    lines += [f"timeout_sec = {agent_timeout}"]
    lines += [f"user = {json.dumps(agent_user)}"] if agent_user is not None else []
    lines += ["", "[verifier]", "timeout_sec = 120.0"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in (verifier or {}).items()] + [""]
    lines += [
        "[environment]",
        *(f"{key} = {json.dumps(value)}" for key, value in environment.items()),
    ]
    (where / "task.toml").write_text("\n".join(lines) + "\n")
    (where / "instruction.md").write_text("Write the sum of the numbers to /app/answer.txt.\n")
    for name, text in (("solution/solve.sh", solve), ("tests/test.sh", test)):
        path = where / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    for name, data in (files or {}).items():
        path = where / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return where


def task_image(witness: Witness, files: Mapping[str, bytes]) -> str:
    """The python image plus ``files`` (absolute-less names), committed as this test's own."""
    return image_with_files(witness, PYTHON, files, "sbxkit-test/harbor-task")


def harbor_argv(task: Path, jobs: Path, *options: str) -> list[str]:
    """``harbor run`` of one task with the oracle agent on the sbxkit environment."""
    return [
        str(HARBOR),
        "run",
        "--path",
        str(task),
        "--agent",
        "oracle",
        "--env",
        ENVIRONMENT,
        "--jobs-dir",
        str(jobs),
        "--yes",
        *options,
    ]


def harbor_env() -> dict[str, str]:
    return {**os.environ, **OFFLINE}


def run_harbor(task: Path, jobs: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        harbor_argv(task, jobs, *options),
        env=harbor_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def trial_dir(jobs: Path) -> Path:
    """The one trial's directory of the one job under ``jobs``."""
    (found,) = jobs.glob("*/*/result.json")
    return found.parent


def trial_result(jobs: Path) -> dict[str, Any]:
    """The one trial's ``result.json``."""
    result: dict[str, Any] = json.loads((trial_dir(jobs) / "result.json").read_text())
    return result


def flat(text: str) -> str:
    """Rich's boxed traceback as one line of words: frame borders and wrapping dropped."""
    return re.sub(r"[\s│╭╮╰╯─]+", " ", text)


def sandboxes_created_since(witness: Witness, since: float) -> list[dict[str, Any]]:
    """Sandbox containers (a lease label) the daemon created since ``since`` (unix seconds),
    by its own events."""
    events = witness.events(since, time.time(), type=["container"], event=["create"])
    return [e for e in events if LEASE_LABEL in e.get("Actor", {}).get("Attributes", {})]
