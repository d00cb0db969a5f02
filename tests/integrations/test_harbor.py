"""Harbor on sbxkit: the real ``harbor run`` CLI with its oracle agent (a task's reference
solution, no model, offline) and ``--env sbxkit.integrations.harbor:SbxkitEnvironment``, on
tasks written here, against a real daemon.

Run on a ``--userns-remap`` daemon (root inside needs one): ``SBXKIT_TEST_SOCKET=$SOCK
DOCKER_HOST=unix://$SOCK pytest tests/integrations/test_harbor.py`` (``nox -s
integration_harbor`` provisions it). Each test ends with the witness finding none of its
containers.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sbxkit._model.spec import MiB
from sbxkit.integrations._harbor_spec import SESSION_LABEL
from tests.engine.helpers import delete_image, wait_until
from tests.engine.test_workspace_disk import build_deb
from tests.integrations import harbor_support as support
from tests.integrations.harbor_support import (
    flat,
    harbor_argv,
    harbor_env,
    run_harbor,
    sandboxes_created_since,
    task_image,
    trial_dir,
    trial_result,
    write_task,
)
from tests.witness import PYTHON, Witness

witness = support.witness  # the fixtures: the daemon's independent view, and no leftovers
no_leftovers = support.no_leftovers

NO_NETWORK = {"docker_image": PYTHON, "network_mode": "no-network"}
SUM = "#!/bin/bash\nset -e\nmkdir -p /app\necho $((3 + 4 + 5)) > /app/answer.txt\n"
CHECK_SUM = (
    "#!/bin/bash\n"
    'if [ "$(cat /app/answer.txt)" = 12 ]; then r=1; else r=0; fi\n'
    "echo $r > /logs/verifier/reward.txt\n"
)


def reward(jobs: Path) -> float | None:
    verified = trial_result(jobs)["verifier_result"]
    return None if verified is None else float(verified["rewards"]["reward"])


def test_a_python_image_task_is_solved_by_its_script(witness: Witness, tmp_path: Path) -> None:
    """(a) The oracle runs solve.sh in the python image; the verifier's reward comes back 1."""
    task = write_task(tmp_path / "sum", environment=NO_NETWORK, solve=SUM, test=CHECK_SUM)
    since = time.time()
    done = run_harbor(task, tmp_path / "jobs")
    assert done.returncode == 0, done.stdout + done.stderr
    result = trial_result(tmp_path / "jobs")
    assert result["exception_info"] is None, result["exception_info"]
    assert reward(tmp_path / "jobs") == 1.0
    # One sandbox served the whole trial (agent, verifier, transfers), named by its session.
    (created,) = sandboxes_created_since(witness, since)
    session = created["Actor"]["Attributes"][SESSION_LABEL]
    assert session.startswith(f"{result['trial_name']}__"), session
    log = (trial_dir(tmp_path / "jobs") / "trial.log").read_text()
    assert re.search(r"sbxkit sandbox [0-9a-f]{12} removed", log), log  # by the env's stop


CHECK_DEB = (
    '#!/bin/sh\n[ "$(cat "$1")" = "$2" ] && echo pass || { echo "fail: $(cat "$1")"; exit 1; }\n'
)
INSTALL_AND_CHECK = """#!/bin/bash
v=/logs/verifier
id -u > $v/uid.txt
cat /sys/fs/cgroup/memory/memory.limit_in_bytes > $v/memory.txt
c=/sys/fs/cgroup/cpu
echo "$(cat $c/cpu.cfs_quota_us) $(cat $c/cpu.cfs_period_us)" > $v/cpu.txt
# storage_mb bounds what the image takes on: 6 x 60 MiB pass 256 MiB (the error goes to /tmp,
# a tmpfs: /logs is on the full image too)
for i in 1 2 3 4 5 6; do head -c 60M /dev/zero > /var/tmp/fill$i 2>> /tmp/fill.txt || break; done
rm -f /var/tmp/fill*
cp /tmp/fill.txt $v/fill.txt
apt-get install -y /tests/sbxkit-check.deb > $v/apt.txt 2>&1 &&
  dpkg -s sbxkit-check > $v/dpkg.txt &&
  sbxkit-check /app/answer.txt 12 > $v/check.txt
if [ $? = 0 ]; then echo 1 > $v/reward.txt; else echo 0 > $v/reward.txt; fi
"""
SUM_INPUT = "#!/bin/bash\nset -e\ncd /app\nawk '{s += $1} END {print s}' input.txt > answer.txt\n"


def test_a_verifier_installs_a_local_deb_as_root_within_the_tasks_resources(
    witness: Witness, tmp_path: Path
) -> None:
    """(b) A task image of its own (the python image plus /app, committed here); the verifier
    installs a ``.deb`` built here with ``apt-get install`` as root, in the image made
    writable by ``storage_mb``; the task's ``cpus``, ``memory_mb`` and ``storage_mb`` are the
    sandbox's cgroup limits and disk bound, as the verifier reads and meets them."""
    image = task_image(witness, {"app/input.txt": b"3\n4\n5\n"})
    try:
        (tmp_path / "deb").mkdir()
        deb = build_deb(tmp_path / "deb", CHECK_DEB, "sbxkit-check")
        environment = {
            "docker_image": image,
            "network_mode": "no-network",
            "cpus": 0.5,
            "memory_mb": 512,
            "storage_mb": 256,
        }
        task = write_task(
            tmp_path / "deb-task",
            environment=environment,
            solve=SUM_INPUT,
            test=INSTALL_AND_CHECK,
            files={"tests/sbxkit-check.deb": deb},
        )
        done = run_harbor(task, tmp_path / "jobs")
    finally:
        delete_image(witness, image)
    assert done.returncode == 0, done.stdout + done.stderr
    verifier = trial_dir(tmp_path / "jobs") / "verifier"
    logs = {path.name: path.read_text() for path in verifier.iterdir()}
    assert trial_result(tmp_path / "jobs")["exception_info"] is None
    assert reward(tmp_path / "jobs") == 1.0, logs
    assert logs["check.txt"] == "pass\n"
    assert "Status: install ok installed" in logs["dpkg.txt"]
    assert logs["uid.txt"] == "0\n"
    assert int(logs["memory.txt"]) == 512 * MiB
    assert logs["cpu.txt"].split() == ["50000", "100000"]
    assert "Disk quota exceeded" in logs["fill.txt"], logs["fill.txt"]


AS_NOBODY = """#!/bin/bash
{ id -u; id -g; echo "$HOME"; touch /written-by-nobody 2>&1; } > /logs/agent/who.txt
"""
VERIFY_AS_ROOT = "#!/bin/bash\nid -u > /logs/verifier/uid.txt\necho 1 > /logs/verifier/reward.txt\n"


def test_the_tasks_agent_user_runs_the_solution_and_root_the_verifier(
    witness: Witness, tmp_path: Path
) -> None:
    """``[agent] user = "nobody"``: the solution runs as the image's nobody (65534, its home,
    no right to write to /), dropped to from root inside; the verifier runs as root."""
    task = write_task(
        tmp_path / "user",
        environment=NO_NETWORK,
        solve=AS_NOBODY,
        test=VERIFY_AS_ROOT,
        agent_user="nobody",
    )
    done = run_harbor(task, tmp_path / "jobs")
    assert done.returncode == 0, done.stdout + done.stderr
    assert trial_result(tmp_path / "jobs")["exception_info"] is None
    trial = trial_dir(tmp_path / "jobs")
    who = (trial / "agent" / "who.txt").read_text().splitlines()
    assert who[:3] == ["65534", "65534", "/nonexistent"], who
    assert "Permission denied" in who[3], who
    assert (trial / "verifier" / "uid.txt").read_text() == "0\n"


SOLVE_FOREVER = "#!/bin/bash\nsleep 300 &\nsleep 300\n"
LIVE_PROCESSES = """#!/bin/bash
for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done > /logs/verifier/processes.txt
echo 0 > /logs/verifier/reward.txt
"""


def test_a_solution_that_outlives_its_timeout_is_an_agent_timeout(
    witness: Witness, tmp_path: Path
) -> None:
    """(c) The solution sleeps past the task's 3 s: Harbor reports ``AgentTimeoutError`` as it
    does on Docker, and the verifier that runs after it finds none of the solution's
    processes (its own and a background child) still alive."""
    task = write_task(
        tmp_path / "slow",
        environment=NO_NETWORK,
        solve=SOLVE_FOREVER,
        test=LIVE_PROCESSES,
        agent_timeout=3.0,
    )
    started = time.monotonic()
    done = run_harbor(task, tmp_path / "jobs")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    info = trial_result(tmp_path / "jobs")["exception_info"]
    assert info["exception_type"] == "AgentTimeoutError", info
    assert info["exception_message"] == "Agent execution timed out after 3.0 seconds"
    processes = (trial_dir(tmp_path / "jobs") / "verifier" / "processes.txt").read_text()
    assert "/tests/test.sh" in processes  # the listing sees the verifier itself
    assert "sleep 300" not in processes, processes
    assert elapsed < 120, elapsed


def start_harbor_and_wait_for_its_sandbox(
    witness: Witness, tmp_path: Path
) -> subprocess.Popen[str]:
    task = write_task(
        tmp_path / "forever", environment=NO_NETWORK, solve=SOLVE_FOREVER, test=CHECK_SUM
    )
    harbor = subprocess.Popen(
        harbor_argv(task, tmp_path / "jobs"),
        env=harbor_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    if not wait_until(lambda: bool(witness.sbxkit_containers()), seconds=60, interval=0.2):
        harbor.kill()
        out, _ = harbor.communicate(timeout=30)
        pytest.fail(f"harbor made no sandbox in 60 s: {out}")
    time.sleep(2.0)  # the solution uploaded and its exec started: the trial is mid-agent
    assert harbor.poll() is None
    return harbor


def test_ctrl_c_during_a_trial_leaves_no_container(witness: Witness, tmp_path: Path) -> None:
    """(d) SIGINT to the harbor process mid-solution: Harbor cancels the trial and the
    environment's stop removes the sandbox (its log line); the daemon destroys it before
    harbor exits, so in harbor's own cleanup, not by the supervisor after; harbor exits 130."""
    since = time.time()
    harbor = start_harbor_and_wait_for_its_sandbox(witness, tmp_path)
    (sandbox,) = witness.sbxkit_containers()
    exits = os.pidfd_open(harbor.pid)
    try:
        harbor.send_signal(signal.SIGINT)
        assert select.select([exits], [], [], 120)[0], "harbor did not exit in 120 s"
        exited = time.time()
    finally:
        os.close(exits)
    out, _ = harbor.communicate(timeout=30)
    assert harbor.returncode == 130, out
    assert witness.sbxkit_containers() == [], out
    destroyed = witness.events(since, time.time(), type=["container"], event=["destroy"])
    (gone,) = [event for event in destroyed if event["id"] == sandbox["Id"]]
    assert gone["timeNano"] / 1e9 < exited, (gone["timeNano"] / 1e9, exited)
    log = (trial_dir(tmp_path / "jobs") / "trial.log").read_text()
    assert re.search(r"sbxkit sandbox [0-9a-f]{12} removed", log), log


def test_a_killed_harbor_leaves_no_container(witness: Witness, tmp_path: Path) -> None:
    """SIGKILL to the harbor process (no cleanup of its own can run): the supervisor's lease
    ends with the process's connection and the sandbox is removed."""
    harbor = start_harbor_and_wait_for_its_sandbox(witness, tmp_path)
    harbor.kill()
    harbor.communicate(timeout=30)
    assert witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


DOCKERFILE = {"environment/Dockerfile": b"FROM sbxkit-test/python:latest\n"}


@pytest.mark.parametrize(
    ("environment", "files", "options", "refusal"),
    [
        pytest.param(
            {"network_mode": "no-network"},
            DOCKERFILE,
            (),
            "SpecError: environment: {task}/environment/Dockerfile: sbxkit never builds "
            "images; build it yourself (docker build -t NAME {task}/environment) and set "
            "[environment] docker_image = NAME in task.toml",
            id="dockerfile",
        ),
        pytest.param(
            NO_NETWORK,
            DOCKERFILE,
            ("--force-build",),
            "SpecError: environment: --force-build: sbxkit never builds images "
            "({task}/environment/Dockerfile)",
            id="force-build",
        ),
        pytest.param(
            NO_NETWORK,
            {"environment/docker-compose.yaml": b"services: {main: {privileged: true}}\n"},
            (),
            "SpecError: environment: {task}/environment/docker-compose.yaml: sbxkit runs one "
            "hardened container per trial and does not run docker compose",
            id="compose",
        ),
        pytest.param(
            {"docker_image": PYTHON},
            {},
            (),
            "SpecError: network_mode: 'public' (the default, or allow_internet = true): sbxkit "
            "gives a sandbox no internet",
            id="public-network",
        ),
        pytest.param(
            {"docker_image": PYTHON, "allow_internet": True},
            {},
            (),
            "SpecError: network_mode: 'public' (the default, or allow_internet = true)",
            id="allow-internet",
        ),
        pytest.param(
            NO_NETWORK,
            {},
            ("--mounts", '[{"type": "bind", "source": "/etc", "target": "/host-etc"}]'),
            "SpecError: --mounts: sbxkit takes host mounts only from a profile's "
            "[[sandbox.docker.mounts]]",
            id="mounts",
        ),
        pytest.param(
            {**NO_NETWORK, "gpus": 1},
            {},
            (),
            "Task requires 1 GPU(s) but sbxkit environment does not support GPU allocation",
            id="gpus",
        ),
    ],
)
def test_what_sbxkit_will_not_do_is_refused_by_name_before_any_container(
    witness: Witness,
    tmp_path: Path,
    environment: dict[str, object],
    files: dict[str, bytes],
    options: tuple[str, ...],
    refusal: str,
) -> None:
    task = write_task(
        tmp_path / "refused", environment=environment, solve=SUM, test=CHECK_SUM, files=files
    )
    since = time.time()
    done = run_harbor(task, tmp_path / "jobs", *options)
    output = flat(done.stdout + done.stderr)
    results = list((tmp_path / "jobs").glob("*/*/result.json"))
    if results:  # refused in the trial's start: its result names it
        (result,) = results
        info = json.loads(result.read_text())["exception_info"]
        output += flat(f" {info['exception_type']}: {info['exception_message']}")
    else:  # refused as Harbor builds the environment: harbor fails
        assert done.returncode != 0, output
    assert flat(refusal.format(task=task)) in output, output
    assert sandboxes_created_since(witness, since) == []


def test_offline_runs_a_public_task_with_no_network(witness: Witness, tmp_path: Path) -> None:
    """``--ek offline=true``: a task that asks for the internet (the default) runs with none
    (``offline`` says so), and its solution still solves it."""
    probe = (
        SUM + "python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)'"
        " 2> /app/connect.txt || true\n"
    )
    check = CHECK_SUM + "cp /app/connect.txt /logs/verifier/connect.txt\n"
    task = write_task(
        tmp_path / "public", environment={"docker_image": PYTHON}, solve=probe, test=check
    )
    done = run_harbor(task, tmp_path / "jobs", "--ek", "offline=true")
    assert done.returncode == 0, done.stdout + done.stderr
    assert reward(tmp_path / "jobs") == 1.0
    connect = (trial_dir(tmp_path / "jobs") / "verifier" / "connect.txt").read_text()
    assert "Network is unreachable" in connect, connect
    assert trial_result(tmp_path / "jobs")["config"]["environment"]["kwargs"] == {"offline": True}


KERNEL = SUM + "{ dmesg | head -1; head -1 /proc/meminfo; } > /logs/agent/kernel.txt\n"


def test_a_profile_gives_what_the_task_leaves_open(witness: Witness, tmp_path: Path) -> None:
    """``--ek profile=PATH``: the profile's runtime (gVisor) and memory serve a task that names
    neither; the oracle solves it there."""
    profile = tmp_path / "sbxkit.toml"
    profile.write_text(
        '[sandbox.docker]\nruntime = "gvisor"\n[sandbox.docker.limits]\nmemory = "768m"\n'
    )
    task = write_task(tmp_path / "gvisor", environment=NO_NETWORK, solve=KERNEL, test=CHECK_SUM)
    done = run_harbor(task, tmp_path / "jobs", "--ek", f"profile={profile}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert reward(tmp_path / "jobs") == 1.0
    kernel = (trial_dir(tmp_path / "jobs") / "agent" / "kernel.txt").read_text().splitlines()
    assert kernel[0].endswith("Starting gVisor..."), kernel
    assert kernel[1].split() == ["MemTotal:", str(768 * 1024), "kB"], kernel


def test_a_bad_profile_fails_the_job_before_any_trial(witness: Witness, tmp_path: Path) -> None:
    """A profile that sets the network (the task decides it) fails Harbor's preflight."""
    profile = tmp_path / "sbxkit.toml"
    profile.write_text('[sandbox.docker]\nnetwork = "bridge"\n')
    task = write_task(tmp_path / "task", environment=NO_NETWORK, solve=SUM, test=CHECK_SUM)
    since = time.time()
    done = run_harbor(task, tmp_path / "jobs", "--ek", f"profile={profile}")
    output = flat(done.stdout + done.stderr)
    assert done.returncode != 0, output
    assert "sandbox.docker.network: 'bridge' in the profile: a Harbor task's network_mode" in output
    assert not list((tmp_path / "jobs").glob("*/*/trial.log"))  # no trial started
    assert sandboxes_created_since(witness, since) == []


def test_concurrent_trials_each_get_a_sandbox_of_their_own(
    witness: Witness, tmp_path: Path
) -> None:
    """A dataset of three tasks at ``--n-concurrent 3``: three sandboxes (one per trial, by
    their sessions), every reward 1."""
    for name in ("one", "two", "three"):
        write_task(tmp_path / "tasks" / name, environment=NO_NETWORK, solve=SUM, test=CHECK_SUM)
    since = time.time()
    done = run_harbor(tmp_path / "tasks", tmp_path / "jobs", "--n-concurrent", "3")
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads(p.read_text()) for p in (tmp_path / "jobs").glob("*/*/result.json")]
    assert sorted(r["task_name"] for r in results) == ["one", "three", "two"]
    assert [r["verifier_result"]["rewards"]["reward"] for r in results] == [1.0, 1.0, 1.0]
    sessions = {
        e["Actor"]["Attributes"][SESSION_LABEL] for e in sandboxes_created_since(witness, since)
    }
    assert sorted(s.split("__")[0] for s in sessions) == ["one", "three", "two"], sessions


def test_the_sandboxs_lifetime_ends_a_trial_that_outlives_it(
    witness: Witness, tmp_path: Path
) -> None:
    """``--ek lifetime=5`` under a solution of 60 s (its agent timeout 120 s): the sandbox is
    removed at 5 s and the trial says so (``SandboxExpired``), long before either timeout."""
    slow = "#!/bin/bash\nsleep 60\n"
    task = write_task(tmp_path / "long", environment=NO_NETWORK, solve=slow, test=CHECK_SUM)
    started = time.monotonic()
    done = run_harbor(task, tmp_path / "jobs", "--ek", "lifetime=5")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr
    info = trial_result(tmp_path / "jobs")["exception_info"]
    assert info["exception_type"] == "SandboxExpired", info
    assert (
        "the session's time limit of 5 s passed; the sandbox was removed"
        in (info["exception_message"])
    )
    assert elapsed < 45, elapsed


def test_a_separate_verifier_environment_is_a_sandbox_of_its_own(
    witness: Witness, tmp_path: Path
) -> None:
    """``[verifier] environment_mode = "separate"``: Harbor opens a second environment for the
    verifier, a second sandbox (its own hostname), each removed by its stop."""
    solve = "#!/bin/bash\nhostname > /logs/agent/host.txt\n"
    test = "#!/bin/bash\nhostname > /logs/verifier/host.txt\necho 1 > /logs/verifier/reward.txt\n"
    task = write_task(
        tmp_path / "separate",
        environment=NO_NETWORK,
        solve=solve,
        test=test,
        verifier={"environment_mode": "separate"},
    )
    since = time.time()
    done = run_harbor(task, tmp_path / "jobs")
    assert done.returncode == 0, done.stdout + done.stderr
    assert reward(tmp_path / "jobs") == 1.0
    trial = trial_dir(tmp_path / "jobs")
    agent_host = (trial / "agent" / "host.txt").read_text()
    verifier_host = (trial / "verifier" / "host.txt").read_text()
    assert agent_host != verifier_host
    assert len(sandboxes_created_since(witness, since)) == 2
    log = (trial / "trial.log").read_text()
    assert len(re.findall(r"sbxkit sandbox [0-9a-f]{12} removed", log)) == 2, log
