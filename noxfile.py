"""Developer sessions. ``./dev test`` and ``./dev demo`` are the README's two commands."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

ENGINE_UP = "scripts/engine-up"
PODMAN_UP = "scripts/podman-up"
CLUSTER_ENGINES_UP = "scripts/cluster-engines-up"
ENGINE26_UP = "scripts/engine26-up"
USERNS_ENGINE_UP = "scripts/userns-engine-up"
NETWORK_TIER = "scripts/network-tier"
CGROUP2_CELL = "scripts/cgroup2-cell"
CGROUP2_BUILD_S = 900
"""The v2 cell's image and wheelhouse, from nothing (debootstrap from Debian's archive: ~3 min
with the rootful packages; the rootless phases' podman, rootlesskit and the rest made one build
here take 951 s at load 18, so 15 minutes; a cached image takes seconds)."""
CGROUP2_ROOTLESS_PODMAN = True
"""The one switch of the rootless Podman phase (``ROOTLESS_PODMAN_TESTS`` in
scripts/cgroup2-cell): on, the 7.2 boot runs it after its rootful tests, in a box of
``CGROUP2_PODMAN_BOX_S`` (alone, the phase took 335 s of a 515 s boot: 33 passed)."""
CGROUP2_PODMAN_BOX_S = 1320
"""The 7.2 boot's box with the rootless Podman phase: 624 s of rootful tests and ~340 s of
rootless Podman (its user's manager, the service, the images copied, 33 tests), with room."""
CGROUP2_BOOTS = {
    "unstable": ("rootful", 720),
    "bookworm": ("rootful,rootless-docker", 1020),
}
"""The v2 cell's two boots, at once (one vCPU each): each kernel's engines, in order
(``SBXKIT_CGROUP2_ENGINES``), and its VM's time box in seconds. The newer kernel (the kernel
path) runs DEFAULT_TESTS (624 s at load 4-10); Debian 12's 6.1 (the daemon's path) runs
BOOKWORM_TESTS, then rootless Docker's phase, ROOTLESS_DOCKER_TESTS (a rootless daemon takes
the daemon's path on any kernel). With rootless Podman's phase the 7.2 boot was the long pole
(1241 s against 831 s in one CI): sessions and supervisor faults moved to BOOKWORM_TESTS, so
this boot's 15 minutes became 17.
``SBXKIT_CGROUP2_TIMEOUT`` replaces both boxes (a machine known to be loaded)."""
CGROUP2_SLACK_S = 120
"""Beyond a VM's time box: packing the share before the boot, reading the results after."""
NETWORK_TESTS = "tests/network"
INTEGRATION_TESTS = "tests/integrations"
INTEGRATION_SESSIONS = ("integration_openai_agents", "integration_deepagents", "integration_harbor")
"""Each framework in a venv of its own, after the suite (``./dev test`` with no selection)."""
INTEGRATION_DAEMON = {"SBXKIT_USERNS_NAME": "ci-integrations"}
"""One --userns-remap daemon the integration sessions share, one after another."""
PODMAN_ROOTLESS_USER = "sbxkit-rootless"


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite on Docker 20.10 (provisions the engine first), the network tier in a
    namespace of its own (docs/network.md), the Docker 26.1 cell, the userns-remap cell and the
    Podman cell: the conformance subset on rootful Podman and the rootless refusal
    (docs/backends.md). With no posargs, the integration sessions and the cgroup v2 cell
    (``cgroup2_cell``) follow.

    The cells run on daemons of their own, beside the main suite (one after the other, in the
    background; their output follows the suite's): CI's 30 minutes hold on two cores."""
    if not session.posargs:  # the frameworks' own sessions and the v2 cell run after this one
        for name in INTEGRATION_SESSIONS:
            session.notify(name)
        session.notify("cgroup2_cell")
    session.run("bash", ENGINE_UP, external=True)
    cluster = _cluster_engines(session)
    session.install("-e", ".[test,inspect,ray,mcp,broker]")
    cells = _Cells(session)
    # The Docker 26.1 cell: the conformance subset under runc, crun and runsc, plus the pool and
    # session files and the tests that show where the engines differ.
    docker26 = _provision(session, ENGINE26_UP, {})
    cells.add(
        "Docker 26.1",
        "conformance or engine_cell",
        {
            "SBXKIT_TEST_SOCKET": docker26,
            "DOCKER_HOST": f"unix://{docker26}",
            # Both evidence paths are proven on 20.10; this cell keeps the product's default.
            "SBXKIT_TEST_EVIDENCE": "kernel",
        },
    )
    # The userns cell: the conformance subset on `dockerd --userns-remap=default` (20.10), where
    # sandboxes take the mapped uid range and the daemon's path, and the cell's own checks.
    userns = _provision(session, USERNS_ENGINE_UP, {})
    cells.add(
        "userns-remap",
        "conformance or userns",
        {
            "SBXKIT_TEST_SOCKET": userns,
            "DOCKER_HOST": f"unix://{userns}",
            "SBXKIT_TEST_EVIDENCE": "daemon",  # no kernel path where uids are remapped
        },
    )
    rootful = _podman_up(session, {})
    # The rootless service takes its own defaults, whatever the rootful one was given.
    rootless = _podman_up(
        session,
        {
            "SBXKIT_PODMAN_USER": PODMAN_ROOTLESS_USER,
            "SBXKIT_PODMAN_SOCKET": "",
            "SBXKIT_PODMAN_ROOT": "",
            "SBXKIT_PODMAN_RUNROOT": "",
        },
    )
    cells.add(
        "Podman",
        "conformance or podman",
        {
            "SBXKIT_TEST_SOCKET": rootful,
            "DOCKER_HOST": f"unix://{rootful}",
            "SBXKIT_TEST_RUNTIMES": "default",
            "SBXKIT_TEST_EVIDENCE": "daemon",  # Podman has no kernel path (docs/security.md)
            "SBXKIT_TEST_PODMAN_ROOTLESS_SOCKET": rootless,
        },
    )
    cells.start()
    try:
        # 5: posargs that select only the network tier leave nothing here
        selected = [0, 5] if session.posargs else [0]
        session.run(
            "pytest",
            "-m",
            "not podman and not userns and not rootless_docker",
            f"--ignore={NETWORK_TESTS}",
            f"--ignore={INTEGRATION_TESTS}",  # each framework's own session: integration_*
            "--durations=15",  # where CI's 30 minutes go, in every log
            *session.posargs,
            env={"SBXKIT_TEST_CLUSTER_SOCKETS": cluster},
            success_codes=selected,
        )
        _network_tier(session)
    finally:
        cells.finish()


class _Cells:
    """The engine cells' pytest runs, one after another in a background thread, each into its
    own log; ``finish`` waits for them, prints each log and fails the session if one failed
    (5, nothing selected, is fine: posargs may select other tests)."""

    def __init__(self, session: nox.Session) -> None:
        self.session = session
        self.runs: list[tuple[str, list[str], dict[str, str], str]] = []
        self.codes: dict[str, int] = {}
        self.thread: threading.Thread | None = None
        self.logs = tempfile.mkdtemp(prefix="sbxkit-cells-")

    def add(self, name: str, marks: str, env: dict[str, str]) -> None:
        argv = [
            f"{self.session.bin}/pytest",
            "-m",
            marks,
            f"--ignore={NETWORK_TESTS}",
            f"--ignore={INTEGRATION_TESTS}",
            *self.session.posargs,
        ]
        # Not session.create_tmp(): it sets TMPDIR for every later command, and the suite's
        # Unix socket paths under that longer TMPDIR pass the kernel's 107-byte limit.
        log = os.path.join(self.logs, f"cell-{len(self.runs)}.log")
        self.runs.append((name, argv, env, log))

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run_all, daemon=True)
        self.thread.start()

    def _run_all(self) -> None:
        for name, argv, env, log in self.runs:
            with open(log, "wb") as out:
                path = f"{self.session.bin}{os.pathsep}{os.environ.get('PATH', '')}"
                done = subprocess.run(
                    argv,
                    env={**os.environ, "PATH": path, **env},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            self.codes[name] = done.returncode

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join()
        failed = []
        for name, _, _, log in self.runs:
            code = self.codes.get(name)
            print(f"\n===== the {name} cell (exit status {code}) =====", flush=True)
            with open(log, encoding="utf-8", errors="replace") as text:
                sys.stdout.write(text.read())
            sys.stdout.flush()
            if code not in (0, 5):
                failed.append(f"{name}: {code}")
        if failed:
            self.session.error(f"engine cells failed: {', '.join(failed)}")


def _network_tier(session: nox.Session) -> None:
    """tests/network inside its own namespace and daemon (scripts/network-tier), unless the
    posargs select other tests only. 5: the posargs selected nothing of the tier."""
    paths = [arg for arg in session.posargs if arg.startswith("tests/")]
    if paths and not any(path.startswith(NETWORK_TESTS) for path in paths):
        return
    session.run(
        "bash",
        NETWORK_TIER,
        *session.posargs,
        external=True,
        env={"PYTEST": f"{session.bin}/pytest"},
        success_codes=[0, 5],
    )


def _cluster_engines(session: nox.Session) -> str:
    """The cluster tier's two node daemons (tests/cluster/): the ones the environment names,
    else provisioned by scripts/cluster-engines-up (its last line: the sockets)."""
    given = os.environ.get("SBXKIT_TEST_CLUSTER_SOCKETS", "").strip()
    return given or _provision(session, CLUSTER_ENGINES_UP, {})


def _podman_up(session: nox.Session, env: dict[str, str]) -> str:
    """Provision one Podman service; its socket is the script's last line of output."""
    return _provision(session, PODMAN_UP, env)


def _provision(session: nox.Session, script: str, env: dict[str, str]) -> str:
    """Run a provisioning script that prints its socket as its last line of output."""
    out = session.run("bash", script, external=True, silent=True, env=env)
    return str(out).strip().splitlines()[-1]


@nox.session
def cgroup2_cell(session: nox.Session) -> None:
    """The cgroup v2 cell: Debian 12 VMs booted on cgroup v2 with the systemd cgroup driver
    (scripts/cgroup2-cell builds and caches the image, boots it under TCG with no network and
    fails when a test fails, nothing ran or the VM does not come up in its time box). With no
    posargs (``./dev test`` notifies it): the image is built, then two boots at once, the newer
    kernel's (the kernel path, DEFAULT_TESTS) and Debian 12's 6.1 (no PIDFD_GET_INFO: the
    daemon's path, BOOKWORM_TESTS, then rootless Docker's phase); ``CGROUP2_ROOTLESS_PODMAN``
    adds rootless Podman's phase to the first. Posargs replace the subset of one boot (the
    newer kernel, or ``SBXKIT_CGROUP2_KERNEL``'s).

    It runs after the main suite, not beside it: a TCG VM keeps a core busy for its whole
    run, and the suite already fills both with its own engine cells; one after the other, CI
    stays well inside its 75 minutes (docs/backends.md, "cgroup v2")."""
    if session.posargs:
        session.run("bash", CGROUP2_CELL, *session.posargs, external=True)
        return
    logs = tempfile.mkdtemp(prefix="sbxkit-cgroup2-")
    started = time.monotonic()
    build = _timeboxed(["bash", CGROUP2_CELL, "build"], {}, f"{logs}/build.log", CGROUP2_BUILD_S)
    _print_log("the cgroup v2 cell's image build", build, f"{logs}/build.log")
    if build != 0:
        session.error(f"the cgroup v2 cell's image build failed ({build})")
    home = os.environ.get("SBXKIT_CGROUP2_HOME", "/var/lib/sbxkit-cgroup2")
    given = os.environ.get("SBXKIT_CGROUP2_TIMEOUT", "")
    boots = {}
    for kernel, (engines, box) in cgroup2_boots(CGROUP2_ROOTLESS_PODMAN).items():
        box = int(given or box)
        env = {
            "SBXKIT_CGROUP2_KERNEL": kernel,
            "SBXKIT_CGROUP2_ENGINES": engines,
            "SBXKIT_CGROUP2_RUN": f"{home}/run-{kernel}",
            "SBXKIT_CGROUP2_TIMEOUT": str(box),
        }
        log = f"{logs}/{kernel}.log"
        boots[kernel] = _Boot(["bash", CGROUP2_CELL], env, log, box + CGROUP2_SLACK_S)
    failed = []
    try:
        for kernel, boot in boots.items():
            code = boot.wait()
            _print_log(f"the cgroup v2 cell, kernel {kernel}", code, boot.log)
            if code != 0:
                run = f"{home}/run-{kernel}"
                # Each phase's pytest log: pytest.log (rootful), pytest-rootless-*.log.
                for pytest_log in sorted(glob.glob(f"{run}/pytest*.log")):
                    name = os.path.basename(pytest_log)
                    _print_log(f"pytest in the VM, kernel {kernel}: {name}", code, pytest_log)
                failed.append(f"{kernel}: {code}")
    finally:  # interrupted: no VM outlives the session
        for boot in boots.values():
            boot.kill()
    print(f"cgroup2_cell: {time.monotonic() - started:.0f} s in all", flush=True)
    if failed:
        session.error(f"the cgroup v2 cell failed: {', '.join(failed)}")


def cgroup2_boots(rootless_podman: bool) -> dict[str, tuple[str, int]]:
    """``CGROUP2_BOOTS`` with the rootless Podman phase after the 7.2 boot's rootful tests
    when ``rootless_podman`` is on."""
    boots = dict(CGROUP2_BOOTS)
    if rootless_podman:
        engines, _ = boots["unstable"]
        boots["unstable"] = (f"{engines},rootless-podman", CGROUP2_PODMAN_BOX_S)
    return boots


class _Boot:
    """One script run in a process group of its own (the VM is its child), into a log."""

    def __init__(self, argv: list[str], env: dict[str, str], log: str, limit_s: float) -> None:
        self.log = log
        self.deadline = time.monotonic() + limit_s
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                argv,
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def wait(self) -> int | str:
        """The exit status, or "timeout" once the whole group was killed past the deadline."""
        try:
            return self.process.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.kill()
            return "timeout"


def _timeboxed(argv: list[str], env: dict[str, str], log: str, limit_s: float) -> int | str:
    return _Boot(argv, env, log, limit_s).wait()


def _print_log(name: str, code: int | str, log: str) -> None:
    print(f"\n===== {name} (exit status {code}) =====", flush=True)
    try:
        with open(log, encoding="utf-8", errors="replace") as text:
            sys.stdout.write(text.read())
    except OSError as exc:
        print(f"(no log: {exc})")
    sys.stdout.flush()


@nox.session
def unit(session: nox.Session) -> None:
    """Only the pure tests (no daemon needed)."""
    session.install("-e", ".[test]")
    session.run("pytest", "tests/unit", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: hostile payloads in real sandboxes, each limit shown holding."""
    session.run("bash", ENGINE_UP, external=True)
    session.install("-e", ".")
    session.run("sbxkit", "demo", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "sbxkit", "tests", "bench", "noxfile.py")
    session.run("ruff", "format", "--check", "sbxkit", "tests", "bench", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test,inspect,mcp,openai-agents,deepagents]", "mypy>=1.10")
    session.run("mypy")
    # What callers' type checkers must refuse (each line carries the error it must raise).
    session.run("mypy", "--warn-unused-ignores", "tests/typing")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: ratios against baselines measured in the same run."""
    session.run("bash", ENGINE_UP, external=True)
    cluster = _cluster_engines(session)  # the cluster benchmark's two nodes' daemons
    session.install("-e", ".[bench,ray]")
    session.run(
        "python", "-m", "bench", *session.posargs, env={"SBXKIT_TEST_CLUSTER_SOCKETS": cluster}
    )


# --- integrations: each framework in a venv of its own (docs/integrations.md) -----------------


def _integration(session: nox.Session, extras: str, tests: list[str], *extra: str) -> None:
    """A framework's tests on the integrations' --userns-remap daemon (root inside is among
    them; on btrfs, so a disk bound is the kernel's quota), with the framework installed."""
    socket = _provision(session, USERNS_ENGINE_UP, INTEGRATION_DAEMON)
    session.install("-e", f".[test,{extras}]", *extra)
    session.run(
        "pytest",
        *tests,
        *session.posargs,
        env={
            "SBXKIT_TEST_SOCKET": socket,
            "DOCKER_HOST": f"unix://{socket}",
            "SBXKIT_TEST_EVIDENCE": "daemon",  # no kernel path where uids are remapped
        },
    )


@nox.session
def integration_openai_agents(session: nox.Session) -> None:
    """The OpenAI Agents SDK on sbxkit: a SandboxAgent driven by the SDK's ScriptedModel."""
    _integration(session, "openai-agents", [f"{INTEGRATION_TESTS}/test_openai_agents.py"])


@nox.session
def integration_deepagents(session: nox.Session) -> None:
    """sbxkit as a deep agents sandbox backend: deep agents' conformance suite for sandboxes
    (langchain-tests' SandboxIntegrationTests) and a deep agent with a scripted model."""
    _integration(
        session,
        "deepagents",
        # pytest-asyncio (the suite's) warns unless its fixture loop scope is named
        [
            f"{INTEGRATION_TESTS}/test_deepagents.py",
            "-o",
            "asyncio_default_fixture_loop_scope=function",
        ],
        "langchain-tests>=1.1,<1.2",
    )


def _python_312() -> str:
    """Harbor needs Python >= 3.12 (sbxkit supports 3.11 too). A ``python3.12`` on PATH that
    runs, else pyenv's (its shim answers only for versions pyenv has activated), else the
    name, which nox then reports missing: the session fails, it never skips."""
    found = shutil.which("python3.12")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return found
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for candidate in sorted(
        glob.glob(os.path.join(root, "versions", "3.12*", "bin", "python3.12"))
    ):
        return candidate
    return "3.12"


HARBOR_PYTHON = _python_312()


@nox.session(python=HARBOR_PYTHON)
def integration_harbor(session: nox.Session) -> None:
    """sbxkit as a Harbor environment: the real ``harbor run`` (its oracle agent, offline) on
    ``--env sbxkit.integrations.harbor:SbxkitEnvironment``."""
    _integration(
        session, "harbor", [f"{INTEGRATION_TESTS}/test_harbor.py", "tests/unit/test_harbor_spec.py"]
    )
