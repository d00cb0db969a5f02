"""A governed lease is not re-adopted after its supervisor dies (issue 22).

Its allow-list proxy was the dead supervisor's socket, bound in the sandbox's namespace: the
sandbox's egress stopped with it. The lease is not re-adopted — its caller fails as before
re-adoption existed (``CleanupError``, exit 74) — and the restarted supervisor removes its
container at once, without holding it for the grace period.
"""

from __future__ import annotations

import shutil

import pytest
import trio

import sbxkit
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.errors import CleanupError, SbxError
from sbxkit.network.terms import Network
from sbxkit.result import RunResult, Stream
from sbxkit.settings import Settings
from tests.network.servers import ALLOWED
from tests.supervision import private_state_dir, running_supervisor
from tests.witness import BUSYBOX, LEASE_LABEL, Witness


async def test_a_governed_lease_is_not_re_adopted_and_fails_as_before(
    engine: Engine, witness: Witness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")  # restarts are this test's
    state_dir = private_state_dir()
    backend = DockerBackend(
        engine=engine,
        settings=Settings(supervisor_state_dir=str(state_dir)),
        recover_at_open=False,
    )
    sandbox = sbxkit.SandboxSpec(
        image=BUSYBOX,
        command=["sh", "-c", "echo before; sleep 60"],
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=64 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=90
        ),
        network=Network(allow=[ALLOWED]),
    )
    running = trio.Event()
    outcome: list[RunResult | BaseException] = []

    def on_output(stream: Stream, chunk: bytes) -> None:
        running.set()

    async def governed_run() -> None:
        try:
            outcome.append(await backend.run_once(sandbox, on_output=on_output))
        except SbxError as exc:
            outcome.append(exc)

    with running_supervisor(state_dir, "--persistent") as first:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(governed_run)
            await running.wait()
            (record,) = state_dir.glob("*.lease")
            lease = record.stem
            first.kill()
            with running_supervisor(state_dir, "--persistent", "--adopt-grace", "30") as second:
                with trio.fail_after(20):  # removed at once, not after the 30 s grace
                    label = f"{LEASE_LABEL}={lease}"
                    while True:
                        if not (witness.containers(label=label) or record.exists()):
                            break
                        await trio.sleep(0.1)
    log = second.log()
    shutil.rmtree(state_dir.parent, ignore_errors=True)
    (error,) = outcome
    assert isinstance(error, CleanupError), repr(error)
    assert "a governed lease is not re-adopted" in str(error), str(error)
    assert f"lease {lease}: governed network, not held for re-adoption" in log, log
    assert "re-adopted by its caller" not in log
