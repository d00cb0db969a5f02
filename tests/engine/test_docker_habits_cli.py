"""docker's spellings of ``sbxkit run`` on a real daemon: an image run with no command runs
its own Entrypoint and Cmd, ``-i`` feeds stdin, ``-e``/``--env-file``/``-w``/``-u`` land,
``-v`` binds a host directory where a profile enables bind mounts and is refused by name
where none does — every refusal before a container exists, nothing left after."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engine.helpers import create_plain_container, creates_during, unique
from tests.supervision import private_state_dir, running_supervisor
from tests.witness import Witness


@pytest.fixture
def sbxkit(witness: Witness) -> Iterator[dict[str, str]]:
    state = private_state_dir()
    with running_supervisor(state):
        yield {**os.environ, "SBXKIT_STATE_DIR": str(state)}
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


def run(
    env: dict[str, str], *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "sbxkit", "run", *args],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.fixture
def image_with_its_own_command(witness: Witness, busybox: str) -> Iterator[str]:
    helper = create_plain_container(witness, busybox, unique("habits"))
    repo, tag = "sbxkit-test/with-cmd", unique("t")
    response = witness.session.post(
        f"{witness.base}/commit",
        params={"container": helper, "repo": repo, "tag": tag},
        json={"Entrypoint": ["echo", "entry"], "Cmd": ["and", "cmd"]},
        timeout=60,
    )
    response.raise_for_status()
    witness.session.delete(f"{witness.base}/containers/{helper}", timeout=30)
    try:
        yield f"{repo}:{tag}"
    finally:
        witness.session.delete(f"{witness.base}/images/{repo}:{tag}", timeout=30)


def test_an_image_given_no_command_runs_its_own(
    sbxkit: dict[str, str], image_with_its_own_command: str, busybox: str
) -> None:
    done = run(sbxkit, image_with_its_own_command)
    assert (done.returncode, done.stdout) == (0, b"entry and cmd\n"), done.stderr
    done = run(sbxkit, "--entrypoint", "echo", busybox, "--", "replaced")
    assert (done.returncode, done.stdout) == (0, b"replaced\n"), done.stderr


def test_short_flags_and_env_files_land(
    sbxkit: dict[str, str], busybox: str, tmp_path: Path
) -> None:
    env_file = tmp_path / "env"
    env_file.write_text("FROM_FILE=yes\n")
    done = run(
        sbxkit,
        "-i",
        "-e",
        "A=1",
        "--env-file",
        str(env_file),
        "-w",
        "/tmp",
        "-u",
        "4242",
        "-m",
        "64m",
        "--rm",
        "--read-only",
        "--name",
        "habits",
        busybox,
        "--",
        "sh",
        "-c",
        'cat; echo "$A $FROM_FILE $(pwd) $(id -u):$(id -g)"',
        stdin=b"piped\n",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"piped\n1 yes /tmp 4242:4242\n"


def test_a_bind_mount_where_a_profile_enables_it_and_refused_where_none_does(
    sbxkit: dict[str, str], busybox: str, witness: Witness, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "f").write_text("host file\n")
    shared.chmod(0o755)
    (shared / "f").chmod(0o644)
    profile = tmp_path / "binds.toml"
    profile.write_text(
        f'[sandbox.docker]\nimage = "{busybox}"\nenable_bind_mounts = true\n'
        '[sandbox.docker.limits]\ncpus = 1\nmemory = "64m"\npids = 16\n'
        'max_output = "1m"\ntimeout = 30\n'
    )
    done = run(sbxkit, "--profile", str(profile), "-v", f"{shared}:/data", "--", "cat", "/data/f")
    assert (done.returncode, done.stdout) == (0, b"host file\n"), done.stderr
    since = time.time()
    for argv, said in [
        (
            ("-v", f"{shared}:/data", busybox, "--", "true"),
            b"-v/--mount[0]: bind mounts are disabled",
        ),
        (("-t", busybox, "--", "sh"), b"-t: sbxkit run has no terminal"),
        (("--privileged", busybox, "--", "true"), b"--privileged: not a flag of sbxkit's"),
        (("-u", "0", busybox, "--", "true"), b"--user: root users are refused"),
    ]:
        refused = run(sbxkit, *argv)
        assert refused.returncode == 2, (argv, refused.stderr)
        assert said in refused.stderr, (argv, refused.stderr)
    assert creates_during(witness, since) == []
