"""Benchmark ``oneshot``: the median one-shot ``true`` run, sbxkit against the floor and its peers.

Contenders, interleaved round-robin in one trio program (see README.md for the method):

``sbxkit``
    ``await sbxkit._consumers.runner.run(spec, engine=engine)`` on one engine opened up front, as a
    long-lived application would hold it, with the runner's default owner (the supervisor).
    The full hardened lifecycle (docs/architecture.md).
``sbxkit_inproc``
    The same with ``owner=InProcessOwner(engine)``: no supervisor.
``raw``
    The floor the daemon sets: the fewest Engine API calls a correct one-shot runner needs
    (create, start, wait, delete), standard library only, one keep-alive connection, run in a
    worker thread (``trio.to_thread.run_sync``).
``docker_py``
    docker-py's create → start → wait → remove(force, v) on one shared ``DockerClient``, in a
    worker thread; the floor's limits and network settings.
``aiodocker``
    The same through aiodocker, on a persistent asyncio loop in its own thread.
``epicbox``
    ``epicbox.run("bb", "true", limits=...)`` in a worker thread (its own docker-py client).
``docker_run``
    ``docker run --rm --network none IMAGE true`` as a subprocess (``trio.run_process``).
``sbxkit_crun``, ``raw_crun``
    ``sbxkit`` and ``raw`` with the OCI runtime ``crun`` instead of the daemon's default.

Targets (the issue): sbxkit ≤ 1.10 × the raw floor and ≤ 0.9 × docker-py, as ratios of medians
from one run. A missed target is reported, not fatal; a failing contender or a leaked container
is (exit status 1). A peer that cannot run here at all (its library missing or incompatible, a
runtime not registered) is reported as an errored contender and left out of the rounds.

``--profile`` says where sbxkit's time goes. It adds ``raw_hardened`` (the raw sequence with
sbxkit's exact create body) and ``raw_netns`` (the raw body without ``NetworkDisabled``), times
every engine and owner call the two sbxkit contenders make, and times the supervisor journal's
fsync pattern on its filesystem. It writes ``oneshot-profile.{json,md}``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import secrets
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import trio

from bench import common
from bench.harness import (
    RESULTS_DIR,
    Contender,
    ContenderFailed,
    StepTimings,
    fmt_ms,
    machine_facts,
    ratio_of_medians,
    run_interleaved,
    say,
    summarise_ms,
    write_atomically,
    write_json,
)
from bench.rawapi import EventWatch, RawEngine
from bench.suite import (
    AsyncioThread,
    aiodocker_client,
    aiodocker_one_shot,
    dockerpy_client,
    dockerpy_one_shot,
    peer_body,
)
from bench.tracing import CallTracer, public_async_methods
from sbxkit._consumers.runner import run as sbxkit_run
from sbxkit._lifecycle.owner import InProcessOwner, Owner
from sbxkit._lifecycle.supervised import SupervisedOwner
from sbxkit._model.spec import LEASE_LABEL, Limits, MiB, SandboxSpec
from sbxkit._plan.policy import build_create_body
from sbxkit._protocol.journal import default_state_dir
from sbxkit.engine.client import Engine, open_engine

NAME = "oneshot"
SUMMARY = (
    "median one-shot `true`: sbxkit vs the raw Engine API floor, docker-py, aiodocker, "
    "epicbox and `docker run --rm`; runc vs crun"
)

TARGET_RATIO = 1.10
"""sbxkit / raw floor, ratio of medians (the issue's target)."""
TARGETS = {"sbxkit/raw": TARGET_RATIO, "sbxkit/docker_py": 0.90}
"""Every target the issue sets: ratio of medians → the most it may be."""

CRUN = "crun"
EPICBOX_PREFIX = "epicbox-"
"""epicbox names its containers ``epicbox-<uuid4>`` and labels nothing."""

DEFAULT_ROUNDS = 20
QUICK_ROUNDS = 5
DEFAULT_WARMUP = 3
QUICK_WARMUP = 1
DEFAULT_ORDER = (
    "sbxkit",
    "sbxkit_inproc",
    "raw",
    "docker_py",
    "aiodocker",
    "epicbox",
    "docker_run",
    "sbxkit_crun",
    "raw_crun",
)

BENCH_LABEL = "sbxkit.bench"
"""Marks every container this benchmark asks for (value: the contender)."""
RAW_PREFIX = "sbxbench-raw-"

CPUS = 1.0
MEMORY_BYTES = 64 * MiB
PIDS = 64
OUTPUT_BYTES = 1 * MiB
TIMEOUT_S = 30.0


def default_socket() -> str:
    explicit = os.environ.get("SBXKIT_TEST_SOCKET")
    if explicit:
        return explicit
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else "/var/run/docker.sock"


def default_image() -> str:
    return os.environ.get("SBXKIT_TEST_BUSYBOX_IMAGE", "sbxkit-test/busybox:latest")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"measured rounds (default {DEFAULT_ROUNDS})"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help=f"discarded rounds (default {DEFAULT_WARMUP})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_ROUNDS} rounds, {QUICK_WARMUP} warm-up (a smoke run, not a figure)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="add the raw_hardened and raw_netns contenders and time each "
        "engine and owner call sbxkit makes (writes oneshot-profile.*)",
    )
    parser.add_argument(
        "--order",
        default=None,
        help="comma-separated contender keys, e.g. raw,sbxkit,docker_run (default: "
        + ",".join(DEFAULT_ORDER)
        + ", then the profile contenders)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="supervisor state directory for this run (sets SBXKIT_STATE_DIR); use a private "
        "one when another sbxkit version's supervisor holds the default",
    )
    parser.add_argument("--socket", default=default_socket(), help="daemon socket")
    parser.add_argument("--image", default=default_image(), help="busybox image (local)")
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help="directory for oneshot.json / oneshot.md ('-' to write nothing)",
    )


# --- the workload ------------------------------------------------------------------------------


def sbxkit_spec(image: str, *, label: str = "sbxkit", runtime: str | None = None) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["true"],
        limits=Limits(
            cpus=CPUS,
            memory_bytes=MEMORY_BYTES,
            pids=PIDS,
            output_bytes=OUTPUT_BYTES,
            timeout_s=TIMEOUT_S,
        ),
        labels={BENCH_LABEL: label},
        runtime=runtime,
    )


def raw_create_body(
    image: str, *, label: str = "raw", runtime: str | None = None
) -> dict[str, Any]:
    """The floor's create body: the workload, the same bounds and the same (absent) network.

    Same image and command; the same memory (swap off: ``MemorySwap == Memory``), CPU and pids
    limits; and no network the cheapest way the daemon offers, which is also sbxkit's:
    ``NetworkDisabled: true`` with ``NetworkMode: none``. (``NetworkMode: none`` alone, what
    ``docker run --network none`` sends, still makes libnetwork build a sandbox for the "none"
    network — about 110 ms of start on CI's daemon; the container is equally isolated either
    way, in a fresh netns holding only ``lo``. A floor paying that would sit above sbxkit, so it
    would not be a floor: ``--profile`` measures it as ``raw_netns``.) No hardening: no init, no
    tmpfs, no read-only rootfs, no capability drop, the daemon's default log driver, no attach.
    ``runtime`` sets ``HostConfig.Runtime`` (``raw_crun``); None leaves the daemon's default.
    """
    body = peer_body(
        image, ["true"], {BENCH_LABEL: label}, cpus=CPUS, memory_bytes=MEMORY_BYTES, pids=PIDS
    )
    body["HostConfig"] = {"AutoRemove": False, **body["HostConfig"]}
    if runtime is not None:
        body["HostConfig"]["Runtime"] = runtime
    return body


def netns_create_body(image: str) -> dict[str, Any]:
    """The floor's body without ``NetworkDisabled`` (profile only): what the issue's sketch and
    ``docker run --network none`` ask for, so the network-sandbox cost can be seen."""
    body = raw_create_body(image)
    del body["NetworkDisabled"]
    body["Labels"] = {BENCH_LABEL: "raw_netns"}
    return body


def hardened_create_body(image: str) -> dict[str, Any]:
    """sbxkit's exact create body for the same spec, labelled as the bench's (profile only)."""
    body = build_create_body(sbxkit_spec(image), secrets.token_hex(16))
    data: dict[str, Any] = msgspec.to_builtins(body)
    data["Labels"] = {BENCH_LABEL: "raw_hardened"}
    return data


def raw_one_shot(api: RawEngine, body: bytes, prefix: str = RAW_PREFIX) -> StepTimings:
    """create → start → wait → DELETE ?force=1&v=1, timing each call; blocking.

    The container is removed whatever happens after the create request was sent: by id, or by
    its unique name when the id never arrived. A non-zero exit is an error.
    """
    name = prefix + secrets.token_hex(8)
    clock = time.perf_counter
    steps: StepTimings = {}
    container_id: str | None = None
    t0 = clock()
    try:
        _, reply = api.call("POST", f"/containers/create?name={name}", body, ok=(201,))
        container_id = str(json.loads(reply)["Id"])
        t1 = clock()
        steps["create"] = t1 - t0
        api.call("POST", f"/containers/{container_id}/start", ok=(204,))
        t2 = clock()
        steps["start"] = t2 - t1
        _, reply = api.call("POST", f"/containers/{container_id}/wait", ok=(200,))
        t3 = clock()
        steps["wait"] = t3 - t2
        wait_reply = json.loads(reply)
        if wait_reply.get("StatusCode") != 0 or (wait_reply.get("Error") or {}).get("Message"):
            raise RuntimeError(f"raw: container {name} ended with {wait_reply!r}")
    finally:
        t3 = clock()
        api.remove(container_id or name)
        steps["delete"] = clock() - t3
    return steps


# --- contenders ----------------------------------------------------------------------------

OwnerFactory = Callable[[Engine], Owner]


def sbxkit_contender(
    engine: Engine,
    spec: SandboxSpec,
    leases: list[str],
    *,
    key: str = "sbxkit",
    label: str = "sbxkit",
    owner_factory: OwnerFactory | None = None,
    tracer: CallTracer | None = None,
) -> Contender:
    """``sbxkit._consumers.runner.run(spec, engine=engine)`` — with the runner's default owner
    unless ``owner_factory`` makes one per run. Steps: sbxkit's own phase timings, plus ``outside``
    (wall time not in any phase: validation, image check, the exit inspect)."""

    async def once() -> StepTimings:
        owner = owner_factory(engine) if owner_factory is not None else None
        if tracer is not None:
            if owner is not None:
                tracer.wrap(owner, public_async_methods(owner), "owner.")
            tracer.begin()
        t0 = time.perf_counter()
        if owner is None:
            result = await sbxkit_run(spec, engine=engine)
        else:
            result = await sbxkit_run(spec, engine=engine, owner=owner)
        elapsed = time.perf_counter() - t0
        if tracer is not None:
            tracer.end(key, elapsed)
        leases.append(result.lease)
        if not result.ok:
            raise RuntimeError(
                f"{key}: status {result.status}, exit {result.exit_code}, "
                f"stderr {result.stderr[:200]!r}"
            )
        t = result.timings
        phases = {"create": t.create_s, "start": t.start_s, "run": t.run_s, "remove": t.remove_s}
        return {**phases, "outside": elapsed - sum(phases.values())}

    owner_text = (
        "the runner's default owner"
        if owner_factory is None
        else f"owner={getattr(owner_factory, '__name__', 'owner')}(engine) per run"
    )
    return Contender(
        key,
        label,
        f"await sbxkit._consumers.runner.run(spec, engine=engine), {owner_text}; "
        "engine opened once",
        once,
    )


def raw_contender(
    api: RawEngine, body: dict[str, Any], *, key: str, label: str, what: str
) -> Contender:
    encoded = json.dumps(body, separators=(",", ":")).encode()
    prefix = "sbxbench-" + key.replace("_", "-") + "-"

    async def once() -> StepTimings:
        t0 = time.perf_counter()
        steps = await trio.to_thread.run_sync(raw_one_shot, api, encoded, prefix)
        steps["outside"] = time.perf_counter() - t0 - sum(steps.values())
        return steps

    return Contender(
        key,
        label,
        f"stdlib http.client over AF_UNIX, one keep-alive connection, in a worker thread: "
        f"POST /v1.41/containers/create ({what}), POST start, POST wait, "
        f"DELETE ?force=1&v=1; no attach",
        once,
    )


def dockerpy_contender(client: Any, body: dict[str, Any]) -> Contender:
    """docker-py on one shared ``DockerClient`` (its pooled connections kept across rounds),
    in a worker thread: create → start → wait → remove(force, v), the floor's body."""

    async def once() -> StepTimings:
        code, _ = await trio.to_thread.run_sync(dockerpy_one_shot, client, body)
        if code != 0:
            raise RuntimeError(f"docker_py: exit status {code}")
        return {}

    return Contender(
        "docker_py",
        "docker-py",
        "docker.DockerClient (one, shared) in a worker thread: containers.create(image, cmd, "
        "network_disabled=True, network_mode='none', the floor's limits) → start → wait → "
        "remove(force=True, v=True)",
        once,
    )


def aiodocker_contender(loop: AsyncioThread, docker: Any, body: dict[str, Any]) -> Contender:
    """aiodocker on one ``aiodocker.Docker`` living on a persistent asyncio loop in its own
    thread; trio hands each run to that loop through a worker thread."""

    async def once() -> StepTimings:
        code = await trio.to_thread.run_sync(loop.call, lambda: aiodocker_one_shot(docker, body))
        if code != 0:
            raise RuntimeError(f"aiodocker: exit status {code}")
        return {}

    return Contender(
        "aiodocker",
        "aiodocker",
        "aiodocker.Docker (one, shared) on a persistent asyncio loop in a thread: "
        "containers.create(the floor's body) → start → wait → delete(force, v)",
        once,
    )


EPICBOX_PROFILE = "bb"


def epicbox_limits() -> dict[str, Any]:
    """epicbox's limits for the workload, fresh per call (``epicbox.run`` mutates the dict).
    Memory 64 MB (``mem_limit="64m"`` = 64 MiB, swap off), 64 processes, 30 s of real time;
    ``cputime`` is an ``RLIMIT_CPU`` ulimit (epicbox has no CPU-share limit)."""
    return {"cputime": int(TIMEOUT_S), "realtime": int(TIMEOUT_S), "memory": 64, "processes": 64}


def epicbox_setup(socket_path: str, image: str) -> dict[str, Any]:
    """Import and configure epicbox; raise (with the reason) when it cannot run here.

    epicbox 1.1.0 builds its docker-py client with ``urllib3.Retry(method_whitelist=False)``;
    urllib3 2 removed that keyword (renamed ``allowed_methods`` in 1.26), so against urllib3 2
    every call raises ``TypeError``. When the installed urllib3 lacks the keyword, the bench
    gives epicbox a ``Retry`` that maps it to ``allowed_methods`` — the same retry policy,
    spelled for this urllib3 — and records that it did.
    """
    import inspect

    import epicbox  # type: ignore[import-not-found]
    import epicbox.utils  # type: ignore[import-not-found]
    import urllib3

    facts: dict[str, Any] = {
        "epicbox_version": importlib.metadata.version("epicbox"),
        "urllib3_version": urllib3.__version__,
        "retry_shim": None,
    }
    retry = epicbox.utils.Retry
    if "method_whitelist" not in inspect.signature(retry.__init__).parameters:

        class CompatRetry(retry):  # type: ignore[misc, valid-type]
            def __init__(self, *args: Any, method_whitelist: Any = None, **kwargs: Any) -> None:
                if method_whitelist is not None:
                    kwargs.setdefault("allowed_methods", method_whitelist)
                super().__init__(*args, **kwargs)

        epicbox.utils.Retry = CompatRetry
        facts["retry_shim"] = (
            f"urllib3 {urllib3.__version__} has no Retry(method_whitelist=...), which epicbox "
            "passes; mapped to allowed_methods (same policy)"
        )
    epicbox.configure(
        profiles=[epicbox.Profile(EPICBOX_PROFILE, image)], docker_url=f"unix://{socket_path}"
    )
    epicbox_one_shot(epicbox)  # a probe: does it run against this daemon and image at all?
    return facts


def epicbox_one_shot(module: Any) -> None:
    """``epicbox.run`` of ``true`` (epicbox wraps it: ``/bin/sh -c true``); blocking."""
    result = module.run(EPICBOX_PROFILE, "true", limits=epicbox_limits())
    if result.get("exit_code") != 0 or result.get("timeout"):
        raise RuntimeError(f"epicbox: {result!r}")


def epicbox_contender() -> Contender:
    import epicbox

    async def once() -> StepTimings:
        await trio.to_thread.run_sync(epicbox_one_shot, epicbox)
        return {}

    return Contender(
        "epicbox",
        "epicbox",
        "epicbox.run('bb', 'true', limits={cputime 30, realtime 30, memory 64, processes 64}) "
        "in a worker thread: create (name epicbox-<uuid>, /bin/sh -c true, user root, workdir "
        "/sandbox, stdin open, log driver none, NetworkDisabled) → attach → start → poll the "
        "stream (select 1 s / sleep 50 ms) to EOF → inspect → remove(force, v)",
        once,
    )


def fsync_probe(directory: Path, repeats: int = 20) -> dict[str, Any]:
    """The supervisor journal's durable-write pattern, timed on ``directory``'s filesystem:
    write = temp file, write, fsync, rename, fsync dir; delete = unlink, fsync dir."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sbxbench-fsync-", dir=directory))
    writes: list[float] = []
    deletes: list[float] = []

    def fsync_dir() -> None:
        fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    try:
        for i in range(repeats):
            t0 = time.perf_counter()
            temp, final = work / f".tmp-{i}", work / f"lease-{i}.json"
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, b"{}" * 200)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(temp, final)
            fsync_dir()
            t1 = time.perf_counter()
            os.unlink(final)
            fsync_dir()
            writes.append(t1 - t0)
            deletes.append(time.perf_counter() - t1)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "directory": str(directory),
        "write_median_ms": statistics.median(writes) * 1000.0,
        "delete_median_ms": statistics.median(deletes) * 1000.0,
        "repeats": repeats,
    }


# --- leaks -------------------------------------------------------------------------------------


def _names(container: dict[str, Any]) -> list[str]:
    return [n.lstrip("/") for n in container.get("Names") or []]


def attributable(container: dict[str, Any], image: str, leases: Sequence[str] = ()) -> bool:
    """Did this benchmark make it? Precise on purpose: other clients (a test run) may share the
    daemon, and their containers are neither reported nor touched.

    Ours: the bench label (sbxkit's spec carries it too, so even a run that raised before
    returning its lease is covered), one of our sbxkit leases, our name prefix (or epicbox's,
    ``epicbox-``: it labels nothing), or — for
    ``docker run``, whose command is left exactly as the issue wrote it — an unlabelled ``true``
    from the bench image.
    """
    labels = container.get("Labels") or {}
    return (
        BENCH_LABEL in labels
        or labels.get(LEASE_LABEL) in set(leases)
        or any(n.startswith(("sbxbench-", EPICBOX_PREFIX)) for n in _names(container))
        or (container.get("Image") == image and not labels and container.get("Command") == "true")
    )


def sweep_leaks(
    witness: RawEngine, before: set[str], image: str, leases: Sequence[str]
) -> list[dict[str, Any]]:
    """Containers this run made that still exist; each is reported, then removed."""
    leaks = []
    for container in witness.containers():
        if container["Id"] in before or not attributable(container, image, leases):
            continue
        removed = witness.remove(container["Id"])
        leaks.append(
            {
                "id": container["Id"][:12],
                "names": _names(container),
                "labels": container.get("Labels") or {},
                "state": container.get("State"),
                "removed_by_bench": removed,
            }
        )
    return leaks


def daemon_activity(watch: EventWatch, image: str) -> dict[str, Any]:
    """Container creations the daemon saw during the measurement, ours and others'. Another
    client using the daemon meanwhile (a test run) loads it unevenly; the count says so."""
    ours = 0
    foreign: list[str] = []
    for event in watch.events:
        attrs = (event.get("Actor") or {}).get("Attributes") or {}
        docker_run = attrs.get("image") == image and set(attrs) <= {"image", "name"}
        epicbox = str(attrs.get("name", "")).startswith(EPICBOX_PREFIX)
        if BENCH_LABEL in attrs or docker_run or epicbox:
            ours += 1
        else:
            foreign.append(str(attrs.get("name", "?")))
    return {
        "ours": ours,
        "foreign": len(foreign),
        "foreign_names_sample": foreign[:5],
        "watch_error": watch.error,
    }


# --- the run -----------------------------------------------------------------------------------


async def docker_cli_facts(docker: str, env: dict[str, str]) -> dict[str, Any]:
    facts: dict[str, Any] = {"path": docker}
    for key, argv in (
        ("version_string", [docker, "--version"]),
        ("client", [docker, "version", "--format", "{{json .Client}}"]),
    ):
        done = await trio.run_process(argv, capture_stdout=True, check=False, env=env)
        text = done.stdout.decode(errors="replace").strip()
        facts[key] = json.loads(text) if key == "client" and text.startswith("{") else text
    return facts


async def measure(args: argparse.Namespace, rounds: int, warmup: int) -> dict[str, Any]:
    docker = shutil.which("docker")
    if docker is None:
        raise SystemExit("bench oneshot: no `docker` on PATH (needed for the docker run baseline)")
    env = dict(os.environ, DOCKER_HOST=f"unix://{args.socket}")
    docker_cmd = [docker, "run", "--rm", "--network", "none", args.image, "true"]
    spec = sbxkit_spec(args.image)
    inproc_spec = sbxkit_spec(args.image, label="sbxkit_inproc")
    crun_spec = sbxkit_spec(args.image, label="sbxkit_crun", runtime=CRUN)

    def peer_body_for(key: str) -> dict[str, Any]:
        return peer_body(
            args.image,
            ["true"],
            {BENCH_LABEL: key},
            cpus=CPUS,
            memory_bytes=MEMORY_BYTES,
            pids=PIDS,
        )

    witness = RawEngine(args.socket)
    raw_api = RawEngine(args.socket)
    raw_body = raw_create_body(args.image)
    errors: list[str] = []
    leases: list[str] = []
    leaks: list[dict[str, Any]] = []
    tracer = CallTracer() if args.profile else None
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        facts["docker_cli"] = await docker_cli_facts(docker, env)
        facts["sbxkit_supervisor_state_dir"] = str(default_state_dir())
        await common.require_image(engine, args.image, "oneshot")
        snapshot = await trio.to_thread.run_sync(witness.containers)
        before = {c["Id"] for c in snapshot}
        leftovers = [
            {"id": c["Id"][:12], "names": _names(c)}
            for c in snapshot
            if attributable(c, args.image)
        ]
        unavailable: dict[str, str] = {}
        peers: dict[str, Any] = {}
        contenders = [
            sbxkit_contender(
                engine,
                spec,
                leases,
                # Profile: the same owner the runner defaults to, made here so it can be traced.
                owner_factory=SupervisedOwner if tracer is not None else None,
                tracer=tracer,
            ),
            sbxkit_contender(
                engine,
                inproc_spec,
                leases,
                key="sbxkit_inproc",
                label="sbxkit, in-process",
                owner_factory=InProcessOwner,
                tracer=tracer,
            ),
            raw_contender(
                raw_api,
                raw_body,
                key="raw",
                label="raw floor",
                what="same limits, NetworkDisabled, no hardening",
            ),
        ]
        try:
            client = peers["docker_py"] = dockerpy_client(args.socket, 2)
            contenders.append(dockerpy_contender(client, peer_body_for("docker_py")))
        except Exception as exc:
            unavailable["docker_py"] = f"{type(exc).__name__}: {exc}"
        try:
            loop = peers["aiodocker_loop"] = AsyncioThread()
            adocker = peers["aiodocker"] = loop.call(lambda: _aiodocker(args.socket))
            contenders.append(aiodocker_contender(loop, adocker, peer_body_for("aiodocker")))
        except Exception as exc:
            unavailable["aiodocker"] = f"{type(exc).__name__}: {exc}"
        try:
            facts["epicbox"] = await trio.to_thread.run_sync(epicbox_setup, args.socket, args.image)
            contenders.append(epicbox_contender())
        except Exception as exc:
            unavailable["epicbox"] = f"{type(exc).__name__}: {exc}"
        contenders.append(common.cli_contender("docker_run", "docker run --rm", docker_cmd, env))
        if CRUN in (facts.get("runtimes") or []):
            contenders += [
                sbxkit_contender(
                    engine,
                    crun_spec,
                    leases,
                    key="sbxkit_crun",
                    label="sbxkit, crun",
                ),
                raw_contender(
                    raw_api,
                    raw_create_body(args.image, label="raw_crun", runtime=CRUN),
                    key="raw_crun",
                    label="raw floor, crun",
                    what="the floor's body with HostConfig.Runtime crun",
                ),
            ]
        else:
            reason = f"runtime {CRUN!r} is not registered in the daemon ({facts.get('runtimes')})"
            unavailable["sbxkit_crun"] = unavailable["raw_crun"] = reason
        profile: dict[str, Any] = {}
        if tracer is not None:
            tracer.wrap(engine, public_async_methods(engine), "")
            profile["journal_fsync_probe"] = await trio.to_thread.run_sync(
                fsync_probe, default_state_dir().parent
            )
            contenders += [
                raw_contender(
                    raw_api,
                    hardened_create_body(args.image),
                    key="raw_hardened",
                    label="raw, sbxkit body",
                    what="sbxkit's exact hardened body",
                ),
                raw_contender(
                    raw_api,
                    netns_create_body(args.image),
                    key="raw_netns",
                    label="raw, netns",
                    what="the floor's body without NetworkDisabled",
                ),
            ]
        contenders = common.order_contenders(contenders, args.order, "oneshot", only=args.only)
        say(
            f"oneshot: {warmup} warm-up + {rounds} measured rounds of "
            + " → ".join(c.key for c in contenders)
        )
        watch = EventWatch(args.socket, {"type": ["container"], "event": ["create"]})
        watcher = threading.Thread(target=watch.run, name="sbxbench-events", daemon=True)
        watcher.start()
        await trio.to_thread.run_sync(watch.ready.wait, 10.0)
        try:
            await run_interleaved(
                contenders, rounds=rounds, warmup=warmup, progress=lambda text: say(f"  {text}")
            )
        except ContenderFailed as exc:
            errors.append(str(exc))
        finally:
            watch.stop()
            with trio.CancelScope(shield=True):
                leaks = await trio.to_thread.run_sync(
                    sweep_leaks, witness, before, args.image, leases
                )
                await trio.to_thread.run_sync(watcher.join, 10.0)
                facts["daemon_activity_during_run"] = daemon_activity(watch, args.image)
                witness.close()
                raw_api.close()
                await trio.to_thread.run_sync(close_peers, peers)
        facts["loadavg_at_end"] = list(os.getloadavg())
    if tracer is not None:
        profile["calls_median_ms"] = {
            key: tracer.medians_ms(key) for key in ("sbxkit", "sbxkit_inproc")
        }
    return build_report(
        args=args,
        rounds=rounds,
        warmup=warmup,
        facts=facts,
        contenders=contenders,
        profile=profile,
        raw_connects=raw_api.connects,
        docker_cmd=docker_cmd,
        spec=spec,
        raw_body=raw_body,
        errors=errors,
        leaks=leaks,
        leftovers=leftovers,
        unavailable=unavailable,
    )


async def _aiodocker(socket_path: str) -> Any:
    return aiodocker_client(socket_path)  # on the loop: aiohttp wants a running one


def close_peers(peers: dict[str, Any]) -> None:
    if "docker_py" in peers:
        peers["docker_py"].close()
    if "aiodocker_loop" in peers:
        if "aiodocker" in peers:
            peers["aiodocker_loop"].call(peers["aiodocker"].close)
        peers["aiodocker_loop"].close()


def _medians_ms(table: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(values) * 1000.0 for name, values in table.items() if values}


RATIOS = (
    ("sbxkit", "raw"),
    ("sbxkit", "docker_py"),
    ("sbxkit_inproc", "raw"),
    ("sbxkit", "aiodocker"),
    ("sbxkit", "epicbox"),
    ("sbxkit", "docker_run"),
    ("raw_crun", "raw"),
    ("sbxkit_crun", "raw_crun"),
    ("sbxkit", "sbxkit_inproc"),
    ("docker_py", "raw"),
    ("docker_run", "raw"),
    ("sbxkit_inproc", "raw_hardened"),
    ("raw_hardened", "raw"),
    ("raw_netns", "raw"),
)


def build_report(
    *,
    args: argparse.Namespace,
    rounds: int,
    warmup: int,
    facts: dict[str, Any],
    contenders: Sequence[Contender],
    profile: dict[str, Any],
    raw_connects: int,
    docker_cmd: Sequence[str],
    spec: SandboxSpec,
    raw_body: dict[str, Any],
    errors: list[str],
    leaks: list[dict[str, Any]],
    leftovers: list[dict[str, Any]],
    unavailable: dict[str, str] | None = None,
) -> dict[str, Any]:
    by_key = {c.key: c for c in contenders}
    complete = not errors and all(len(c.totals_s) == rounds for c in contenders)
    ratios: dict[str, Any] = {}
    if complete:
        for num, den in RATIOS:
            if num in by_key and den in by_key:
                ratios[f"{num}/{den}"] = ratio_of_medians(
                    by_key[num].totals_s, by_key[den].totals_s
                )
    measured = ratios.get("sbxkit/raw", {}).get("ratio")
    targets = {}
    for name, limit in TARGETS.items():
        targets[name] = {
            **common.ratio_target(f"{name} <= {limit:.2f}", ratios.get(name), limit),
            "limit": limit,
        }
    report: dict[str, Any] = {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            **common.interleaving_config(args, rounds, warmup, contenders),
            "profile": bool(args.profile),
            "image": args.image,
            "sbxkit_spec": msgspec.to_builtins(spec),
            "raw_create_body": raw_body,
            "docker_command": list(docker_cmd),
        },
        "contenders": {
            c.key: {
                "label": c.label,
                "description": c.description,
                "total_ms": summarise_ms(c.totals_s),
                "steps_median_ms": _medians_ms(c.steps_s),
                "samples_ms": [round(s * 1000.0, 3) for s in c.totals_s],
            }
            for c in contenders
        },
        "ratios": ratios,
        "target": {
            "expression": f"sbxkit/raw <= {TARGET_RATIO:.2f}",
            "ratio": measured,
            "met": None if measured is None else measured <= TARGET_RATIO,
        },
        "targets": targets,
        "errored_contenders": dict(unavailable or {}),
        "errors": errors,
        "leaks": leaks,
        "leftovers_before_run": leftovers,
        "ok": not errors and not leaks,
    }
    if "raw" in report["contenders"]:
        report["contenders"]["raw"]["connections_opened"] = raw_connects
    if profile:
        report["profile"] = {
            **profile,
            "note": "calls_median_ms: wall time of each call sbxkit made (engine methods and "
            "owner methods, wrapped on the instance), in call order; indented = nested in "
            "the call above; 'wait.result' = start returned → exit reply; "
            "'(outside traced calls)' = validation, body building, msgspec, nursery, drain",
        }
    return report


# --- presentation ------------------------------------------------------------------------------


def _steps_text(info: dict[str, Any], sep: str) -> str:
    return sep.join(f"{k} {v:.1f}" for k, v in info["steps_median_ms"].items())


def render_text(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        f"oneshot `true` — {cfg['rounds']} rounds (+{cfg['warmup']} warm-up), interleaved "
        + " → ".join(cfg["order"]),
        f"{'contender':<20} {'median':>8} {'p10':>8} {'p90':>8} {'min':>8} {'max':>8} {'n':>4}",
    ]
    for info in report["contenders"].values():
        t = info["total_ms"]
        lines.append(
            f"{info['label']:<20} {fmt_ms(t.get('median')):>8} {fmt_ms(t.get('p10')):>8} "
            f"{fmt_ms(t.get('p90')):>8} {fmt_ms(t.get('min')):>8} {fmt_ms(t.get('max')):>8} "
            f"{t['n']:>4}"
        )
    lines.append("(ms, wall time per one-shot run)")
    for name, info in report["ratios"].items():
        halves = " / ".join(f"{h:.3f}" for h in info["halves"])
        low, high = info["bootstrap95"]
        lines.append(
            f"{name:<28} {info['ratio']:.3f}   halves {halves}   bootstrap95 {low:.3f}–{high:.3f}"
        )
    for target in report["targets"].values():
        lines += common.target_lines(target)
    shim = (report["machine"].get("epicbox") or {}).get("retry_shim")
    if shim:
        lines.append(f"note: epicbox {report['machine']['epicbox']['epicbox_version']}: {shim}")
    lines += [
        f"ERRORED contender {key}: {reason}" for key, reason in report["errored_contenders"].items()
    ]
    lines.append("median ms per step:")
    for info in report["contenders"].values():
        if info["steps_median_ms"]:
            lines.append(f"  {info['label']:<20} {_steps_text(info, '  ')}")
    profile = report.get("profile")
    if profile:
        probe = profile["journal_fsync_probe"]
        lines.append(
            f"journal fsync probe ({probe['directory']}): write {probe['write_median_ms']:.2f} "
            f"ms, delete {probe['delete_median_ms']:.2f} ms (median)"
        )
        for key, calls in profile["calls_median_ms"].items():
            lines.append(f"{key} calls (median ms):")
            lines += [f"  {name:<34} {ms:8.2f}" for name, ms in calls.items()]
    activity = report["machine"].get("daemon_activity_during_run") or {}
    if activity.get("foreign"):
        lines.append(
            f"WARNING: the daemon was shared — {activity['foreign']} containers created by "
            f"other clients during the run (ours: {activity['ours']}); figures are noisier"
        )
    lines += [f"ERROR: {error}" for error in report["errors"]]
    if any("SupervisorError" in error for error in report["errors"]):
        lines.append(
            f"hint: the supervisor in {report['machine']['sbxkit_supervisor_state_dir']} may "
            "belong to another sbxkit version or client; retry with --state-dir DIR"
        )
    lines += [f"LEAK: {leak}" for leak in report["leaks"]]
    return "\n".join(lines)


def render_markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    m = report["machine"]
    cli = m.get("docker_cli", {})
    git = m.get("git") or {}
    out = [
        "# oneshot — one-shot `true`",
        "",
        f"{m['date']} · {cfg['rounds']} measured rounds (+{cfg['warmup']} warm-up), interleaved "
        f"`{' → '.join(cfg['order'])}` · Docker {m['docker_server_version']} "
        f"(API {m['docker_server_api']}, runtime {m['default_runtime']}, cgroup "
        f"v{m['cgroup_version']}) · kernel {m['kernel']} · {m['nproc']} CPUs · "
        f"CLI {cli.get('version_string', '?')} · sbxkit at {str(git.get('commit', '?'))[:10]}"
        + (" (sbxkit/ modified)" if git.get("sbxkit_dirty") else ""),
        "",
        "| contender | median ms | p10 | p90 | min | max | n |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for info in report["contenders"].values():
        t = info["total_ms"]
        out.append(
            f"| {info['label']} | {fmt_ms(t.get('median'))} | {fmt_ms(t.get('p10'))} | "
            f"{fmt_ms(t.get('p90'))} | {fmt_ms(t.get('min'))} | {fmt_ms(t.get('max'))} | "
            f"{t['n']} |"
        )
    if report["ratios"]:
        out += [
            "",
            "| ratio of medians | value | first half / second half | bootstrap 95 % |",
            "|---|---:|---:|---:|",
        ]
        for name, info in report["ratios"].items():
            low, high = info["bootstrap95"]
            halves = " / ".join(f"{h:.3f}" for h in info["halves"])
            out.append(f"| {name} | {info['ratio']:.3f} | {halves} | {low:.3f}–{high:.3f} |")
    for target in report["targets"].values():
        out += common.target_md(target)
    if report["errored_contenders"]:
        out += ["", "**Errored contenders** (could not run here; left out of the rounds):", ""]
        out += [f"- `{key}`: {reason}" for key, reason in report["errored_contenders"].items()]
    shim = (m.get("epicbox") or {}).get("retry_shim")
    if shim:
        out += ["", f"epicbox {m['epicbox']['epicbox_version']}: {shim}."]
    out += ["", "Median ms per step:", ""]
    for info in report["contenders"].values():
        if info["steps_median_ms"]:
            out.append(f"- {info['label']}: {_steps_text(info, ', ')}")
    profile = report.get("profile")
    if profile:
        probe = profile["journal_fsync_probe"]
        out += [
            "",
            f"Journal fsync probe on `{probe['directory']}`: durable write "
            f"{probe['write_median_ms']:.2f} ms, delete {probe['delete_median_ms']:.2f} ms "
            "(median).",
        ]
        for key, calls in profile["calls_median_ms"].items():
            out += ["", f"`{key}` calls (median ms, call order; indented = nested):", ""]
            out += ["| call | ms |", "|---|---:|"]
            out += [
                f"| {name.replace('  ', '&nbsp;&nbsp;')} | {ms:.2f} |" for name, ms in calls.items()
            ]
    activity = m.get("daemon_activity_during_run") or {}
    if activity.get("foreign"):
        out += [
            "",
            f"**Shared daemon:** {activity['foreign']} containers were created by other clients "
            f"during the run (ours: {activity['ours']}); the figures are noisier for it.",
        ]
    if report["errors"] or report["leaks"]:
        out += ["", "**Errors / leaks:**", ""]
        out += [f"- {e}" for e in report["errors"]]
        out += [f"- leaked {leak}" for leak in report["leaks"]]
    return "\n".join(out) + "\n"


def main(args: argparse.Namespace) -> int:
    rounds = (
        args.rounds if args.rounds is not None else (QUICK_ROUNDS if args.quick else DEFAULT_ROUNDS)
    )
    warmup = (
        args.warmup if args.warmup is not None else (QUICK_WARMUP if args.quick else DEFAULT_WARMUP)
    )
    if rounds < 1 or warmup < 0:
        raise SystemExit("bench oneshot: --rounds must be >= 1 and --warmup >= 0")
    if args.state_dir is not None:
        os.environ["SBXKIT_STATE_DIR"] = str(args.state_dir.resolve())
    report = trio.run(measure, args, rounds, warmup)
    print(render_text(report))
    if str(args.out) != "-":
        stem = "oneshot-profile" if args.profile else "oneshot"
        if not report["ok"]:
            stem += ".failed"  # never overwrite the last complete result with a failed run
        write_json(args.out / f"{stem}.json", report)
        write_atomically(args.out / f"{stem}.md", render_markdown(report))
        say(f"wrote {args.out / stem}.json and .md")
    return 0 if report["ok"] else 1
