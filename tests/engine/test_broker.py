"""The file grant broker against the real engine: snapshots in, receipts out, nothing replaced.

Each test gives the spec two configured bind mounts — a read-only and a writable directory —
which act only as ceilings; the payload sees the broker's snapshots and staging directory. What
the payload saw is printed from inside the sandbox; what was published is read back on the host
and hashed by the test itself; what the daemon did is checked through the independent witness.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from sbxkit._consumers.broker import GrantError, Grants, InputGrant, OutputGrant, run_with_grants
from sbxkit._model.mounts import BindMount
from sbxkit._model.settings import Settings
from sbxkit._model.spec import SandboxSpec
from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from tests.engine.helpers import container_exists, limits, text, unique, wait_until
from tests.witness import Witness

SETTINGS = Settings(enable_bind_mounts=True)
MARKER_LABEL = "sbxkit-tests.broker"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Host:
    """The operator's directories (the ceilings) and the broker's work directory."""

    ro: Path
    rw: Path
    work: Path

    def spec(self, image: str, script: str, *, label: str = "", **overrides: object) -> SandboxSpec:
        return SandboxSpec(
            image=image,
            command=["sh", "-c", script],
            limits=limits(**overrides),
            labels={MARKER_LABEL: label or unique()},
            mounts=[
                BindMount(source=str(self.ro), target="/data"),
                BindMount(source=str(self.rw), target="/results", read_only=False),
            ],
        )

    def assert_broker_cleaned_up(self) -> None:
        assert os.listdir(self.work) == []


@pytest.fixture
def host(tmp_path: Path) -> Host:
    h = Host(ro=tmp_path / "ro", rw=tmp_path / "rw", work=tmp_path / "work")
    for path in (h.ro, h.rw, h.work):
        path.mkdir()
    return h


async def test_an_input_is_a_read_only_snapshot(engine: Engine, busybox: str, host: Host) -> None:
    data = b"the operator's input\n" * 100
    source = host.ro / "data.txt"
    source.write_bytes(data)
    script = (
        "cat /in/data.txt; "
        "echo pwned > /in/data.txt; echo write=$? >&2; "
        "chmod 666 /in/data.txt; echo chmod=$? >&2; "
        "rm -f /in/data.txt; echo rm=$? >&2; "
        "cat /proc/self/mountinfo >&2; "
        "ls /data /results >&2; echo ceilings=$? >&2"
    )

    outcome = await run_with_grants(
        host.spec(busybox, script),
        Grants(inputs=[InputGrant(host_path=str(source), target="/in/data.txt")]),
        engine=engine,
        settings=SETTINGS,
        work_dir=str(host.work),
    )

    result = outcome.result
    assert result.status == "exited", result
    assert result.stdout == data  # readable
    stderr = text(result.stderr)
    for probe in ("write", "chmod", "rm"):
        assert f"{probe}=0" not in stderr, stderr
        assert f"{probe}=" in stderr, stderr
    assert "Read-only file system" in stderr
    assert source.read_bytes() == data
    [receipt] = outcome.inputs
    assert receipt.path == str(source)
    assert (receipt.bytes, receipt.sha256) == (len(data), sha256(data))
    # The configured mounts were ceilings only: neither reached the container.
    mountinfo = [line for line in stderr.splitlines() if " - " in line]
    assert any(" /in/data.txt " in line for line in mountinfo), mountinfo
    assert not any(str(host.ro) in line or str(host.rw) in line for line in mountinfo)
    assert "ceilings=0" not in stderr
    assert outcome.published  # no outputs: success is enough
    host.assert_broker_cleaned_up()


async def test_an_output_is_published_with_a_correct_receipt(
    engine: Engine, busybox: str, host: Host
) -> None:
    destination = host.rw / "nested" / "result.bin"
    destination.parent.mkdir()
    script = (
        "head -c 300000 /dev/urandom > /out/result && "
        "sha256sum /out/result && "
        "echo ignored > /out/not-granted"
    )

    outcome = await run_with_grants(
        host.spec(busybox, script),
        Grants(outputs=[OutputGrant(name="result", host_path=str(destination), max_bytes=300000)]),
        engine=engine,
        settings=SETTINGS,
        work_dir=str(host.work),
    )

    assert outcome.result.ok, outcome.result
    assert outcome.published
    published = destination.read_bytes()
    [receipt] = outcome.receipts
    assert receipt.path == str(destination)
    assert receipt.bytes == len(published) == 300000
    assert receipt.sha256 == hashlib.sha256(published).hexdigest()
    inside = text(outcome.result.stdout).split()[0]  # what the payload itself computed
    assert receipt.sha256 == inside
    assert os.listdir(destination.parent) == ["result.bin"]  # no temp leftovers
    assert os.listdir(host.rw) == ["nested"]  # only granted names are published
    host.assert_broker_cleaned_up()


async def test_an_existing_target_is_never_replaced(
    engine: Engine, busybox: str, host: Host, witness: Witness
) -> None:
    destination = host.rw / "result"
    destination.write_bytes(b"the operator's own file")
    before = destination.stat()

    with pytest.raises(GrantError, match="already exists; sbxkit never replaces") as caught:
        await run_with_grants(
            host.spec(busybox, "echo payload > /out/result"),
            Grants(outputs=[OutputGrant(name="result", host_path=str(destination), max_bytes=99)]),
            engine=engine,
            settings=SETTINGS,
            work_dir=str(host.work),
        )

    assert destination.read_bytes() == b"the operator's own file"
    after = destination.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert os.listdir(host.rw) == ["result"]
    assert caught.value.published == []
    result = caught.value.result
    assert result is not None
    assert result.ok
    assert wait_until(lambda: not container_exists(witness, result.container_id), 10.0)
    host.assert_broker_cleaned_up()


async def test_an_output_replaced_by_a_symlink_is_refused(
    engine: Engine, busybox: str, host: Host
) -> None:
    destination = host.rw / "result"
    script = "echo real > /out/other; ln -s /etc/passwd /out/result && ls -l /out/result"

    with pytest.raises(GrantError, match="'result' is a symbolic link") as caught:
        await run_with_grants(
            host.spec(busybox, script),
            Grants(
                outputs=[
                    OutputGrant(name="other", host_path=str(host.rw / "other"), max_bytes=99),
                    OutputGrant(name="result", host_path=str(destination), max_bytes=99999),
                ]
            ),
            engine=engine,
            settings=SETTINGS,
            work_dir=str(host.work),
        )

    result = caught.value.result
    assert result is not None
    assert result.ok, result
    assert "-> /etc/passwd" in text(result.stdout)  # the payload really planted the link
    assert os.listdir(host.rw) == []  # neither output: checks come before any publication
    host.assert_broker_cleaned_up()


async def test_an_output_hard_linked_inside_the_sandbox_is_refused(
    engine: Engine, busybox: str, host: Host
) -> None:
    script = "echo x > /out/a && ln /out/a /out/result && stat -c %h /out/result"

    with pytest.raises(GrantError, match="2 hard links"):
        await run_with_grants(
            host.spec(busybox, script),
            Grants(outputs=[OutputGrant(name="result", host_path=str(host.rw / "r"), max_bytes=9)]),
            engine=engine,
            settings=SETTINGS,
            work_dir=str(host.work),
        )

    assert os.listdir(host.rw) == []
    host.assert_broker_cleaned_up()


async def test_a_failing_payload_publishes_nothing(
    engine: Engine, busybox: str, host: Host
) -> None:
    destination = host.rw / "result"

    outcome = await run_with_grants(
        host.spec(busybox, "echo complete > /out/result; exit 1"),
        Grants(outputs=[OutputGrant(name="result", host_path=str(destination), max_bytes=99)]),
        engine=engine,
        settings=SETTINGS,
        work_dir=str(host.work),
    )

    assert (outcome.result.status, outcome.result.exit_code) == ("exited", 1)
    assert not outcome.published
    assert outcome.receipts == []
    assert os.listdir(host.rw) == []
    host.assert_broker_cleaned_up()


async def test_the_success_criterion_is_a_parameter(
    engine: Engine, busybox: str, host: Host
) -> None:
    destination = host.rw / "result"

    outcome = await run_with_grants(
        host.spec(busybox, "echo partial > /out/result; exit 3"),
        Grants(outputs=[OutputGrant(name="result", host_path=str(destination), max_bytes=99)]),
        engine=engine,
        settings=SETTINGS,
        work_dir=str(host.work),
        success=lambda r: r.status == "exited" and r.exit_code in (0, 3),
    )

    assert outcome.published
    assert destination.read_bytes() == b"partial\n"


async def test_grants_tighten_the_file_size_limit(engine: Engine, busybox: str, host: Host) -> None:
    # The largest output may be 4096 bytes, so no file may grow past that — not even in /tmp.
    script = (
        "dd if=/dev/zero of=/tmp/big bs=1024 count=8 2>/dev/null; echo tmp=$?; "
        "wc -c < /tmp/big; "
        "dd if=/dev/zero of=/out/result bs=1024 count=4 2>/dev/null; echo exact=$?"
    )

    outcome = await run_with_grants(
        host.spec(busybox, script),
        Grants(outputs=[OutputGrant(name="result", host_path=str(host.rw / "r"), max_bytes=4096)]),
        engine=engine,
        settings=SETTINGS,
        work_dir=str(host.work),
    )

    stdout = text(outcome.result.stdout).split()
    assert "tmp=0" not in stdout, stdout
    assert "4096" in stdout, stdout  # cut at the tightened limit
    assert "exact=0" in stdout, stdout
    assert outcome.published
    assert outcome.receipts[0].bytes == 4096


async def test_a_grant_outside_the_ceilings_creates_no_container(
    engine: Engine, busybox: str, host: Host, witness: Witness, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"not granted")
    marker = unique("broker-refused")
    since = time.time() - 1

    with pytest.raises(SpecError, match="outside every configured bind mount") as caught:
        await run_with_grants(
            host.spec(busybox, "cat /in/x", label=marker),
            Grants(inputs=[InputGrant(host_path=str(outside), target="/in/x")]),
            engine=engine,
            settings=SETTINGS,
            work_dir=str(host.work),
        )

    assert caught.value.field == "grants.inputs[0].host_path"
    events = witness.events(
        since, time.time() + 0.5, type=["container"], label=[f"{MARKER_LABEL}={marker}"]
    )
    assert events == []
    host.assert_broker_cleaned_up()


async def test_a_control_run_with_the_same_label_is_seen_by_the_witness(
    engine: Engine, busybox: str, host: Host, witness: Witness
) -> None:
    """Positive control for the test above: the label filter does see our creates."""
    marker = unique("broker-control")
    since = time.time() - 1

    await run_with_grants(
        host.spec(busybox, "true", label=marker),
        Grants(),
        engine=engine,
        settings=SETTINGS,
        work_dir=str(host.work),
    )

    events = witness.events(
        since, time.time() + 0.5, type=["container"], label=[f"{MARKER_LABEL}={marker}"]
    )
    assert "create" in [e.get("Action") for e in events]


async def test_cancellation_publishes_nothing_and_cleans_up(
    engine: Engine, busybox: str, host: Host
) -> None:
    source = host.ro / "in"
    source.write_bytes(b"input")
    script = "cat /in/x > /out/result && touch /out/started && sleep 30"
    started = False

    async def cancel_once_staged(scope: trio.CancelScope) -> None:
        nonlocal started
        while True:  # polling the host filesystem: there is no event to wait on
            if list(host.work.glob("*/out/started")):
                break
            await trio.sleep(0.05)
        started = True  # the payload ran and staged its output
        scope.cancel()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_staged, nursery.cancel_scope)
            await run_with_grants(
                host.spec(busybox, script),
                Grants(
                    inputs=[InputGrant(host_path=str(source), target="/in/x")],
                    outputs=[
                        OutputGrant(name="result", host_path=str(host.rw / "r"), max_bytes=99)
                    ],
                ),
                engine=engine,
                settings=SETTINGS,
                work_dir=str(host.work),
            )
            pytest.fail("the run finished although it was cancelled")

    assert started
    assert os.listdir(host.rw) == []
    host.assert_broker_cleaned_up()
