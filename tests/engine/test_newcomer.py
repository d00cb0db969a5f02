"""A newcomer's first hour against the real engine (issue 25): the README's first command on a
shared daemon, flags after the image, error messages without internals."""

from __future__ import annotations

import errno
import json
import secrets
import traceback

import pytest
import trio

import sbxkit.blocking
from sbxkit._consumers.session import SandboxExpired, open_sandbox
from sbxkit._model.spec import SandboxSpec
from sbxkit.errors import ArchiveError, SandboxFileNotFound
from tests.engine.cli_paths import CliPath
from tests.engine.helpers import container_exists, spec
from tests.engine.test_cli import SMALL
from tests.engine.test_cli import sbxkit as sbxkit_cli
from tests.witness import LEASE_LABEL, RUN_LABEL, THIS_RUN, Witness


def start_foreign_sandbox(witness: Witness, image: str) -> str:
    """A running container labelled as another user's sbxkit sandbox, made by the witness
    (this session's run label too, so a failure to remove it would still count as a leak)."""
    labels = {LEASE_LABEL: secrets.token_hex(16), RUN_LABEL: THIS_RUN or ""}
    response = witness.session.post(
        f"{witness.base}/containers/create",
        json={"Image": image, "Cmd": ["sleep", "300"], "Labels": labels},
        timeout=30,
    )
    response.raise_for_status()
    container_id: str = response.json()["Id"]
    started = witness.session.post(f"{witness.base}/containers/{container_id}/start", timeout=30)
    started.raise_for_status()
    return container_id


def test_the_demo_counts_only_the_sandboxes_it_created(witness: Witness, busybox: str) -> None:
    foreign = start_foreign_sandbox(witness, busybox)
    try:
        proc = sbxkit_cli("demo", "--socket", witness.socket_path)
        out = proc.stdout.decode()
        assert proc.returncode == 0, out + proc.stderr.decode()
        assert "containers this demo left behind: 0" in out
        assert "every limit held" in out
        assert container_exists(witness, foreign)  # left alone
    finally:
        witness.remove(foreign)


def test_flags_between_the_image_and_the_separator_are_flags(
    witness: Witness, busybox: str, cli_path: CliPath
) -> None:
    proc = sbxkit_cli(
        "run", *SMALL, "--socket", witness.socket_path, busybox, "--json", "--", "echo", "hi"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    doc = json.loads(proc.stdout)
    assert (doc["status"], doc["exit_code"], doc["stdout"]) == ("exited", 0, "hi\n")


# --- error messages without internals --------------------------------------------------------


@pytest.fixture(params=["busybox", "python_image"])
def shell_spec(request: pytest.FixtureRequest, runtime: str | None) -> SandboxSpec:
    """A session's spec in busybox (ash) and in the python image (dash), under ``runtime``."""
    return spec(request.getfixturevalue(request.param), "true", runtime=runtime)


async def test_a_missing_file_is_named_as_not_found(shell_spec: SandboxSpec) -> None:
    async with open_sandbox(shell_spec) as sandbox:
        await sandbox.put_files({"here.txt": b"x"})
        for missing in ("nope.txt", "no/such/dir/x.txt"):
            with pytest.raises(SandboxFileNotFound) as caught:
                await sandbox.get_files(["here.txt", missing])
            error = caught.value
            assert isinstance(error, FileNotFoundError)
            assert isinstance(error, ArchiveError)
            assert (error.filename, error.errno) == (missing, errno.ENOENT)
            assert str(error) == f"no such file in the sandbox: {missing!r} (/tmp/{missing})"
        assert await sandbox.get_files(["here.txt"]) == {"here.txt": b"x"}


async def test_a_missing_command_is_said_without_the_wrapper(shell_spec: SandboxSpec) -> None:
    async with open_sandbox(shell_spec) as sandbox:
        result = await sandbox.exec(["nonexistent-cmd", "arg"])
        assert (result.status, result.exit_code) == ("exited", 127)
        assert result.stderr == b"sbxkit: nonexistent-cmd: command not found\n"
        found = await sandbox.exec(["sh", "-c", "echo $0 ok"])
        assert found.stdout == b"sh ok\n"  # the command's own $0, not the wrapper's


def chain_of(error: BaseException) -> str:
    return "".join(traceback.format_exception(error))


async def test_an_expired_sandbox_is_not_chained_to_trio_cancelled(busybox: str) -> None:
    with pytest.raises(SandboxExpired) as caught:
        async with open_sandbox(spec(busybox, "true", timeout_s=1.0)):
            await trio.sleep(30)
    assert "Cancelled" not in chain_of(caught.value)


def test_an_expired_blocking_sandbox_is_not_chained_to_trio_cancelled(busybox: str) -> None:
    with (
        pytest.raises(SandboxExpired) as caught,
        sbxkit.blocking.open_sandbox(spec(busybox, "true", timeout_s=1.0)) as sandbox,
    ):
        sandbox.exec(["sleep", "10"])  # ends when the sandbox is removed at its time limit
    assert "Cancelled" not in chain_of(caught.value)
