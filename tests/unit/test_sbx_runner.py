"""The sbx microVM runner against a scripted stand-in (tests/fake_sbx.py), end to end.

There is no ``sbx`` here or in CI: the stand-in implements create/exec/policy/rm/ls minimally,
runs each exec's command with the host's ``sh`` in a temp workspace (so output and exit codes
are real), and logs every invocation's argv, stdin and environment. What a real ``sbx`` would
add — a VM, its network proxy, its memory allocation — is checked only by tests/smoke_sbx.py on
a machine that has it (docs/adr-sbx.md §9).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from sbxkit._model.mounts import BindMount
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.backends.base import open_backend
from sbxkit.backends.sbx import (
    CompletedCommand,
    RunnerInUse,
    SbxBackend,
    SbxCleanupError,
    SbxCommandError,
    SbxConfig,
    SbxUnavailable,
)
from sbxkit.backends.sbx_commands import EXEC_SETUP_FAILED, owner_of, sandbox_name
from sbxkit.cli import EXIT_CLEANUP_FAILED, EXIT_ENGINE_UNAVAILABLE, exit_code_for_error, main
from sbxkit.errors import CleanupError, SbxError, SpecError

FAKE = Path(__file__).resolve().parents[1] / "fake_sbx.py"
TEMPLATE = "docker/sandbox-templates:shell"


class Machine:
    """One host with the stand-in ``sbx`` installed; every runner of a test shares it."""

    def __init__(self, root: Path) -> None:
        self.state = root / "state"
        self.state.mkdir()
        self.locks = root / "locks"
        self.workspaces = root / "workspaces"
        self.workspaces.mkdir()
        self.binary = root / "bin" / "sbx"
        self.binary.parent.mkdir()
        # A wrapper, so the stand-in runs with this interpreter whatever its file mode.
        self.binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "{FAKE}" "$@"\n')
        self.binary.chmod(0o755)

    def backend(self, **config: Any) -> SbxBackend:
        options: dict[str, Any] = {
            "binary": str(self.binary),
            "lock_dir": str(self.locks),
            "workspace_root": str(self.workspaces),
            **config,
        }
        return SbxBackend(SbxConfig(**options))

    def log(self) -> list[dict[str, Any]]:
        path = self.state / "log.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def argvs(self) -> list[list[str]]:
        return [entry["argv"] for entry in self.log()]

    def sandboxes(self) -> list[str]:
        return sorted(p.stem for p in (self.state / "sandboxes").glob("*.json"))

    def control(self, **settings: Any) -> None:
        (self.state / "control.json").write_text(json.dumps(settings))

    def sbx(self, *args: str) -> None:
        subprocess.run([str(self.binary), *args], check=True, capture_output=True)

    def make_sandbox(self, name: str) -> None:
        workspace = self.workspaces / f"orphan-{name}"
        workspace.mkdir()
        self.sbx("create", "shell", "--name", name, "--template", TEMPLATE, str(workspace))


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    machine = Machine(tmp_path)
    monkeypatch.setenv("FAKE_SBX_STATE", str(machine.state))
    return machine


def make_spec(command: list[str], **changes: Any) -> SandboxSpec:
    limits = {
        "cpus": 1.0,
        "memory_bytes": 256 * MiB,
        "pids": 64,
        "output_bytes": 64 * 1024,
        "timeout_s": 20.0,
        **changes.pop("limits", {}),
    }
    return SandboxSpec(image=TEMPLATE, command=command, limits=Limits(**limits), **changes)


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def gone(path: str) -> bool:
    return not os.path.lexists(path)


def is_dead(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


# --- the lifecycle ------------------------------------------------------------------------------


async def test_the_whole_lifecycle(machine: Machine, tmp_path: Path) -> None:
    target = tmp_path / "vm" / "work"  # a workdir that differs from the workspace's host path
    spec = make_spec(
        sh('pwd; echo "$GREETING"; cat; echo oops >&2; echo "lease=$SBXKIT_LEASE"; exit 3'),
        env={"GREETING": "hello from the sandbox"},
        workdir=str(target),
    )
    backend = machine.backend()
    async with open_backend(backend):
        assert (machine.locks / f"{backend.runner_id}.lock").exists()
        result = await backend.run_once(spec, b"fed on stdin\n", host_ports=[8765])

    assert result.status == "exited"
    assert result.exit_code == 3
    assert result.ok is False
    name = result.container_id
    assert owner_of(name) == backend.runner_id
    assert name == sandbox_name(backend.runner_id, result.lease)
    assert result.stdout == (
        f"{target}\nhello from the sandbox\nfed on stdin\nlease={result.lease}\n".encode()
    )
    assert result.stderr == b"oops\n"
    assert result.overflowed is None
    assert result.timings.create_s > 0
    assert result.timings.remove_s > 0

    argvs = machine.argvs()
    binary_args = [argv[:2] for argv in argvs]
    assert binary_args == [
        ["ls", "--json"],  # preflight: the CLI answers
        ["ls", "--json"],  # startup orphan reconciliation
        ["create", "shell"],
        ["policy", "allow"],
        ["exec", "-i"],
        ["rm", "--force"],  # unconditional removal, in a finally
    ]
    create, policy, exec_, remove = argvs[2:]
    workspace = create[-1]
    assert create == ["create", "shell", "--name", name, "--template", TEMPLATE, workspace]
    assert Path(workspace).parent == machine.workspaces
    assert policy == ["policy", "allow", "network", "--sandbox", name, "localhost:8765"]
    assert exec_[:7] == ["exec", "-i", "--", name, "sh", "-c", exec_[6]]
    assert exec_[7:] == ["sbxkit-exec", *spec.command]
    assert remove == ["rm", "--force", name]
    assert os.readlink(target) == workspace  # the exec script linked the workdir
    assert gone(workspace)  # the workspace went with the sandbox
    assert machine.sandboxes() == []
    assert not (machine.locks / f"{backend.runner_id}.lock").exists()  # released by aclose


async def test_no_environment_value_reaches_any_argv_or_the_cli_environment(
    machine: Machine,
) -> None:
    secrets = {
        "API_TOKEN": "tok-6f1c9a2e77",
        "DB_PASSWORD": "pw with spaces & $ymbols",
        "MULTI": "first-secret-line\nsecond-secret-line",
    }
    needles = ["tok-6f1c9a2e77", "pw with spaces", "$ymbols", "first-secret-line", "second-secret"]
    spec = make_spec(sh('printf "%s|%s|%s" "$API_TOKEN" "$DB_PASSWORD" "$MULTI"'), env=secrets)
    backend = machine.backend()
    async with open_backend(backend):
        result = await backend.run_once(spec)
    assert result.stdout == "|".join(secrets.values()).encode()  # the payload got every value
    log = machine.log()
    for entry in log:
        for arg in entry["argv"]:
            for needle in needles:
                assert needle not in arg, f"{needle!r} leaked into argv {entry['argv'][:2]}"
        for value in entry["environ"].values():
            for needle in needles:
                assert needle not in value, "a secret leaked into the sbx process environment"
    (exec_entry,) = [e for e in log if e["argv"][0] == "exec"]
    assert "API_TOKEN tok-6f1c9a2e77\n" in exec_entry["stdin"]  # it travelled on stdin


async def test_removal_after_a_create_that_failed_half_way(machine: Machine) -> None:
    machine.control(fail_create="after")  # the sandbox exists, yet create reports failure
    backend = machine.backend()
    async with open_backend(backend):
        with pytest.raises(SbxCommandError) as caught:
            await backend.run_once(make_spec(["true"]))
    assert caught.value.what == "create"
    assert "failed to boot" in str(caught.value)
    commands = [argv[:2] for argv in machine.argvs()[2:]]
    assert commands == [["create", "shell"], ["rm", "--force"]]
    assert machine.sandboxes() == []
    assert list(machine.workspaces.iterdir()) == []


async def test_removal_is_attempted_even_when_create_made_nothing(machine: Machine) -> None:
    machine.control(fail_create="before")
    backend = machine.backend()
    async with open_backend(backend):
        with pytest.raises(SbxCommandError) as caught:
            await backend.run_once(make_spec(["true"]))
    # The create's error, not a cleanup error: rm failed, but the listing shows it is gone.
    assert not isinstance(caught.value, CleanupError)
    commands = [argv[:2] for argv in machine.argvs()[2:]]
    assert commands == [["create", "shell"], ["rm", "--force"], ["ls", "--json"]]
    assert machine.sandboxes() == []


async def test_an_unconfirmed_removal_is_raised_and_retried_at_the_next_start(
    machine: Machine,
) -> None:
    backend = machine.backend(runner_id="steady1")
    async with open_backend(backend):
        machine.control(fail_rm=True)
        with pytest.raises(SbxCleanupError) as caught:
            await backend.run_once(make_spec(["true"]))
    name = caught.value.name
    assert exit_code_for_error(caught.value) == EXIT_CLEANUP_FAILED
    assert machine.sandboxes() == [name]  # still there, and the error said so
    machine.control()
    restarted = machine.backend(runner_id="steady1")
    async with open_backend(restarted):
        pass
    assert machine.sandboxes() == []


# --- limits -------------------------------------------------------------------------------------


async def test_timeout_kills_with_rm_force(machine: Machine, tmp_path: Path) -> None:
    pidfile = tmp_path / "payload.pid"
    spec = make_spec(sh(f"echo $$ > {pidfile}; echo started; exec sleep 30"))
    spec = make_spec(spec.command, limits={"timeout_s": 0.5})
    backend = machine.backend()
    started = time.monotonic()
    async with open_backend(backend):
        result = await backend.run_once(spec)
    assert time.monotonic() - started < 10
    assert result.status == "timed_out"
    assert result.exit_code is None
    assert result.stdout == b"started\n"
    assert [argv[:2] for argv in machine.argvs()[-2:]] == [["exec", "-i"], ["rm", "--force"]]
    assert is_dead(int(pidfile.read_text()))  # rm --force stopped what ran in the sandbox
    assert machine.sandboxes() == []


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
async def test_output_cap_boundary(machine: Machine, stream: str) -> None:
    cap = 1000
    redirect = "" if stream == "stdout" else " >&2"
    backend = machine.backend()
    async with open_backend(backend):
        exact = await backend.run_once(
            make_spec(sh(f"printf %s {'a' * cap}{redirect}"), limits={"output_bytes": cap})
        )
        over = await backend.run_once(
            make_spec(sh(f"printf %s {'a' * (cap + 1)}{redirect}"), limits={"output_bytes": cap})
        )
    assert exact.status == "exited"
    assert exact.exit_code == 0
    assert exact.overflowed is None
    assert getattr(exact, stream) == b"a" * cap
    assert over.status == "output_exceeded"
    assert over.exit_code is None
    assert over.overflowed == stream
    assert getattr(over, stream) == b"a" * cap  # the first N bytes are kept
    assert machine.sandboxes() == []


async def test_a_flood_is_cut_at_the_cap(machine: Machine) -> None:
    backend = machine.backend()
    async with open_backend(backend):
        result = await backend.run_once(make_spec(["yes"], limits={"output_bytes": 64 * 1024}))
    assert result.status == "output_exceeded"
    assert result.stdout == b"y\n" * 32 * 1024
    assert machine.argvs()[-1][:2] == ["rm", "--force"]


async def test_caller_cancellation_still_removes(machine: Machine) -> None:
    backend = machine.backend()
    async with open_backend(backend):
        with trio.move_on_after(1.0) as scope:
            await backend.run_once(make_spec(["sleep", "30"]))
    assert scope.cancelled_caught
    assert machine.argvs()[-1][:2] == ["rm", "--force"]
    assert machine.sandboxes() == []


async def test_exec_setup_failure_is_reported_by_the_script(
    machine: Machine, tmp_path: Path
) -> None:
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    backend = machine.backend()
    async with open_backend(backend):
        result = await backend.run_once(make_spec(["true"], workdir=str(occupied)))
    assert result.exit_code == EXEC_SETUP_FAILED
    assert b"sbxkit-exec:" in result.stderr
    assert machine.sandboxes() == []


async def test_a_descendant_holding_the_pipes_does_not_hold_the_run(
    machine: Machine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sbxkit.backends import sbx_exec

    monkeypatch.setattr(sbx_exec, "DRAIN_GRACE_S", 0.2)
    pidfile = tmp_path / "descendant.pid"
    backend = machine.backend()
    async with open_backend(backend):
        result = await backend.run_once(
            make_spec(sh(f"sleep 30 & echo $! > {pidfile}; echo parent done"))
        )
    assert result.status == "exited"
    assert result.stdout == b"parent done\n"
    assert is_dead(int(pidfile.read_text()))  # it went with the sandbox


async def test_an_unstartable_command_is_sbx_unavailable() -> None:
    from sbxkit.backends.sbx import process_exec

    with pytest.raises(SbxUnavailable, match="/nonexistent/sbx"):
        await process_exec(["/nonexistent/sbx", "ls"], b"", 5.0, 100)


# --- startup ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "listing",
    [{}, {"ls_banner": "sbx 0.9 is available: run `brew upgrade sbx`", "ls_shape": "object"}],
)
async def test_orphans_are_reconciled_at_startup(machine: Machine, listing: dict[str, Any]) -> None:
    machine.control(**listing)
    mine = [sandbox_name("aaaa1111", f"{i:016x}") for i in range(2)]
    live_runner = sandbox_name("bbbb2222", "0" * 16)  # its lock is held: alive
    dead_runner = sandbox_name("cccc3333", "1" * 16)  # its lock file is free: dead
    unknown = sandbox_name("dddd4444", "2" * 16)  # no lock file here: not ours to judge
    for name in [*mine, live_runner, dead_runner, unknown, "claude-myproject"]:
        machine.make_sandbox(name)
    machine.locks.mkdir()
    (machine.locks / "cccc3333.lock").touch()
    with (machine.locks / "bbbb2222.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        backend = machine.backend(runner_id="aaaa1111")
        async with open_backend(backend):
            assert machine.sandboxes() == sorted([live_runner, unknown, "claude-myproject"])
            assert await backend.reconcile_orphans() == []  # idempotent
    assert not (machine.locks / "cccc3333.lock").exists()
    assert (machine.locks / "bbbb2222.lock").exists()
    removed = [argv[-1] for argv in machine.argvs() if argv[0] == "rm"]
    assert sorted(removed) == sorted([*mine, dead_runner])


async def test_two_runners_do_not_interfere(machine: Machine) -> None:
    first, second = machine.backend(), machine.backend()
    assert first.runner_id != second.runner_id
    async with open_backend(first), trio.open_nursery() as nursery:
        results: list[Any] = []

        async def long_run() -> None:
            results.append(await first.run_once(make_spec(sh("sleep 1.5; echo first done"))))

        nursery.start_soon(long_run)
        while not machine.sandboxes():  # noqa: ASYNC110 (polls the stand-in's state)
            await trio.sleep(0.02)
        (running,) = machine.sandboxes()
        async with open_backend(second):  # its startup reconciliation sees the first's run
            assert machine.sandboxes() == [running]
            own = await second.run_once(make_spec(["echo", "second done"]))
        assert own.stdout == b"second done\n"
    assert results[0].stdout == b"first done\n"
    assert machine.sandboxes() == []
    for argv in machine.argvs():
        if argv[0] == "rm":  # each removed only its own
            assert argv[-1] in (running, own.container_id)


async def test_a_runner_id_is_held_by_one_live_runner(machine: Machine) -> None:
    async with open_backend(machine.backend(runner_id="same1")):
        with pytest.raises(RunnerInUse):
            await machine.backend(runner_id="same1").preflight()
    async with open_backend(machine.backend(runner_id="same1")):  # free again after close
        pass


async def test_a_missing_binary_fails_the_start(machine: Machine) -> None:
    for binary in ("/nonexistent/bin/sbx", "sbx-that-is-not-installed"):
        backend = machine.backend(binary=binary)
        with pytest.raises(SbxUnavailable) as caught:
            await backend.preflight()
        assert binary in str(caught.value)
        assert exit_code_for_error(caught.value) == EXIT_ENGINE_UNAVAILABLE
        assert not backend.started


async def test_a_broken_binary_fails_the_start_and_releases_the_lock(
    machine: Machine, tmp_path: Path
) -> None:
    broken = tmp_path / "broken-sbx"
    broken.write_text("#!/bin/sh\necho 'please run sbx login' >&2\nexit 1\n")
    broken.chmod(0o755)
    backend = machine.backend(binary=str(broken), runner_id="broken1")
    with pytest.raises(SbxCommandError, match="please run sbx login"):
        await backend.preflight()
    assert not (machine.locks / "broken1.lock").exists()


async def test_runs_need_a_started_runner(machine: Machine) -> None:
    with pytest.raises(SbxError, match="preflight"):
        await machine.backend().run_once(make_spec(["true"]))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"network": "bridge"}, "network"),
        ({"mounts": [BindMount(source="/srv", target="/data")]}, "mounts"),
        ({"user": "1000:1000"}, "user"),
        ({"runtime": "gvisor"}, "runtime"),
        ({"env": {"A.B": "1"}}, "env['A.B']"),
        ({"limits": {"timeout_s": None}}, "limits.timeout_s"),
    ],
)
async def test_refusals_come_before_any_sbx_command(
    machine: Machine, changes: dict[str, Any], field: str
) -> None:
    backend = machine.backend()
    async with open_backend(backend):
        before = len(machine.log())
        with pytest.raises(SpecError) as caught:
            await backend.run_once(make_spec(["true"], **changes))
        with pytest.raises(SpecError):
            await backend.run_once(make_spec(["true"]), host_ports=["8080"])  # type: ignore[list-item]
        assert len(machine.log()) == before
    assert caught.value.field == field


async def test_the_exec_seam_is_injectable(machine: Machine) -> None:
    """Every invocation goes through the one seam (here a recorder in front of the real one)."""
    from sbxkit.backends.sbx import process_exec

    seen: list[list[str]] = []

    async def recording(
        argv: Any, stdin: bytes, timeout: float, max_output: int
    ) -> CompletedCommand:
        seen.append(list(argv))
        return await process_exec(argv, stdin, timeout, max_output)

    backend = SbxBackend(
        SbxConfig(binary=str(machine.binary), lock_dir=str(machine.locks)), exec=recording
    )
    async with open_backend(backend):
        await backend.run_once(make_spec(["true"]))
    assert [argv[1:] for argv in seen] == machine.argvs()


# --- the command line ---------------------------------------------------------------------------


def write_profile(machine: Machine, tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "sandbox.toml"
    path.write_text(
        f"""
[sandbox]
runtime = "sandbox"

[sandbox.docker.limits]
timeout = 20

[sandbox.sbx]
binary = "{machine.binary}"
template = "{TEMPLATE}"
{extra}
"""
    )
    return str(path)


def test_sbxkit_run_with_a_sandbox_profile(
    machine: Machine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = write_profile(machine, tmp_path)
    with pytest.raises(SystemExit) as caught:
        main(["run", "--profile", profile, "--env", "WHO=cli", "--", *sh('echo "$WHO"; exit 4')])
    assert caught.value.code == 4
    assert capsys.readouterr().out == "cli\n"
    (create,) = [argv for argv in machine.argvs() if argv[0] == "create"]
    assert create[4:6] == ["--template", TEMPLATE]
    assert machine.sandboxes() == []
    with pytest.raises(SystemExit) as caught:
        main(["run", "--profile", profile, "--json", "other/image:2", "--", "true"])
    assert caught.value.code == 0
    document = json.loads(capsys.readouterr().out)
    assert owner_of(document["container_id"]) is not None
    assert document["status"] == "exited"
    (_, create) = [argv for argv in machine.argvs() if argv[0] == "create"]
    assert create[4:6] == ["--template", "other/image:2"]  # IMAGE overrides the template


def test_sbxkit_run_sandbox_refusals(
    machine: Machine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = write_profile(machine, tmp_path)
    for argv, message in [
        (["--socket", "/run/docker.sock"], "--socket: a Docker socket has no meaning"),
        (["--network", "bridge"], "network: under the sandbox runtime"),
    ]:
        with pytest.raises(SystemExit) as caught:
            main(["run", "--profile", profile, *argv, "--", "true"])
        assert caught.value.code == 2
        assert message in capsys.readouterr().err
    assert machine.log() == []  # refused before any sbx command
    missing = Path(profile)
    missing.write_text(missing.read_text().replace(str(machine.binary), "/no/sbx"))
    with pytest.raises(SystemExit) as caught:
        main(["run", "--profile", str(missing), "--", "true"])
    assert caught.value.code == EXIT_ENGINE_UNAVAILABLE
    assert "sbx (/no/sbx) is unavailable" in capsys.readouterr().err
    assert [argv for argv in machine.argvs() if argv[0] == "create"] == []
