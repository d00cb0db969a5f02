"""A real ``inspect eval`` on trio whose model — Inspect's built-in mock model, no network —
calls the ``bash()`` and ``python()`` tools in sbxkit sandboxes; a killed eval; the CLI cleanup
hook. The witness proves every container is gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sbxkit._model.uids import HOST_UIDS
from tests.engine.helpers import wait_until
from tests.engine.test_inspect_provider import write_profile
from tests.witness import Witness

TASK = '''
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, python

USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
BASH = "echo lease=$SBXKIT_LEASE uid=$(id -u) cwd=$(pwd); {bash_tail}"


def script(messages, tools, tool_choice, config):
    """Call bash(), then python(), then answer with what the tools printed."""
    results = [m for m in messages if m.role == "tool"]
    if not results:
        out = ModelOutput.for_tool_call("mockllm/model", "bash", {{"command": BASH}})
    elif len(results) == 1:
        out = ModelOutput.for_tool_call("mockllm/model", "python", {{"code": "print(6 * 7)"}})
    else:
        out = ModelOutput.from_content("mockllm/model", " | ".join(m.text for m in results))
    out.usage = USAGE  # set, so no token estimate: that would download tiktoken's encoding
    return out


@task
def sbx_tools():
    return Task(
        dataset=[Sample(input="run the tools", target="42", id=i) for i in (1, 2)],
        solver=[use_tools([bash(), python()]), generate()],
        scorer=includes(),
        sandbox=("sbxkit", "profile.toml"),
        model=get_model("mockllm/model", custom_outputs=script),
    )
'''


def inspect_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "inspect_ai", *args]


def eval_env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "INSPECT_ASYNC_BACKEND": "trio",
        "TIKTOKEN_CACHE_DIR": str(tmp_path / "no-tiktoken"),  # empty: a download would fail
        "INSPECT_LOG_DIR": str(tmp_path / "logs"),
    }


def write_task(tmp_path: Path, python_image: str, bash_tail: str = "true") -> Path:
    write_profile(tmp_path / "profile.toml", python_image)
    task = tmp_path / "task.py"
    task.write_text(TASK.format(bash_tail=bash_tail))
    return task


def inspect_containers(witness: Witness) -> list[dict[str, object]]:
    return witness.containers(label="sbxkit.inspect.task=sbx_tools")


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_inspect_eval_runs_bash_and_python_in_one_sbxkit_sandbox_per_sample(
    witness: Witness, python_image: str, tmp_path: Path, backend: str
) -> None:
    task = write_task(tmp_path, python_image)
    proc = subprocess.run(
        inspect_argv("eval", task.name, "--log-format", "json", "--display", "plain"),
        cwd=tmp_path,
        env={**eval_env(tmp_path), "INSPECT_ASYNC_BACKEND": backend},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    (log_path,) = (tmp_path / "logs").glob("*.json")
    log = json.loads(log_path.read_text())
    assert log["status"] == "success", log.get("error")
    leases = set()
    for sample in log["samples"]:
        tools = [m for m in sample["messages"] if m["role"] == "tool"]
        assert [m["function"] for m in tools] == ["bash", "python"]
        bash_out, python_out = (m["content"] for m in tools)
        uid = int(bash_out.split("uid=")[1].split()[0])
        assert uid in HOST_UIDS  # a uid of the sandbox's own
        assert "cwd=/tmp" in bash_out
        assert python_out == "42\n"
        leases.add(bash_out.split("lease=")[1].split()[0])
        assert sample["scores"]["includes"]["value"] == "C"
    assert len(leases) == 2  # one sandbox per sample
    assert inspect_containers(witness) == []  # removed at sample cleanup, before the eval exited
    assert not (tmp_path / "no-tiktoken").exists()


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_a_killed_eval_leaves_no_container(
    witness: Witness, python_image: str, tmp_path: Path, backend: str
) -> None:
    task = write_task(tmp_path, python_image, bash_tail="sleep 120")
    proc = subprocess.Popen(
        inspect_argv("eval", task.name, "--display", "plain"),
        cwd=tmp_path,
        env={**eval_env(tmp_path), "INSPECT_ASYNC_BACKEND": backend},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def both_running_or_eval_ended() -> bool:
            return proc.poll() is not None or len(inspect_containers(witness)) == 2

        assert wait_until(both_running_or_eval_ended, 120)
        assert proc.poll() is None, proc.communicate()[1].decode()[-3000:]
        time.sleep(1.0)  # the bash tool's sleep is under way in both sandboxes
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The supervisor saw the eval's connections close: it removes both sandboxes by itself.
    assert wait_until(lambda: inspect_containers(witness) == [], 20), inspect_containers(witness)


def test_inspect_sandbox_cleanup_asks_the_supervisor_to_recover(tmp_path: Path) -> None:
    proc = subprocess.run(
        inspect_argv("sandbox", "cleanup", "sbxkit"),
        env=eval_env(tmp_path),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
