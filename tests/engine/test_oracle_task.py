"""A Terminal-Bench-style task solved by a scripted oracle through the session API, the way a
harness drives it: the task's image is made here from the python image plus the task's files
(no Dockerfile: a container of it, its files put through the archive endpoint, committed);
the workspace runs it as root inside with its image writable under a disk bound; the "agent"
is a background shell fed across three calls, its output read by cursor; the verifier's files
go in as a whole directory, install a local ``.deb`` as root with ``apt-get`` and write the
reward, which comes out as a whole directory.

Under gVisor on the main daemon, and — marked ``userns`` — under plain runc on the userns
cell's remapping daemon (where the disk bound is the kernel's quota)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sbxkit._consumers.processes import Process
from sbxkit._consumers.session import open_sandbox
from sbxkit._model.runtimes import GVISOR_MIN_PIDS
from sbxkit._model.spec import MiB, SandboxSpec, Workspace
from sbxkit.engine.client import Engine
from tests.engine.helpers import delete_image, image_with_files, runtime_limits
from tests.engine.test_workspace_disk import build_deb
from tests.witness import Witness

TASK = {
    "app/README": b"Write the sum of the numbers in input.txt to answer.txt.\n",
    "app/input.txt": b"3\n4\n5\n",
    "solution/solve.sh": b"#!/bin/sh\nset -e\ncd /app\nawk '{s += $1} END {print s}' input.txt"
    b" > answer.txt\n",
}
TEST_SH = (
    "#!/bin/sh\nset -e\nmkdir -p /logs/verifier\n"
    "sbxkit-check /app/answer.txt 12 > /logs/verifier/check.txt\n"
    "echo 1 > /logs/verifier/reward.txt\n"
)


def task_image(witness: Witness, base: str) -> str:
    """``base`` plus the task's files, committed as an image of this test's own."""
    return image_with_files(witness, base, TASK, "sbxkit-test/task", executable=True)


def verifier_dir(where: Path) -> Path:
    """The task's tests: its script and the check program as a package to install."""
    tests = where / "tests"
    tests.mkdir()
    (tests / "test.sh").write_text(TEST_SH)
    (where / "deb").mkdir()
    (tests / "sbxkit-check.deb").write_bytes(build_deb(where / "deb", CHECK, "sbxkit-check"))
    return tests


CHECK = (
    '#!/bin/sh\n[ "$(cat "$1")" = "$2" ] && echo pass || { echo "fail: $(cat "$1")"; exit 1; }\n'
)


async def read_until(process: Process, cursor: int, needle: bytes) -> tuple[bytes, int]:
    """What the process printed from ``cursor`` up to and including ``needle``."""
    seen = b""
    for _ in range(200):
        chunk, cursor, done = await process.read(cursor, wait=0.1)
        seen += chunk
        if needle in seen or done:
            break
    assert needle in seen, seen
    return seen, cursor


async def solve_and_verify(
    engine: Engine, witness: Witness, python_image: str, where: Path, runtime: str | None
) -> None:
    image = task_image(witness, python_image)
    try:
        spec = SandboxSpec(
            image=image,
            command=["unused"],
            limits=runtime_limits(
                runtime, pids=GVISOR_MIN_PIDS, memory_bytes=512 * MiB, timeout_s=120.0
            ),
            runtime=runtime,
            workspace=Workspace(disk_bytes=512 * MiB),
        )
        async with open_sandbox(spec, engine=engine, files_root="/") as sandbox:
            agent = await sandbox.start(["sh"])
            await agent.write(b"cat /app/README\n")
            said, cursor = await read_until(agent, 0, b"answer.txt.")
            await agent.write(b"sh /solution/solve.sh && echo solved\n")
            solved, cursor = await read_until(agent, cursor, b"solved\n")
            await agent.write(b"cat /app/answer.txt; exit\n")
            answer, cursor = await read_until(agent, cursor, b"12\n")
            ended = await agent.wait(30)
            await sandbox.put_dir(verifier_dir(where), "/tests")
            verified = await sandbox.exec(
                [
                    "sh",
                    "-c",
                    "apt-get install -y /tests/sbxkit-check.deb </dev/null >/tmp/apt.txt 2>&1"
                    " && sh /tests/test.sh",
                ],
                timeout=120,
            )
            await sandbox.get_dir("/logs", where / "logs")
        assert said.startswith(b"Write the sum"), said
        assert (solved, answer) == (b"solved\n", b"12\n")
        assert (ended.status, ended.exit_code) == ("exited", 0), ended
        assert verified.ok, verified
        assert (where / "logs" / "verifier" / "check.txt").read_text() == "pass\n"
        assert (where / "logs" / "verifier" / "reward.txt").read_text() == "1\n"
        assert not witness.sbxkit_containers()
    finally:
        delete_image(witness, image)


async def test_an_oracle_solves_a_task_as_root_under_gvisor(
    engine: Engine, witness: Witness, python_image: str, tmp_path: Path
) -> None:
    await solve_and_verify(engine, witness, python_image, tmp_path, "gvisor")


@pytest.mark.userns
async def test_an_oracle_solves_a_task_as_root_under_userns_remap(
    engine: Engine, witness: Witness, python_image: str, tmp_path: Path
) -> None:
    await solve_and_verify(engine, witness, python_image, tmp_path, None)
