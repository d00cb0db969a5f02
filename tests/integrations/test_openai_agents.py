"""The OpenAI Agents SDK on sbxkit: a real ``SandboxAgent`` driven by the SDK's own
``ScriptedModel`` (no LLM, offline) through ``SbxkitSandboxClient``, on a real daemon.

Run on a ``--userns-remap`` daemon (root inside needs one): ``SBXKIT_TEST_SOCKET=$SOCK
DOCKER_HOST=unix://$SOCK pytest tests/integrations/test_openai_agents.py`` (``nox -s
integration_openai_agents`` provisions it). Each test ends with the witness finding none of
its containers.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from agents.sandbox import LocalSnapshotSpec, Manifest, SandboxPathGrant, SandboxRunConfig, User
from agents.sandbox.entries import InContainerMountStrategy, MountpointMountPattern, S3Mount
from agents.sandbox.errors import PtySessionNotFoundError

from sbxkit.errors import ReattachRefused, SbxError, SpecError
from sbxkit.integrations.openai_agents import (
    SbxkitSandboxClient,
    SbxkitSandboxClientOptions,
    SbxkitSandboxSession,
)
from tests.integrations import openai_agents_support as support
from tests.integrations.openai_agents_support import (
    PYTHON,
    TOTAL,
    create_file,
    exec_command,
    run,
    run_agent,
    scripted_agent,
    write_stdin,
)
from tests.witness import Witness

witness = support.witness  # the fixtures: the daemon's independent view, and no leftovers
no_leftovers = support.no_leftovers
pytestmark = pytest.mark.usefixtures("no_leftovers")

REPO = Path(__file__).resolve().parents[2]


def mark(name: str) -> dict[str, str]:
    return {"mark": f"{name}-{os.getpid()}-{time.monotonic_ns()}"}


def program_steps(*, tty: bool) -> list[Any]:
    """Write total.py (apply_patch: the SDK's session.write), run it as a long-running
    process fed through write_stdin, then read it and the sandbox's facts back."""
    return [
        [create_file("p1", "total.py", TOTAL)],
        [exec_command("c1", "python3 -u total.py", tty=tty, yield_time_ms=1000)],
        write_stdin("c2", "2\n3\n", after="c1"),
        [exec_command("c3", "cat total.py; echo; echo uid=$(id -u); grep ' /tmp ' /proc/mounts")],
    ]


def test_an_agent_writes_runs_and_feeds_a_program_as_a_hardened_non_root_user(
    witness: Witness,
) -> None:
    options = SbxkitSandboxClientOptions(image=PYTHON, labels=mark("plain"))
    sandbox = SandboxRunConfig(client=SbxkitSandboxClient(), options=options)
    seen = asyncio.run(run_agent(program_steps(tty=False), sandbox))

    assert "Process running with session ID" in seen["c1"]  # it waits for its stdin
    assert body(seen["c2"]) == "2\n5\n"  # two lines in, two running totals out
    facts = seen["c3"]
    assert TOTAL in facts  # the file the model wrote, read back (apply_patch drops the last \n)
    uid = int(facts.split("uid=")[1].split()[0])
    assert uid != 0  # the sandbox's own uid: no workspace, no root
    assert "noexec" in facts.split("uid=")[1]  # /tmp as sbxkit mounts it; the SDK's helpers ran


@pytest.mark.parametrize("runtime", [None, "gvisor"], ids=["runc", "gvisor"])
def test_root_inside_on_a_userns_daemon_with_a_terminal(
    witness: Witness, runtime: str | None
) -> None:
    assert witness.maps_uids(), "root inside needs a --userns-remap daemon (the test's own)"
    options = SbxkitSandboxClientOptions(
        image=PYTHON, root=True, runtime=runtime, labels=mark("root")
    )
    sandbox = SandboxRunConfig(client=SbxkitSandboxClient(), options=options)
    seen = asyncio.run(run_agent(program_steps(tty=True), sandbox))

    assert "Process running with session ID" in seen["c1"]
    assert body(seen["c2"]).split() == ["2", "3", "2", "5"]  # the terminal echoes the input
    assert "uid=0" in seen["c3"]


def test_resume_from_a_second_process_spends_the_handle_once(
    witness: Witness, tmp_path: Path
) -> None:
    client = SbxkitSandboxClient()
    snapshots = tmp_path / "snapshots"
    labels = mark("resume")

    async def first() -> tuple[str, dict[str, object]]:
        options = SbxkitSandboxClientOptions(image=PYTHON, labels=labels)
        session = await client.create(
            manifest=Manifest(), options=options, snapshot=LocalSnapshotSpec(base_path=snapshots)
        )
        async with session:
            steps = [[exec_command("c1", "echo carried over > notes.txt")]]
            await run_agent(steps, SandboxRunConfig(session=session))
            with pytest.raises(SpecError) as other_user:
                await session.exec("id", user="alice")
            assert str(other_user.value) == (
                "user: 'alice': every command of an sbxkit sandbox runs as the sandbox's own "
                "user (no sudo, no second account); leave the agent's run_as unset"
            )
            inner = session._inner
            assert isinstance(inner, SbxkitSandboxSession)
            container = inner.sandbox.container_id
            payload = await client.detach(session, keep_s=120)
        await client.delete(session)
        return container, payload

    container, payload = asyncio.run(first())
    assert payload["handle"]
    # Detaching persisted the snapshot: the SDK's fingerprint helper ran from a noexec /tmp.
    assert payload["snapshot_fingerprint"]
    assert list(snapshots.iterdir())
    kept = [c["Id"] for c in witness.sbxkit_containers()]
    assert kept == [container]  # this process let go; the supervisor keeps it

    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(payload))
    state_file.chmod(0o600)
    hop = second_process(state_file, "detach")
    assert hop["container"] == container  # the same sandbox, not a replacement
    carried, uid = body(hop["seen"]).splitlines()
    assert carried == "carried over"
    assert int(uid) != 0

    async def replay() -> None:
        await client.resume(client.deserialize_session_state(json.loads(json.dumps(payload))))

    with pytest.raises(ReattachRefused) as refused:
        asyncio.run(replay())  # the first handle was spent by the second process
    assert str(refused.value) == (
        "supervisor: reattach refused: refused: replayed secret (already used for an adoption)"
    )

    last = second_process(state_file, "delete")  # the handle the second process left
    assert last["container"] == container
    assert body(last["seen"]).splitlines()[0] == "carried over"


def test_a_state_kept_past_its_keep_resumes_from_its_snapshot(
    witness: Witness, tmp_path: Path
) -> None:
    """Nobody reattached within keep_s: the supervisor removed the sandbox, and resume makes
    a new one with the workspace the snapshot holds (the SDK's rule for a backend gone)."""
    client = SbxkitSandboxClient()
    snapshot = LocalSnapshotSpec(base_path=tmp_path / "snapshots")

    async def first() -> tuple[str, dict[str, object]]:
        options = SbxkitSandboxClientOptions(image=PYTHON, labels=mark("kept"))
        session = await client.create(manifest=Manifest(), options=options, snapshot=snapshot)
        async with session:
            await session.exec("mkdir -p d && echo kept > d/notes.txt && ln -s d/notes.txt link")
            container = _inner(session).sandbox.container_id
            payload = await client.detach(session, keep_s=1)
        return container, payload

    async def later(payload: dict[str, object]) -> tuple[str, str]:
        session = await client.resume(client.deserialize_session_state(payload))
        async with session:
            listing = await session.exec("cat link; cat d/notes.txt")
            container = _inner(session).sandbox.container_id
        await client.delete(session)
        return container, listing.stdout.decode()

    container, payload = asyncio.run(first())
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []  # the keep ended
    again, listing = asyncio.run(later(payload))
    assert again != container
    assert listing == "kept\nkept\n"  # hydrated from the tar: the file and the link


def _inner(session: Any) -> SbxkitSandboxSession:
    inner = session._inner
    assert isinstance(inner, SbxkitSandboxSession)
    return inner


def test_bounds_end_commands_and_processes_as_the_sdk_expects(witness: Witness) -> None:
    """Past output_bytes a command ends with 123 and says why; past max_processes the least
    recently used exec_command process is ended for the new one (the SDK's rule)."""
    client = SbxkitSandboxClient()
    options = SbxkitSandboxClientOptions(
        image=PYTHON, output_bytes=1000, max_processes=1, labels=mark("bounds")
    )

    async def scenario() -> tuple[Any, Any, Any]:
        session = await client.create(options=options)
        async with session:
            flood = await session.exec("head -c 5000 /dev/zero")
            first = await session.pty_exec_start("sleep 600", yield_time_s=0.3)
            second = await session.pty_exec_start("sleep 600", yield_time_s=0.3)
            with pytest.raises(PtySessionNotFoundError) as gone:
                await session.pty_write_stdin(session_id=first.process_id, chars="")
        await client.delete(session)
        return flood, (first, second), gone.value

    flood, (first, second), gone = asyncio.run(scenario())
    assert flood.exit_code == 123
    assert len(flood.stdout) == 1000  # exactly the bound, then the end
    assert flood.stderr.endswith(b"sbxkit: the command ended output_exceeded\n")
    assert first.process_id is not None
    assert second.process_id not in (None, first.process_id)  # the second runs, the first ended
    assert gone.context["session_id"] == first.process_id


def test_a_killed_process_leaves_no_sandbox(witness: Witness) -> None:
    """The SDK's Docker backend leaves its container running when the process dies; here the
    supervisor removes it as the dead process's connection ends."""
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.integrations.openai_agents_support", "hold", PYTHON],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        container = holder.stdout.readline().strip()
        assert [c["Id"] for c in witness.sbxkit_containers()] == [container]
    finally:
        holder.kill()
        holder.wait(timeout=30)
    started = time.monotonic()
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
    print(f"removed {time.monotonic() - started:.2f} s after the SIGKILL")


def body(output: str) -> str:
    """What the command printed, below the SDK's header of an exec_command output."""
    return output.split("Output:\n", 1)[1]


def second_process(state_file: Path, then: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.integrations.openai_agents_support", str(state_file), then],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


S3_FUSE = S3Mount(
    bucket="b", mount_strategy=InContainerMountStrategy(pattern=MountpointMountPattern())
)
NO_ACCOUNTS = (
    "manifest.users: ['alice']: sbxkit makes no accounts in a sandbox (useradd needs root and "
    "a writable /etc); commands run as the sandbox's own user"
)
REFUSALS = {
    "ports": (
        {"exposed_ports": (8080,)},
        None,
        "exposed_ports: (8080,): an sbxkit sandbox has no network, so no port is published "
        "(its network is 'none')",
    ),
    "network": (
        {"network_mode": "bridge"},
        None,
        "network_mode: 'bridge': an sbxkit sandbox has no network ('none' only)",
    ),
    "accounts": ({}, {"manifest": Manifest(users=[User(name="alice")])}, NO_ACCOUNTS),
    "run-as": ({}, {"run_as": "alice"}, NO_ACCOUNTS),  # the SDK adds the agent's user
    "mount": (
        {},
        {"manifest": Manifest(entries={"data": S3_FUSE})},
        "manifest.entries['/workspace/data']: S3Mount: storage mounts need CAP_SYS_ADMIN and "
        "/dev/fuse in the sandbox, or a Docker volume plugin, which sbxkit never grants",
    ),
    "host-path": (
        {},
        {
            "manifest": Manifest(
                extra_path_grants=(SandboxPathGrant(path="/srv", host_path="/srv"),)
            )
        },
        "manifest.extra_path_grants[0].host_path: '/srv': no host path is bound into an sbxkit "
        "sandbox here; put the files in the manifest's entries",
    ),
    "pull": (
        {"image": "sbxkit-test/not-here:latest"},
        None,
        "image 'sbxkit-test/not-here:latest': not present locally; sbxkit never pulls images "
        "(load or build it first)",
    ),
}


@pytest.mark.parametrize(("fields", "extra", "message"), REFUSALS.values(), ids=REFUSALS)
def test_what_sbxkit_will_not_do_is_refused_by_name_before_any_container(
    witness: Witness, fields: dict[str, Any], extra: dict[str, Any] | None, message: str
) -> None:
    labels = mark("refused")
    options = SbxkitSandboxClientOptions(**{"image": PYTHON, "labels": labels, **fields})
    extra = extra or {}
    manifest = extra.get("manifest")
    sandbox = SandboxRunConfig(client=SbxkitSandboxClient(), options=options, manifest=manifest)
    agent, _ = scripted_agent([], run_as=extra.get("run_as"))
    since = time.time()
    with pytest.raises(SbxError) as caught:
        asyncio.run(run(agent, sandbox))
    assert str(caught.value) == message
    label = "mark=" + labels["mark"]
    assert witness.events(since, time.time(), type=["container"], label=[label]) == []
