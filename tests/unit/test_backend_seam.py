"""The backend seam: every consumer goes through a backend, plans once, and a backend that
cannot serve a consumer refuses it before anything is created.

- Through ``DockerBackend``, every consumer (one-shot run, ``sbxkit.run``, session, PTY, stdio
  worker, grants, harness, a ``sbxkit batch`` line) validates its spec once and builds its
  plan once, and the body it creates is ``build_create_body``'s, byte for byte.
- The sbx backend serves one-shot runs and batches (against the scripted stand-in) and refuses
  sessions, PTYs, stdio workers, grants and file runs at plan time: no ``sbx`` command runs.
- ``[sandbox] runtime = "sandbox"`` / ``[sandbox.sbx]``: what is refused at parse time, by path.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sbxkit import cli
from sbxkit._consumers.broker import Grants, run_with_grants
from sbxkit._consumers.harness import Job, run_many
from sbxkit._consumers.oneshot import run as public_run
from sbxkit._consumers.pty import open_pty
from sbxkit._consumers.runner import run
from sbxkit._consumers.session import open_sandbox
from sbxkit._consumers.stdio import open_stdio_worker
from sbxkit._grammar.profile import SbxProfile, apply_profile, decode_profile, sandbox_options
from sbxkit._lifecycle.owner import CreateRequest
from sbxkit._model import spec
from sbxkit._model.result import RunResult
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._plan import plan
from sbxkit._plan.policy import build_create_body
from sbxkit._protocol.wire import Expiring
from sbxkit.backends import Backend, open_backend
from sbxkit.backends.docker import DockerBackend
from sbxkit.backends.sbx import SbxBackend
from sbxkit.cli.batch import decode_job
from sbxkit.engine.models import ImageConfig, ImageInspect, InfoReply
from sbxkit.errors import SbxError, SpecError
from tests.unit.test_layers import IO_MODULES, ROOT, imports_of
from tests.unit.test_sbx_runner import Machine, sh, write_profile

SPEC = SandboxSpec(
    image="sbxkit-test/busybox:latest",
    command=["sh", "-c", "echo hi"],
    limits=Limits(cpus=0.5, memory_bytes=64 * MiB, pids=32, output_bytes=4096, timeout_s=5.0),
    env={"A": "1", "SECRET": "s"},
    labels={"team": "ml"},
    workdir="/tmp",
)


# --- through the Docker backend: one check, one plan, policy's body -------------------------------


class StubEngine:
    """Just enough engine for a consumer to reach the owner's create (no daemon here: the
    real-engine tiers prove the rest of the lifecycle)."""

    api_version = "1.41"
    is_podman = False
    socket_path = "/nonexistent/stub.sock"

    async def image_inspect(self, name: str) -> ImageInspect:
        return ImageInspect(id="sha256:" + "0" * 64, config=ImageConfig())

    async def cached_info(self) -> InfoReply:
        return InfoReply(kernel_version="another kernel")  # a remote daemon: the daemon's path


class Captured(SbxError):
    """Stops the sandbox at create: what was planned is all these tests want."""


class CapturingOwner:
    def __init__(self) -> None:
        self.bodies: list[tuple[str, bytes]] = []
        self.removed: list[str] = []

    async def create(self, request: CreateRequest) -> str:
        self.bodies.append((request.lease, msgspec.json.encode(request.body)))
        raise Captured(request.name)

    async def started(self, lease: str) -> None:
        raise AssertionError("never started: create raised")

    def queued_s(self, lease: str) -> float:
        return 0.0

    async def ended_by_owner(self, lease: str) -> Expiring | None:
        raise AssertionError("never judged: create raised")

    async def release(self, lease: str) -> bool:
        raise AssertionError("never released: create raised")

    @property
    def fifo_root(self) -> Path:
        return Path("/nonexistent/leases.io")

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        self.removed.append(name)


class Counts:
    def __init__(self) -> None:
        self.validated = 0
        self.planned = 0


@pytest.fixture
def counts(monkeypatch: pytest.MonkeyPatch) -> Counts:
    """Counts every call of ``validate_spec`` and ``build_plan``, wherever it was imported."""
    seen = Counts()
    validate, build = spec.validate_spec, plan.build_plan

    def counted_validate(*args: Any, **kwargs: Any) -> None:
        seen.validated += 1
        validate(*args, **kwargs)

    def counted_build(*args: Any, **kwargs: Any) -> Any:
        seen.planned += 1
        return build(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if not name.startswith("sbxkit"):
            continue
        if getattr(module, "validate_spec", None) is validate:
            monkeypatch.setattr(module, "validate_spec", counted_validate)
        if getattr(module, "build_plan", None) is build:
            monkeypatch.setattr(module, "build_plan", counted_build)
    return seen


Consumer = Callable[[DockerBackend], Awaitable[object]]


async def _session(backend: DockerBackend) -> None:
    async with open_sandbox(SPEC, backend=backend):
        raise AssertionError("never opened")


async def _pty(backend: DockerBackend) -> None:
    async with open_pty(SPEC, backend=backend):
        raise AssertionError("never opened")


async def _stdio(backend: DockerBackend) -> None:
    async with open_stdio_worker(SPEC, backend=backend):
        raise AssertionError("never opened")


async def _harness(backend: DockerBackend) -> None:
    (done,) = await run_many([Job(id=1, spec=SPEC)], parallel=1, backend=backend)
    assert done.error is not None
    raise Captured(done.error.message)


async def _batch_line(backend: DockerBackend) -> None:
    line = msgspec.json.encode({"id": "a", **msgspec.to_builtins(SPEC)})
    job = decode_job(line, backend.settings)  # ``sbxkit batch`` checks every line first
    (done,) = await run_many([job], parallel=1, backend=backend)
    assert done.error is not None
    raise Captured(done.error.message)


CONSUMERS: dict[str, Consumer] = {
    "runner.run": lambda backend: run(SPEC, b"in", backend=backend),
    "sbxkit.run": lambda backend: public_run(SPEC, backend=backend),
    "sbxkit.run(files=)": lambda backend: public_run(SPEC, files={"a": b"1"}, backend=backend),
    "open_sandbox": _session,
    "open_pty": _pty,
    "open_stdio_worker": _stdio,
    "run_with_grants": lambda backend: run_with_grants(SPEC, Grants(), backend=backend),
    "run_many": _harness,
    "sbxkit batch line": _batch_line,
}


@pytest.mark.parametrize("consumer", list(CONSUMERS))
async def test_every_consumer_validates_once_and_plans_once(
    consumer: str, counts: Counts, tmp_path: Path
) -> None:
    owner = CapturingOwner()
    settings = Settings(supervisor_state_dir=str(tmp_path / "leases"))
    backend = DockerBackend(engine=StubEngine(), owner=owner, settings=settings)  # type: ignore[arg-type]
    with pytest.raises(Captured):
        await CONSUMERS[consumer](backend)
    assert (counts.validated, counts.planned) == (1, 1)
    assert len(owner.bodies) == 1
    assert owner.removed == [f"sbxkit-{owner.bodies[0][0]}"]  # removal ran though create failed


async def test_the_body_a_backend_creates_is_policys_byte_for_byte(tmp_path: Path) -> None:
    owner = CapturingOwner()
    settings = Settings(supervisor_state_dir=str(tmp_path / "leases"))
    backend = DockerBackend(engine=StubEngine(), owner=owner, settings=settings)  # type: ignore[arg-type]
    with pytest.raises(Captured):
        await backend.run_once(SPEC, b"in")
    ((lease, body),) = owner.bodies
    effective = plan.effective_settings(settings)
    assert body == msgspec.json.encode(build_create_body(SPEC, lease, settings=effective))


async def test_a_backend_and_its_parts_are_one_or_the_other() -> None:
    backend = DockerBackend()
    for parts in ({"engine": StubEngine()}, {"settings": Settings()}, {"socket_path": "/s"}):
        with pytest.raises(SpecError) as caught:
            await run(SPEC, backend=backend, **parts)  # type: ignore[arg-type]
        assert caught.value.field == "backend"


async def test_docker_reconciliation_is_the_supervisors_recovery(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sbxkit._lifecycle import leases_admin as admin
    from sbxkit._protocol.wire import Recover, Report

    requests: list[tuple[Path, object]] = []

    async def fake_request(state_dir: Path, message: object) -> Report:
        requests.append((state_dir, message))
        return Report(lines=["removed abc"], remaining=0)

    monkeypatch.setattr(admin, "request", fake_request)
    state = tmp_path / "leases"
    backend = DockerBackend(settings=Settings(supervisor_state_dir=str(state)))
    assert await backend.reconcile_orphans() == ["removed abc"]
    assert requests == [(state, Recover())]
    # An in-process owner has no journal: nothing durable to recover, no supervisor launched;
    # the CLI's backend leaves recovery to the supervisor's own passes.
    assert await DockerBackend(owner=CapturingOwner()).reconcile_orphans() == []
    assert await DockerBackend(recover_at_open=False).reconcile_orphans() == []
    assert len(requests) == 1


async def test_docker_preflight_needs_an_engine() -> None:
    from sbxkit.errors import EngineUnavailable

    with pytest.raises(EngineUnavailable):
        await DockerBackend(socket_path="/nonexistent/docker.sock").preflight()
    await DockerBackend(engine=StubEngine()).preflight()  # type: ignore[arg-type]


def test_both_backends_implement_the_interface() -> None:
    docker: Backend = DockerBackend()
    sandbox: Backend = SbxBackend()
    assert (docker.kind, sandbox.kind) == ("docker", "sandbox")


class Recording:
    kind = "recording"

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def preflight(self) -> None:
        self.calls.append("preflight")

    async def run_once(self, spec: SandboxSpec, stdin: bytes | None = None) -> RunResult:
        self.calls.append("run")
        raise SbxError("boom")

    async def reconcile_orphans(self) -> list[str]:
        self.calls.append("reconcile")
        return []

    async def aclose(self) -> None:
        self.calls.append("aclose")


async def test_open_backend_starts_before_and_closes_after_whatever_happens() -> None:
    backend = Recording()

    async def use() -> None:
        async with open_backend(backend) as opened:  # type: ignore[type-var]
            assert backend.calls == ["preflight", "reconcile"]
            await opened.run_once(SPEC)

    with pytest.raises(SbxError, match="boom"):
        await use()
    assert backend.calls == ["preflight", "reconcile", "run", "aclose"]


# --- the sbx backend: runs and batches served, the rest refused at plan time ----------------------


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    machine = Machine(tmp_path)
    monkeypatch.setenv("FAKE_SBX_STATE", str(machine.state))
    return machine


def _sbx_spec(command: list[str]) -> SandboxSpec:
    return msgspec.structs.replace(
        SPEC, image="docker/sandbox-templates:shell", command=command, labels={}, workdir=None
    )


@pytest.mark.parametrize("consumer", ["session", "pty", "stdio", "grants", "files"])
async def test_the_sbx_backend_refuses_what_it_cannot_serve_before_anything_runs(
    consumer: str, machine: Machine
) -> None:
    backend = machine.backend()
    spec = _sbx_spec(["true"])
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "session": lambda: open_sandbox(spec, backend=backend).__aenter__(),
        "pty": lambda: open_pty(spec, backend=backend).__aenter__(),
        "stdio": lambda: open_stdio_worker(spec, backend=backend).__aenter__(),
        "grants": lambda: run_with_grants(spec, Grants(), backend=backend),
        "files": lambda: public_run(spec, files={"a": b"1"}, backend=backend),
    }
    async with open_backend(backend):
        with pytest.raises(SpecError) as caught:
            await calls[consumer]()
    assert caught.value.field == "sandbox.runtime"
    assert "'sandbox' runtime cannot serve" in caught.value.rule
    assert {argv[0] for argv in machine.argvs()} == {"ls"}  # start-up listings, nothing else
    assert machine.sandboxes() == []


async def test_a_harness_batch_runs_on_the_sbx_backend(machine: Machine) -> None:
    backend = machine.backend()
    jobs = [Job(id=n, spec=_sbx_spec(sh(f"echo job{n}; exit {n}"))) for n in range(3)]
    async with open_backend(backend):
        results = await run_many(jobs, parallel=2, backend=backend)
    assert [(r.result.exit_code, r.result.stdout) for r in results if r.result] == [
        (n, f"job{n}\n".encode()) for n in range(3)
    ]
    assert machine.sandboxes() == []


def test_sbxkit_batch_and_shell_take_the_profiles_runtime(
    machine: Machine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = write_profile(machine, tmp_path)
    jobs = tmp_path / "jobs.jsonl"
    limits = {"cpus": 1, "memory_bytes": 64 * MiB, "pids": 32, "output_bytes": 4096}
    line = {"id": 1, "command": sh("echo batched"), "limits": limits}
    jobs.write_bytes(msgspec.json.encode(line) + b"\n")
    out = tmp_path / "out.jsonl"
    with pytest.raises(SystemExit) as caught:
        cli.main(["batch", "--profile", profile, str(jobs), "--out", str(out)])
    assert caught.value.code == 0
    (line,) = out.read_bytes().splitlines()
    decoded = msgspec.json.decode(line)
    assert (decoded["status"], decoded["stdout"]) == ("exited", "batched\n")
    assert any(argv[0] == "create" for argv in machine.argvs())
    runs = len(machine.argvs())
    with pytest.raises(SystemExit) as caught:
        cli.main(["shell", "--profile", profile])
    assert caught.value.code == 2
    assert "sandbox.runtime: the 'sandbox' runtime cannot serve pty" in capsys.readouterr().err
    assert len(machine.argvs()) == runs  # refused before any sbx command
    assert machine.sandboxes() == []


def test_the_sbx_command_builders_are_pure() -> None:
    path = ROOT / "backends" / "sbx_commands.py"
    roots = {name.split(".")[0] for name in imports_of(path)}
    assert not roots & IO_MODULES, sorted(roots & IO_MODULES)
    ours = {n for n in imports_of(path) if n.startswith("sbxkit")}
    assert ours <= {"sbxkit.errors", "sbxkit._model.predicates"}  # both pure


# --- profiles ------------------------------------------------------------------------------------

DOCKER_PROFILE = """
[sandbox.docker]
image = "sbxkit-test/python:latest"
runtime = "crun"

[sandbox.docker.limits]
memory = "128m"
"""

SANDBOX_PROFILE = """
[sandbox]
runtime = "sandbox"

[sandbox.docker]

[sandbox.docker.limits]
timeout = 9

[sandbox.sbx]
binary = "/opt/sbx/bin/sbx"
template = "docker/sandbox-templates:shell"
kits = ["./kit"]
create_args = ["--memory", "8g"]
"""


# --- the profile's runtime switch ---------------------------------------------------------------


def test_a_sandbox_profile_decodes() -> None:
    profile = decode_profile(SANDBOX_PROFILE)
    assert profile.sandbox.runtime == "sandbox"
    assert sandbox_options(profile) == SbxProfile(
        binary="/opt/sbx/bin/sbx",
        template="docker/sandbox-templates:shell",
        kits=["./kit"],
        create_args=["--memory", "8g"],
    )
    spec, _, _ = apply_profile(profile, ["true"])
    assert spec.image == "docker/sandbox-templates:shell"
    spec, _, _ = apply_profile(profile, ["true"], image="img:2")
    assert spec.image == "img:2"


def test_the_switch_alone_takes_the_defaults() -> None:
    profile = decode_profile('[sandbox]\nruntime = "sandbox"\n[sandbox.docker]\nimage = "i:1"\n')
    assert sandbox_options(profile) == SbxProfile()
    assert SbxProfile().binary == "sbx"
    assert SbxProfile().agent == "shell"
    assert apply_profile(profile, ["true"])[0].image == "i:1"
    with pytest.raises(SpecError) as caught:
        apply_profile(decode_profile('[sandbox]\nruntime = "sandbox"\n[sandbox.docker]\n'), ["x"])
    assert "sandbox.sbx.template" in caught.value.rule


def test_docker_profiles_are_unchanged() -> None:
    profile = decode_profile(DOCKER_PROFILE)
    assert profile.sandbox.runtime == "docker"
    assert sandbox_options(profile) is None


SWITCH = '[sandbox]\nruntime = "sandbox"\n'


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('[sandbox]\nruntime = "podman"\n[sandbox.docker]\n', "sandbox.runtime"),
        ("[sandbox.docker]\n[sandbox.sbx]\n", "sandbox.sbx"),  # options without the switch
        ('[sandbox.docker]\n[sandbox.sbx]\nagent = "shell"\n', "sandbox.sbx"),
        (SWITCH + '[sandbox.docker]\nnetwork = "bridge"\n', "sandbox.docker.network"),
        (
            SWITCH + "[sandbox.docker]\nenable_bind_mounts = true\n"
            '[[sandbox.docker.mounts]]\ntype = "bind"\nsource = "/srv"\ntarget = "/data"\n',
            "sandbox.docker.mounts",
        ),
        (
            SWITCH + "[sandbox.docker]\nenable_named_volumes = true\n"
            '[[sandbox.docker.mounts]]\ntype = "volume"\nsource = "cache"\ntarget = "/cache"\n',
            "sandbox.docker.mounts",
        ),
        (SWITCH + '[sandbox.docker]\nuser = "1000:1000"\n', "sandbox.docker.user"),
        (SWITCH + '[sandbox.docker]\nruntime = "gvisor"\n', "sandbox.docker.runtime"),
        (SWITCH + "[sandbox.docker.gpus]\ncount = 1\n", "sandbox.docker.gpus"),
        (SWITCH + "[sandbox.docker.labels]\na = 'b'\n", "sandbox.docker.labels"),
        (SWITCH + "[sandbox.docker.env]\n'A.B' = '1'\n", "sandbox.docker.env['A.B']"),
        (
            SWITCH + '[sandbox.docker]\nimage = "a:1"\n[sandbox.sbx]\ntemplate = "b:1"\n',
            "sandbox.sbx.template",
        ),
        (SWITCH + '[sandbox.docker]\n[sandbox.sbx]\ntemplate = "a b"\n', "sandbox.sbx.template"),
        (SWITCH + '[sandbox.docker]\n[sandbox.sbx]\nbinary = "bin/sbx"\n', "sandbox.sbx.binary"),
        (SWITCH + '[sandbox.docker]\n[sandbox.sbx]\nagent = "Claude"\n', "sandbox.sbx.agent"),
        (SWITCH + '[sandbox.docker]\n[sandbox.sbx]\nkits = ["-x"]\n', "sandbox.sbx.kits[0]"),
        (
            SWITCH + "[sandbox.docker]\n[sandbox.sbx]\n"
            'create_args = ["--memory", "1g", "-t", "i"]\n',
            "sandbox.sbx.create_args[2]",
        ),
        (SWITCH + "[sandbox.docker]\n[sandbox.sbx]\nmemory = 1\n", "sandbox.sbx.memory"),
    ],
)
def test_combinations_that_could_only_fail_later_are_refused_by_path(text: str, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        decode_profile(text)
    assert caught.value.field == field
