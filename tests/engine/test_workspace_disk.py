"""A workspace's writable image (``Workspace.disk_bytes``) on a real daemon: the bound holds —
by the kernel's quota where the daemon's storage has one (btrfs: the userns cell), else by the
supervisor's watch of the daemon's ``SizeRw`` (overlay2: the main daemon), which ends the run
``disk_exceeded`` with that figure as its evidence — and root inside installs a local ``.deb``
(built here with ``dpkg-deb``) with ``apt-get``, then runs what it installed. Every test proves
zero leftover containers through the independent witness."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sbxkit._consumers.oneshot import run
from sbxkit._consumers.session import open_sandbox
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._model.runtimes import GVISOR_MIN_PIDS
from sbxkit._model.spec import MiB, SandboxSpec, Workspace
from sbxkit.engine.client import Engine
from sbxkit.errors import SandboxUnusable, SpecError
from tests.engine.helpers import runtime_limits, text
from tests.witness import Witness

HELLO = "#!/bin/sh\necho hello from a deb\n"


def writable(
    image: str, script: str, *, disk: int, runtime: str | None = None, root: bool = False
) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["sh", "-c", script],
        limits=runtime_limits(
            runtime, pids=GVISOR_MIN_PIDS, memory_bytes=512 * MiB, fsize_bytes=256 * MiB
        ),
        runtime=runtime,
        workspace=Workspace(root=root, disk_bytes=disk, exec_tmp=root),
    )


def quota_driver(witness: Witness) -> bool:
    """The daemon's storage holds the bound itself (sbxkit._plan.preflight.QUOTA_DRIVERS)."""
    return bool(witness.get("/info")["Driver"] == "btrfs")


def build_deb(where: Path, script: str = HELLO, name: str = "sbxkit-hello") -> bytes:
    """A package with no dependencies that installs one script, ``/usr/local/bin/NAME``, as
    ``dpkg-deb`` builds it."""
    root = where / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: sbxkit tests <tests@sbxkit.invalid>\nDescription: installed by a test\n"
    )
    program = root / "usr" / "local" / "bin" / name
    program.parent.mkdir(parents=True)
    program.write_text(script)
    program.chmod(0o755)
    out = where / f"{name}.deb"
    subprocess.run(
        ["dpkg-deb", "--build", "--root-owner-group", str(root), str(out)],
        check=True,
        capture_output=True,
    )
    return out.read_bytes()


async def test_writing_past_the_bound_is_stopped_by_the_supervisor_or_the_kernel(
    engine: Engine, witness: Witness, python_image: str
) -> None:
    """A sandbox of its own uid writes 48 MiB to the image's world-writable ``/var/tmp`` under
    a 16 MiB bound, then waits. Watched: the supervisor measures ``SizeRw`` past the bound and
    ends it, ``disk_exceeded``, well before its sleep ends. Under a quota: the write fails."""
    script = "dd if=/dev/zero of=/var/tmp/big bs=1M count=48; echo dd=$?; sleep 5; echo woke"
    result = await run(writable(python_image, script, disk=16 * MiB), engine=engine)
    if quota_driver(witness):
        assert result.status == "exited", result
        assert "Disk quota exceeded" in text(result.stderr), result
        assert "dd=1" in text(result.stdout)
    else:
        assert result.status == "disk_exceeded", result
        assert result.exit_code is None
        assert result.kill_evidence is not None
        assert "SizeRw" in result.kill_evidence
        written = int(result.kill_evidence.split(" held ")[1].split()[0])
        assert written > 16 * MiB
        assert "woke" not in text(result.stdout)
        assert result.timings.run_s < 10, result.timings
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


async def test_writing_within_the_bound_runs_to_its_end(
    engine: Engine, witness: Witness, python_image: str
) -> None:
    script = "dd if=/dev/zero of=/var/tmp/f bs=1M count=4 2>/dev/null; sleep 1.5; wc -c </var/tmp/f"
    result = await run(writable(python_image, script, disk=16 * MiB), engine=engine)
    assert result.ok, result
    assert text(result.stdout).strip() == str(4 * MiB)
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


async def test_a_session_past_its_bound_ends_and_says_so(
    engine: Engine, witness: Witness, python_image: str
) -> None:
    spec = writable(python_image, "unused", disk=16 * MiB)
    async with open_sandbox(spec, engine=engine) as sandbox:
        fits = await sandbox.exec(["sh", "-c", "echo kept > /var/tmp/note && cat /var/tmp/note"])
        assert text(fits.stdout) == "kept\n"
        past = await sandbox.exec(
            ["sh", "-c", "dd if=/dev/zero of=/var/tmp/big bs=1M count=48; sleep 5"]
        )
        if quota_driver(witness):
            assert past.status == "exited"
            assert "Disk quota exceeded" in text(past.stderr)
        else:
            assert past.status == "disk_exceeded", past
            assert past.kill_evidence is not None
            assert "SizeRw" in past.kill_evidence
            with pytest.raises(SandboxUnusable) as caught:
                await sandbox.exec(["true"])
            assert "past the workspace's bound" in str(caught.value)
    assert not witness.sbxkit_containers()


async def test_an_in_process_owner_refuses_a_watched_bound_before_any_create(
    engine: Engine, witness: Witness, python_image: str
) -> None:
    """It has no life of its own to watch with; where the kernel's quota holds the bound,
    there is nothing to watch and it runs."""
    spec = writable(python_image, "echo ran", disk=16 * MiB)
    owner = InProcessOwner(engine)
    if quota_driver(witness):
        assert (await run(spec, engine=engine, owner=owner)).stdout == b"ran\n"
    else:
        with pytest.raises(SpecError) as caught:
            await run(spec, engine=engine, owner=owner)
        assert caught.value.field == "workspace.disk_bytes"
        assert "supervisor" in caught.value.rule
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


async def test_root_inside_installs_a_local_deb_with_apt_and_runs_it_under_gvisor(
    engine: Engine, witness: Witness, python_image: str, tmp_path: Path
) -> None:
    """The verifier's step of a Terminal-Bench-style task: ``apt-get install`` of a local
    package as root, on the image's own filesystem, then the installed program (a script under
    ``/usr/local/bin``) and one written to the exec scratch."""
    await install_and_run(engine, witness, python_image, tmp_path, "gvisor")


async def install_and_run(
    engine: Engine, witness: Witness, image: str, where: Path, runtime: str | None
) -> None:
    deb = build_deb(where)
    spec = writable(image, "unused", disk=512 * MiB, runtime=runtime, root=True)
    async with open_sandbox(spec, engine=engine) as sandbox:
        await sandbox.put_files({"sbxkit-hello.deb": deb})
        installed = await sandbox.exec(
            ["sh", "-c", "apt-get install -y /tmp/sbxkit-hello.deb </dev/null && sbxkit-hello"],
            timeout=120,
        )
        status = await sandbox.exec(["dpkg-query", "-W", "-f", "${Status}", "sbxkit-hello"])
        scratch = await sandbox.exec(
            ["sh", "-c", "printf '#!/bin/sh\\necho ran\\n' > /tmp/x && chmod +x /tmp/x && /tmp/x"]
        )
    assert installed.ok, installed
    assert text(installed.stdout).endswith("hello from a deb\n"), installed
    assert text(status.stdout) == "install ok installed"
    assert text(scratch.stdout) == "ran\n", scratch
    assert not witness.sbxkit_containers()
