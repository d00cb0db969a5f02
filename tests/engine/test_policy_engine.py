"""Policy on the real engine: runtimes, GPUs, extra flags, SBXKIT_ENV and environment ownership.

What the daemon did is observed through the independent witness, never through sbxkit's client:

* "created nothing" is proved with daemon events filtered by the lease label AND a per-test
  marker label, so concurrent tests cannot blur it; each refusal is followed by a positive
  control — the same spec made acceptable, with the same marker — whose create the same filter
  must see, so an empty answer cannot come from a filter that matches nothing.
* what a container looked like is read by the witness, either right after create (a
  ``WitnessingOwner`` wraps the real supervisor owner and inspects the created id before the
  runner starts it) or while the payload sleeps.

The daemons here (Docker 20.10 and 26.1) have no CDI support and run with ``--bridge=none``, so GPU
and bridge requests are checked for refusal here; their bodies are covered by unit tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._lifecycle.owner import CreateRequest
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.gpu import GpuRequest
from sbxkit._model.result import RunResult
from sbxkit._model.spec import SandboxSpec
from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from tests.engine.helpers import ForwardingOwner, spec, text, unique, wait_until
from tests.engine.oneshot_paths import OneShot
from tests.engine.runtimes import planned_default_runtime
from tests.witness import LEASE_LABEL, Witness

MARKER = "sbxkit-test.policy"
"""A user label every spec here carries, unique per test, to filter the daemon's events."""


def marked(base: SandboxSpec, marker: str, **changes: Any) -> SandboxSpec:
    labels = {**base.labels, MARKER: marker}
    return msgspec.structs.replace(base, labels=labels, **changes)


def creates(witness: Witness, since: float, marker: str) -> list[dict[str, Any]]:
    """Container create events since ``since`` for sbxkit containers carrying ``marker``."""
    events = witness.events(
        since,
        time.time(),
        type=["container"],
        label=[LEASE_LABEL, f"{MARKER}={marker}"],
    )
    return [e for e in events if (e.get("Action") or e.get("status")) == "create"]


async def assert_refused_then_control_runs(
    engine: Engine,
    witness: Witness,
    refused_spec: SandboxSpec,
    control_spec: SandboxSpec,
    marker: str,
) -> SpecError:
    """The refused spec raises SpecError and creates nothing; the control, same marker, is
    seen by the same event filter — exactly once, with its own lease."""
    since = time.time() - 1.0  # events carry the daemon's clock (same host); allow slack
    with pytest.raises(SpecError) as info:
        await run(refused_spec, engine=engine)
    assert creates(witness, since, marker) == []
    control = await run(control_spec, engine=engine)
    assert control.ok, control
    seen = creates(witness, since, marker)
    assert len(seen) == 1, seen
    assert seen[0]["Actor"]["Attributes"][LEASE_LABEL] == control.lease
    return info.value


class WitnessingOwner(ForwardingOwner):
    """The real supervisor owner, plus an independent inspect of each created container before
    the runner starts it (the id the runner will start, as the daemon recorded it)."""

    def __init__(self, engine: Engine, witness: Witness) -> None:
        super().__init__(SupervisedOwner(engine))
        self._witness = witness
        self.inspected: list[dict[str, Any]] = []

    async def create(self, request: CreateRequest) -> str:
        container_id = await self._inner.create(request)
        info = await trio.to_thread.run_sync(self._witness.get, f"/containers/{container_id}/json")
        self.inspected.append(info)
        return container_id


def _poll_running(witness: Witness, marker: str, seconds: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for container in witness.containers(label=f"{MARKER}={marker}"):
            if container.get("State") == "running":
                info: dict[str, Any] = witness.get(f"/containers/{container['Id']}/json")
                if info["State"]["Running"]:
                    return info
        time.sleep(0.02)
    return None


async def run_and_watch(
    engine: Engine, witness: Witness, sandbox: SandboxSpec, marker: str
) -> tuple[RunResult, dict[str, Any] | None]:
    """Run ``sandbox`` while the witness inspects it once it is running."""
    seen: dict[str, dict[str, Any] | None] = {}
    result: RunResult | None = None
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            seen["info"] = await trio.to_thread.run_sync(_poll_running, witness, marker, 15.0)

        nursery.start_soon(watch)
        result = await run(sandbox, engine=engine)
    assert result is not None
    return result, seen.get("info")


# --- runtimes ------------------------------------------------------------------------------------

IN_PROCESS_PATHS = ["cold", "pooled", "cold-daemon", "pooled-daemon"]


# An in-process owner witnesses the create; a held pool lives in the supervisor.
@pytest.mark.parametrize("oneshot", IN_PROCESS_PATHS, indirect=True)
async def test_default_runs_name_no_runtime_and_get_the_planned_default(
    oneshot: OneShot, engine: Engine, witness: Witness, busybox: str
) -> None:
    """A spec that names no runtime runs under crun on this daemon (runc its default, crun
    registered: ``plan_runtime``), as the daemon's inspect of the created container says."""
    owner = WitnessingOwner(engine, witness)
    result = await oneshot(marked(spec(busybox, "echo ok"), unique()), engine=engine, owner=owner)
    assert result.ok, result
    assert text(result.stdout) == "ok\n"
    [info] = owner.inspected
    assert witness.get("/info")["DefaultRuntime"] == "runc"
    assert info["HostConfig"]["Runtime"] == planned_default_runtime(witness) == "crun"


# An in-process owner witnesses the create; a held pool lives in the supervisor.
@pytest.mark.parametrize("oneshot", IN_PROCESS_PATHS, indirect=True)
async def test_a_named_registered_runtime_is_used(
    oneshot: OneShot, engine: Engine, witness: Witness, busybox: str
) -> None:
    owner = WitnessingOwner(engine, witness)
    sandbox = marked(spec(busybox, "echo ok"), unique(), runtime="runc")
    result = await oneshot(sandbox, engine=engine, owner=owner)
    assert result.ok, result
    assert [i["HostConfig"]["Runtime"] for i in owner.inspected] == ["runc"]


# An in-process owner witnesses the create; a held pool lives in the supervisor.
@pytest.mark.parametrize("oneshot", IN_PROCESS_PATHS, indirect=True)
async def test_crun_is_selected_and_the_sandbox_runs_under_it(
    oneshot: OneShot, engine: Engine, witness: Witness, busybox: str
) -> None:
    """``runtime="crun"`` reaches the daemon and the payload runs under it: the created
    container's HostConfig.Runtime is crun (witness inspect of the very id the runner starts).

    crun 1.8 refuses hybrid cgroup hosts whose v2 hierarchy holds a controller; scripts/engine-up
    moves such a controller (hugetlb on this machine kind) to a v1 mount, so this must pass.
    """
    assert "crun" in witness.get("/info")["Runtimes"]
    owner = WitnessingOwner(engine, witness)
    sandbox = marked(spec(busybox, "echo under-crun"), unique(), runtime="crun")
    outcome = await oneshot(sandbox, engine=engine, owner=owner)
    assert outcome.ok, outcome
    assert text(outcome.stdout) == "under-crun\n"
    assert [i["HostConfig"]["Runtime"] for i in owner.inspected] == ["crun"]
    lease = owner.inspected[0]["Config"]["Labels"][LEASE_LABEL]
    # Removed by its owner, at once or right after the payload's exit (the kernel path).
    assert wait_until(lambda: not witness.containers(label=f"{LEASE_LABEL}={lease}"), 10.0)


async def test_gvisor_means_the_registered_runsc(
    oneshot: OneShot, engine: Engine, busybox: str
) -> None:
    """gvisor is the daemon runtime ``runsc`` (registered by scripts/engine-up): the payload
    sees gVisor's kernel, not the host's."""
    result = await oneshot(spec(busybox, "cat /proc/version", runtime="gvisor"), engine=engine)

    assert result.ok, result
    assert result.stdout != await trio.Path("/proc/version").read_bytes()


async def test_an_unknown_runtime_creates_nothing(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    marker = unique()
    error = await assert_refused_then_control_runs(
        engine,
        witness,
        marked(spec(busybox, "true"), marker, runtime="no-such-runtime"),
        marked(spec(busybox, "true"), marker, runtime="runc"),
        marker,
    )
    assert error.field == "runtime"
    assert error.rule.startswith("'no-such-runtime' is not registered in the daemon; registered:")


# --- GPUs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "gpus",
    [GpuRequest(count=1), GpuRequest(devices=["nvidia.com/gpu=0"])],
    ids=["count", "devices"],
)
@pytest.mark.engine_cell
async def test_a_gpu_request_is_refused_on_a_daemon_without_cdi(
    engine: Engine, witness: Witness, busybox: str, gpus: GpuRequest
) -> None:
    info = witness.get("/info")
    assert not info.get("CDISpecDirs")
    assert info.get("DiscoveredDevices") is None
    marker = unique()
    error = await assert_refused_then_control_runs(
        engine,
        witness,
        marked(spec(busybox, "true"), marker, gpus=gpus),
        marked(spec(busybox, "true"), marker),
        marker,
    )
    assert error.field == "gpus"
    assert "has no CDI support" in error.rule


# --- refusals that never reach the daemon --------------------------------------------------------


REFUSALS: list[tuple[str, dict[str, Any], str, str]] = [
    ("privileged-flag", {"extra_flags": ["--privileged"]}, "extra_flags[0]", "--privileged"),
    (
        "runtime-flag",
        {"extra_flags": ["--label=a=b", "--runtime=runc"]},
        "extra_flags[1]",
        "the runtime is selected with runtime",
    ),
    ("host-net-flag", {"extra_flags": ["--network=host"]}, "extra_flags[0]", "--network"),
    (
        "lease-label-flag",
        {"extra_flags": [f"--label={LEASE_LABEL}=x"]},
        "extra_flags[0]",
        "reserved",
    ),
    ("env-key-equals", {"env": {"A=B": "x"}}, "env['A=B']", "'='"),
    ("env-key-newline", {"env": {"A\nB": "x"}}, "env['A\\nB']", "whitespace"),
    ("env-key-hash", {"env": {"#A": "x"}}, "env['#A']", "'#'"),
    ("env-too-big", {"env": {"BIG": "x" * (128 * 1024)}}, "env", "the limit is 131072"),
    ("host-network", {"network": "host"}, "network", "host networking is refused"),
]


@pytest.mark.parametrize(
    ("change", "field", "rule_part"),
    [r[1:] for r in REFUSALS],
    ids=[r[0] for r in REFUSALS],
)
async def test_refused_specs_create_no_container(
    engine: Engine,
    witness: Witness,
    busybox: str,
    change: dict[str, Any],
    field: str,
    rule_part: str,
) -> None:
    marker = unique()
    error = await assert_refused_then_control_runs(
        engine,
        witness,
        marked(spec(busybox, "true"), marker, **change),
        marked(spec(busybox, "true"), marker),
        marker,
    )
    assert error.field == field
    assert rule_part in error.rule


@pytest.mark.parametrize("value", [b"production", b" Prod ", b"prodution", b"\xffprod"])
async def test_bridge_is_refused_in_production_and_for_bad_sbxkit_env_values(
    engine: Engine,
    witness: Witness,
    busybox: str,
    monkeypatch: pytest.MonkeyPatch,
    value: bytes,
) -> None:
    """Bridge cannot be created on this daemon (``--bridge=none``), so only its refusal is
    exercised here; the control run uses the default network under the same SBXKIT_ENV."""
    monkeypatch.setitem(os.environb, b"SBXKIT_ENV", value)
    marker = unique()
    error = await assert_refused_then_control_runs(
        engine,
        witness,
        marked(spec(busybox, "true"), marker, network="bridge"),
        marked(spec(busybox, "true"), marker),
        marker,
    )
    if value.strip().lower() == b"prod" or value == b"production":
        assert error.field == "network"
        assert error.rule.startswith("bridge networking is refused in production")
    else:
        assert error.field == "SBXKIT_ENV"


# --- what an accepted spec puts on the container -------------------------------------------------


async def test_label_flags_land_on_the_container_and_the_runtime_owns_the_lease_env(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    marker = unique()
    sandbox = marked(
        spec(
            busybox,
            'echo "$SBXKIT_LEASE"; echo "$SBXKIT_SANDBOX"; echo "$MINE"; sleep 1',
            env={"SBXKIT_LEASE": "evil", "SBXKIT_SANDBOX": "0", "MINE": "kept"},
        ),
        marker,
        extra_flags=["--label=team=x"],
    )
    result, info = await run_and_watch(engine, witness, sandbox, marker)
    assert result.ok, result
    # Inside the payload: the lease is the run's, whatever the user asked for.
    assert text(result.stdout).splitlines() == [result.lease, "1", "kept"]
    # On the running container, as the daemon reports it.
    assert info is not None, "the witness never saw the container running"
    assert info["Id"] == result.container_id
    labels = info["Config"]["Labels"]
    assert labels["team"] == "x"
    assert labels[LEASE_LABEL] == result.lease
    assert labels[MARKER] == marker
    env = info["Config"]["Env"]
    assert f"SBXKIT_LEASE={result.lease}" in env
    assert "SBXKIT_LEASE=evil" not in env
    assert "SBXKIT_SANDBOX=1" in env


# --- a profile through the real command line -----------------------------------------------------


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.1)
    return False


def test_cli_profile_supplies_image_env_labels_and_its_own_supervisor(
    witness: Witness, busybox: str, tmp_path: Path
) -> None:
    """``sbxkit run --profile FILE -- CMD``: the profile's image, env, labels and limits apply,
    CLI flags override them, and ``[sandbox.docker.supervisor]`` decides which helper binary the
    client launches and where its state lives (a private dir, so a new helper must start)."""
    launched = tmp_path / "launched"
    wrapper = tmp_path / "supervisor wrapper.sh"  # a space: the path must survive quoting
    wrapper.write_text(
        "#!/bin/sh\n"
        f'echo "$$" > "{launched}"\n'
        f'exec "{sys.executable}" -m sbxkit.supervisor --idle-exit 1 "$@"\n'
    )
    wrapper.chmod(0o700)
    state_dir = tmp_path / "leases"
    marker = unique()
    profile = tmp_path / "profile.toml"
    profile.write_text(
        f"""
[sandbox.docker]
image = "{busybox}"
extra_flags = ["--label={MARKER}={marker}"]

[sandbox.docker.env]
FROM_PROFILE = "p"
OVERRIDDEN = "profile"
SBXKIT_LEASE = "evil"

[sandbox.docker.limits]
cpus = 0.5
memory = "64m"
pids = 64
timeout = 20

[sandbox.docker.supervisor]
binary = "{wrapper}"
state_dir = "{state_dir}"
"""
    )
    since = time.time() - 1.0
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sbxkit",
            "run",
            "--json",
            "--socket",
            witness.socket_path,
            "--profile",
            str(profile),
            "--env",
            "OVERRIDDEN=cli",
            "--",
            "sh",
            "-c",
            'echo "$FROM_PROFILE $OVERRIDDEN $SBXKIT_SANDBOX $SBXKIT_LEASE"',
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    doc = json.loads(proc.stdout)
    assert doc["stdout"] == f"p cli 1 {doc['lease']}\n"
    seen = creates(witness, since, marker)
    assert [e["Actor"]["Attributes"][LEASE_LABEL] for e in seen] == [doc["lease"]]
    # The profile's helper was the one launched, on the profile's state dir.
    pid = int(launched.read_text())
    assert (state_dir / "supervisor.log").exists()
    assert _gone(pid, 20.0), "the profile's supervisor did not exit when idle"
