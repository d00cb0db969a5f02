"""``sbxkit open`` and the commands that name an open sandbox, as processes on a real daemon:
a background process fed across three calls and read by cursor, directories both ways, the
exit statuses, refusals before anything exists, and every way a session ends — ``close``, its
time limit, a killed holder — each leaving nothing (the witness)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sbxkit.cli._session_wire as wire
from tests.accounts import local_account
from tests.engine.helpers import creates_during, wait_until
from tests.supervision import private_state_dir, running_supervisor
from tests.witness import Witness


class Cli:
    def __init__(self, env: dict[str, str], sessions: Path) -> None:
        self.env = env
        self.sessions = sessions

    def __call__(
        self, *args: str, stdin: bytes | None = None, check: bool = False
    ) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [sys.executable, "-m", "sbxkit", *args],
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            env=self.env,
            timeout=120,
            check=False,
        )
        if check:
            assert done.returncode == 0, (args, done.returncode, done.stderr)
        return done

    def record(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.sessions / f"{name}.json").read_text())
        return data

    def log(self, name: str) -> str:
        return (self.sessions / f"{name}.log").read_text()


@pytest.fixture
def cli(witness: Witness) -> Iterator[Cli]:
    state = private_state_dir()
    sessions = Path(tempfile.mkdtemp(prefix="sbxses-", dir="/tmp"))
    os.chmod(sessions, 0o700)
    env = {**os.environ, "SBXKIT_STATE_DIR": str(state), "SBXKIT_SESSIONS_DIR": str(sessions)}
    with running_supervisor(state):
        runner = Cli(env, sessions)
        try:
            yield runner
        finally:
            for entry in sessions.glob("*.json"):  # a failed test's sessions: closed here
                runner("close", entry.stem)
            shutil.rmtree(sessions, ignore_errors=True)
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


def test_a_session_from_open_to_close(
    cli: Cli, python_image: str, witness: Witness, tmp_path: Path
) -> None:
    opened = cli("open", "--name", "work", "--json", python_image, check=True)
    container = json.loads(opened.stdout)["container_id"]
    assert json.loads(opened.stdout)["name"] == "work"
    assert (cli.sessions / "work.json").stat().st_mode & 0o777 == 0o600

    ran = cli("exec", "work", "--", "python3", "-c", "print('hi'); raise SystemExit(3)")
    assert (ran.returncode, ran.stdout) == (3, b"hi\n")
    data = bytes(range(256)) * 100
    piped = cli("exec", "-i", "work", "--", "cat", stdin=data)
    assert (piped.returncode, piped.stdout) == (0, data)
    late = cli("exec", "--timeout", "1", "work", "--", "sleep", "30")
    assert late.returncode == 124, late.stderr
    assert late.stderr.endswith(b"sbxkit: timed out after 1 s\n"), late.stderr  # its limit named

    # A background process, fed across three calls, read by cursor.
    started = cli(
        "exec",
        "-d",
        "work",
        "--",
        "sh",
        "-c",
        'while read x; do echo "got $x"; done; echo bye; exit 5',
        check=True,
    )
    process = started.stdout.decode().strip()
    cli("write", "work", process, "one\n", check=True)
    cli("write", "work", process, stdin=b"two\n", check=True)
    assert wait_until(lambda: cli("logs", "work", process).stdout == b"got one\ngot two\n", 10.0)
    cli("write", "--eof", "work", process, "three\n", check=True)
    waited = cli("wait", "work", process)
    assert (waited.returncode, waited.stdout) == (5, b"exited 5\n")
    whole = cli("logs", "work", process, check=True).stdout
    assert whole == b"got one\ngot two\ngot three\nbye\n"
    tail = cli("logs", "--cursor", str(len(b"got one\n")), "work", process, check=True)
    assert tail.stdout == whole[len(b"got one\n") :]
    listed = cli("ps", "--json", "work", check=True)
    [row] = json.loads(listed.stdout)
    assert (row["process"], row["exit"]["exit_code"]) == (process, 5)

    sessions = json.loads(cli("sessions", "--json", check=True).stdout)
    assert [(s["name"], s["container_id"]) for s in sessions] == [("work", container)]
    assert "secret" not in sessions[0]

    # Directories both ways, byte-exact; a single file too.
    tree = tmp_path / "tree"
    (tree / "sub" / "deep").mkdir(parents=True)
    (tree / "sub" / "deep" / "blob").write_bytes(os.urandom(300_000))
    (tree / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tree / "run.sh").chmod(0o755)
    cli("cp", str(tree), "work:/tmp/in", check=True)
    out = tmp_path / "out"
    cli("cp", "work:/tmp/in", str(out), check=True)
    assert (out / "sub" / "deep" / "blob").read_bytes() == (tree / "sub/deep/blob").read_bytes()
    assert (out / "run.sh").read_text() == "#!/bin/sh\necho ran\n"
    single = out.parent / "single"
    cli("cp", "work:/tmp/in/run.sh", str(single), check=True)
    assert single.read_bytes() == (tree / "run.sh").read_bytes()

    closed = cli("close", "work")
    assert closed.returncode == 0, closed.stderr
    assert list(cli.sessions.iterdir()) == []
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
    again = cli("exec", "work", "--", "true")
    assert again.returncode == 2
    assert b"no open session by that name" in again.stderr


def test_refusals_come_before_anything_exists(cli: Cli, busybox: str, witness: Witness) -> None:
    since = time.time()
    cases = [
        (("open", "--name", "Bad", busybox), b"'Bad' is not a session name"),
        (("open", busybox, "--", "sleep", "1"), b"takes an image, not a command"),
        (("open", "--memory", "1k", busybox), b"--memory"),
        (("open", "sbxkit-test/missing:never"), b"sbxkit never pulls images"),
        (("open", "--workspace", busybox), b"root inside would be root on the host"),
        (("exec", "nobody", "--", "true"), b"no open session by that name"),
    ]
    for argv, said in cases:
        done = cli(*argv)
        assert done.returncode == 2, (argv, done.stderr)
        assert said in done.stderr, (argv, done.stderr)
    assert creates_during(witness, since) == []
    cli("open", "--name", "s", busybox, check=True)
    for argv, said in [
        (("open", "--name", "s", busybox), b"a session named s is open"),
        (("exec", "-t", "s", "--", "sh"), b"a terminal needs -d here"),
        (("logs", "s", "p0"), b"'p0' is no process of this session"),
        (("exec", "s"), b"CMD: missing"),
    ]:
        done = cli(*argv)
        assert done.returncode == 2, (argv, done.stderr)
        assert said in done.stderr, (argv, done.stderr)
    cli("close", "s", check=True)


def test_a_killed_holder_costs_its_sandbox_and_nothing_else(
    cli: Cli, busybox: str, witness: Witness
) -> None:
    cli("open", "--name", "doomed", busybox, check=True)
    holder = cli.record("doomed")["pid"]
    os.kill(holder, signal.SIGKILL)
    assert witness.wait_until_no_sbxkit_containers(seconds=20.0) == []
    gone = cli("exec", "doomed", "--", "true")
    assert gone.returncode == 70
    assert b"its holder is gone" in gone.stderr
    assert not (cli.sessions / "doomed.json").exists()


def test_a_session_ends_at_its_time_limit_and_on_sigterm(
    cli: Cli, busybox: str, witness: Witness
) -> None:
    cli("open", "--name", "brief", "--timeout", "2", busybox, check=True)
    cli("open", "--name", "termed", busybox, check=True)
    os.kill(cli.record("termed")["pid"], signal.SIGTERM)
    assert wait_until(lambda: not (cli.sessions / "brief.json").exists(), 30.0)
    assert wait_until(lambda: not (cli.sessions / "termed.json").exists(), 30.0)
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []
    assert json.loads(cli("sessions", "--json", check=True).stdout) == []
    assert "time limit" in cli.log("brief"), cli.log("brief")
    assert "SIGTERM: closing" in cli.log("termed")


def test_only_the_secret_and_the_account_reach_a_holder(cli: Cli, busybox: str) -> None:
    cli("open", "--name", "guarded", busybox, check=True)
    record = cli.record("guarded")
    # Same account, wrong secret: no answer, nothing run, and the holder says so.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(record["socket"])
        sock.sendall(wire.frame(wire.Start(secret="x" * 43, argv=["touch", "/tmp/pwned"])))
        assert sock.recv(1024) == b""
    assert "refused a Start with a wrong secret" in cli.log("guarded")
    assert json.loads(cli("ps", "--json", "guarded", check=True).stdout) == []
    probe = cli("exec", "guarded", "--", "ls", "/tmp")
    assert b"pwned" not in probe.stdout
    # Another account cannot even reach the socket (its directory is this account's, 0700).
    connect = (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_UNIX)\n"
        "try:\n s.connect(sys.argv[1])\nexcept OSError as e:\n print(type(e).__name__)\n"
        "else:\n print('connected')\n"
    )
    with local_account() as attacker:
        tried = attacker.python(connect, record["socket"], capture_output=True, text=True)
    assert tried.stdout.strip() == "PermissionError", tried
    cli("close", "guarded", check=True)
