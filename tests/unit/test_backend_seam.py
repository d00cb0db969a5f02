"""The backend seam: the Docker path is unchanged by it, and the profile's runtime switch.

- The Docker create body is byte-identical whether a run goes through ``sbxkit.runner.run``
  or through ``DockerBackend`` (encoded and compared), and equal to ``build_create_body``'s.
- ``sbxkit run`` without ``runtime = "sandbox"`` calls ``sbxkit.runner.run`` exactly as before
  and never builds a backend; with it, never calls ``run``.
- ``[sandbox] runtime = "sandbox"`` / ``[sandbox.sbx]``: what is refused at parse time, by path.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sbxkit import cli, runner
from sbxkit.backends import Backend, open_backend
from sbxkit.backends.docker import DockerBackend
from sbxkit.backends.sbx import SbxBackend
from sbxkit.cli import run_command
from sbxkit.engine.models import ContainerCreate, ImageConfig, ImageInspect
from sbxkit.errors import SbxError, SpecError
from sbxkit.policy import build_create_body
from sbxkit.profile import (
    SbxProfile,
    apply_profile,
    decode_profile,
    sandbox_options,
)
from sbxkit.result import PhaseTimings, RunResult
from sbxkit.settings import Settings
from sbxkit.spec import Limits, MiB, SandboxSpec
from tests.unit.test_layers import IO_MODULES, ROOT, imports_of

LEASE = "0123456789abcdef0123456789abcdef"
SPEC = SandboxSpec(
    image="sbxkit-test/busybox:latest",
    command=["sh", "-c", "echo hi"],
    limits=Limits(cpus=0.5, memory_bytes=64 * MiB, pids=32, output_bytes=4096, timeout_s=5.0),
    env={"A": "1", "SECRET": "s"},
    labels={"team": "ml"},
    workdir="/tmp",
)


# --- the Docker body does not change --------------------------------------------------------------


class StubEngine:
    """Just enough engine for ``runner.run`` to reach the owner's create."""

    api_version = "1.41"
    is_podman = False

    async def image_inspect(self, name: str) -> ImageInspect:
        return ImageInspect(id="sha256:" + "0" * 64, config=ImageConfig())


class Captured(SbxError):
    """Stops the run at create: the body is all this test wants."""


class CapturingOwner:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.removed: list[str] = []

    async def create(
        self, lease: str, name: str, body: ContainerCreate, *, lifetime_s: float
    ) -> str:
        self.bodies.append(msgspec.json.encode(body))
        raise Captured(name)

    async def started(self, lease: str) -> None:
        raise AssertionError("never started: create raised")

    def queued_s(self, lease: str) -> float:
        return 0.0

    async def remove(self, lease: str, name: str, container_id: str | None) -> None:
        self.removed.append(name)


async def test_the_docker_create_body_is_byte_identical_through_the_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(runner, "new_lease_id", lambda: LEASE)
    settings = Settings(supervisor_state_dir=str(tmp_path / "leases"))
    direct, adapted = CapturingOwner(), CapturingOwner()
    engine: Any = StubEngine()
    with pytest.raises(Captured):
        await runner.run(SPEC, b"in", engine=engine, owner=direct, settings=settings)
    backend = DockerBackend(engine=engine, owner=adapted, settings=settings)
    with pytest.raises(Captured):
        await backend.run_once(SPEC, b"in")
    expected = msgspec.json.encode(
        build_create_body(SPEC, LEASE, settings=runner.effective_settings(settings))
    )
    assert direct.bodies == [expected]
    assert adapted.bodies == [expected]  # the same bytes, not merely an equal struct
    assert direct.removed == adapted.removed == [f"sbxkit-{LEASE}"]


async def test_the_docker_backend_passes_every_argument_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[Any, ...]] = []

    result = fake_result()

    async def fake_run(spec: SandboxSpec, stdin: bytes | None = None, **kwargs: Any) -> Any:
        calls.append((spec, stdin, kwargs))
        return result

    monkeypatch.setattr(runner, "run", fake_run)
    owner, engine, settings = object(), object(), Settings()
    backend = DockerBackend(
        socket_path="/s.sock",
        settings=settings,
        engine=engine,  # type: ignore[arg-type]
        owner=owner,  # type: ignore[arg-type]
    )
    assert await backend.run_once(SPEC, b"x") is result
    assert calls == [
        (
            SPEC,
            b"x",
            {
                "engine": engine,
                "owner": owner,
                "socket_path": "/s.sock",
                "settings": settings,
                "gpu_cursor": None,
            },
        )
    ]


async def test_docker_reconciliation_is_the_supervisors_recovery(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sbxkit.supervisor import admin
    from sbxkit.supervisor.wire import Recover, Report

    requests: list[tuple[Path, object]] = []

    async def fake_request(state_dir: Path, message: object) -> Report:
        requests.append((state_dir, message))
        return Report(lines=["removed abc"], remaining=0)

    monkeypatch.setattr(admin, "request", fake_request)
    state = tmp_path / "leases"
    backend = DockerBackend(settings=Settings(supervisor_state_dir=str(state)))
    assert await backend.reconcile_orphans() == ["removed abc"]
    assert requests == [(state, Recover())]
    # An in-process owner has no journal: nothing durable to recover, no supervisor launched.
    assert await DockerBackend(owner=CapturingOwner()).reconcile_orphans() == []
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
        async with open_backend(backend) as opened:
            assert backend.calls == ["preflight", "reconcile"]
            await opened.run_once(SPEC)

    with pytest.raises(SbxError, match="boom"):
        await use()
    assert backend.calls == ["preflight", "reconcile", "run", "aclose"]


def test_the_sbx_command_builders_are_pure() -> None:
    path = ROOT / "backends" / "sbx_commands.py"
    roots = {name.split(".")[0] for name in imports_of(path)}
    assert not roots & IO_MODULES, sorted(roots & IO_MODULES)
    ours = {n for n in imports_of(path) if n.startswith("sbxkit")}
    assert ours <= {"sbxkit.errors", "sbxkit.predicates"}  # both pure


# --- the CLI takes the old path unless the profile switches runtime ------------------------------

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


def fake_result() -> RunResult:
    return RunResult(
        status="exited",
        exit_code=0,
        stdout=b"",
        stderr=b"",
        overflowed=None,
        container_id="c",
        lease="l",
        timings=PhaseTimings(),
    )


@pytest.mark.parametrize("profile_text", [None, DOCKER_PROFILE])
def test_sbxkit_run_without_the_switch_is_the_old_call(
    profile_text: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[Any, ...]] = []

    async def fake_run(spec: SandboxSpec, stdin: bytes | None, **kwargs: Any) -> RunResult:
        calls.append((spec, stdin, kwargs))
        return fake_result()

    def no_backend(*_: Any) -> Any:
        raise AssertionError("a backend was built on the Docker path")

    monkeypatch.setattr(run_command, "run", fake_run)
    monkeypatch.setattr(run_command, "sandbox_backend", no_backend)
    monkeypatch.setattr(run_command, "open_backend", no_backend)
    argv = ["run", "--socket", "/d.sock"]
    if profile_text is None:
        argv += ["img:1", "--", "true"]
    else:
        path = tmp_path / "p.toml"
        path.write_text(profile_text)
        argv += ["--profile", str(path), "--", "true"]
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 0
    (call,) = calls
    spec, stdin, kwargs = call
    assert stdin is None
    assert set(kwargs) == {"socket_path", "settings", "on_queued"}
    assert kwargs["socket_path"] == "/d.sock"
    assert kwargs["on_queued"] is None  # stderr is not a terminal here: nothing to say
    if profile_text is None:
        assert kwargs["settings"] is None
        assert spec.image == "img:1"
    else:
        assert kwargs["settings"] == Settings()
        assert (spec.image, spec.runtime, spec.limits.memory_bytes) == (
            "sbxkit-test/python:latest",
            "crun",
            128 * MiB,
        )


def test_sbxkit_run_with_the_switch_never_calls_the_docker_runner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[Any] = []

    async def no_run(*_: Any, **__: Any) -> RunResult:
        raise AssertionError("the Docker runner ran under runtime = 'sandbox'")

    class FakeBackend(Recording):
        async def run_once(self, spec: SandboxSpec, stdin: bytes | None = None) -> RunResult:
            seen.append(spec)
            return fake_result()

    built: list[Any] = []
    real = run_command.sandbox_backend

    def capture(profile: Any, args: argparse.Namespace, spec: SandboxSpec) -> Any:
        built.append(real(profile, args, spec))
        return FakeBackend()

    monkeypatch.setattr(run_command, "run", no_run)
    monkeypatch.setattr(run_command, "sandbox_backend", capture)
    path = tmp_path / "p.toml"
    path.write_text(SANDBOX_PROFILE)
    with pytest.raises(SystemExit) as caught:
        cli.main(["run", "--profile", str(path), "--", "true"])
    assert caught.value.code == 0
    (spec,) = seen
    assert spec.image == "docker/sandbox-templates:shell"
    assert spec.limits.timeout_s == 9
    (backend,) = built
    assert isinstance(backend, SbxBackend)
    assert backend.config.binary == "/opt/sbx/bin/sbx"
    assert backend.config.kits == ["./kit"]
    assert backend.config.create_args == ["--memory", "8g"]


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
