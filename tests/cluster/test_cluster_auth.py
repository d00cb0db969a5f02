"""Who may use the cluster: an outsider's own Ray, a cluster without token authentication, a rogue
node without the cluster secret, and a driver that asks nodes for more than they allow.

The outsider is a separate non-root account (tests/accounts.py) running Ray from this
machine's install with an interpreter it may execute: what any local user (or, on a real
cluster, any network peer) has.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.accounts import Account, local_account
from tests.cluster.cluster import ADDRESS, REPO, LocalCluster
from tests.cluster.test_cluster_batch import (
    BATCH_TIMEOUT_S,
    LIMITS,
    SLOTS,
    creates,
    lines,
    run_batch,
    running,
    start_batch,
    wait_for,
)
from tests.witness import PYTHON, Witness

JOB = {"id": "j0", "image": PYTHON, "command": ["true"], "limits": LIMITS}

ATTACK = r"""
import json, os, socket, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address=sys.argv[1], _temp_dir=sys.argv[2], log_to_driver=False)
targets = [n["NodeID"] for n in ray.nodes() if n["Alive"] and "sbxkit_sandboxes" in n["Resources"]]

@ray.remote(num_cpus=0)
def grab():
    out = {"uid": os.getuid()}
    try:
        out["shadow"] = open("/etc/shadow").read(5)
    except OSError as exc:
        out["shadow"] = type(exc).__name__
    engine = socket.socket(socket.AF_UNIX)
    try:
        engine.connect(os.environ["DOCKER_HOST"].removeprefix("unix://"))
        engine.sendall(b"GET /info HTTP/1.0\r\n\r\n")
        out["info"] = engine.recv(64).decode(errors="replace").splitlines()[0]
    except OSError as exc:
        out["info"] = type(exc).__name__
    return out

def on(node):
    return grab.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False))

print(json.dumps([ray.get(on(node).remote(), timeout=60) for node in targets]))
"""


def outsider_python(outsider: Account) -> str:
    """An interpreter of this Python's minor version that the outsider may run, with a standard
    library it may read (this venv's interpreter may live under root's home): the system's."""
    wanted = f"{sys.version_info[0]}.{sys.version_info[1]}"
    check = "import os, sys; print('%d.%d' % sys.version_info[:2], os.access(sys.prefix, os.R_OK))"
    for candidate in ("/usr/bin/python3", sys.executable):
        probe = outsider.run([candidate, "-I", "-c", check], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.split() == [wanted, "True"]:
            return candidate
    raise AssertionError(f"no Python {wanted} the outsider may run")


def outsider_ray(cluster: LocalCluster, outsider: Account) -> tuple[list[str], dict[str, str]]:
    """How the outsider runs Ray in the cluster's namespace: argv prefix and environment (its
    own, with this machine's Ray on the path; the patch-level check relaxed, as an attacker
    would, and two tries at the GCS instead of 20: a refusal is said on the first)."""
    env = outsider.env(
        {
            "PYTHONPATH": sysconfig.get_paths()["purelib"],
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL": "minor",
            "RAY_gcs_server_port_wait_time_s": "2",
        }
    )
    return cluster.in_ns(outsider.argv([outsider_python(outsider)])), env


def attack(cluster: LocalCluster, outsider: Account) -> tuple[int, str, str]:
    """The outsider's `ray start --address` into the cluster, then a task of its own pinned
    on every sbxkit node: (ray start's status, its output, the task's JSON or the failure)."""
    python, env = outsider_ray(cluster, outsider)
    start = [
        "import sys; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()",
        *("start", "--address", ADDRESS, "--node-ip-address", "127.0.0.1"),
        *("--temp-dir", f"{outsider.home}/ray", "--num-cpus", "1", "--disable-usage-stats"),
    ]
    joined = subprocess.run(
        [*python, "-c", *start],
        env=env,
        cwd=outsider.home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ran = subprocess.run(
        [*python, "-c", ATTACK, ADDRESS, f"{outsider.home}/ray"],
        env=env,
        cwd=outsider.home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = ran.stdout.strip().splitlines()[-1] if ran.returncode == 0 else ran.stderr[-2000:]
    return joined.returncode, joined.stdout + joined.stderr, said


@contextmanager
def open_cluster(socket: str) -> Iterator[LocalCluster]:
    """A cluster started the way the old docs said: no token authentication, no secret (its
    own namespace: a head and one sbxkit node on ``socket``'s daemon)."""
    root = Path(tempfile.mkdtemp(prefix="sbxo-", dir="/tmp"))
    cluster = LocalCluster(root, {"rayo": socket}, auth=False, tag="rayopen")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def account_gone(outsider: Account) -> None:
    try:
        pwd.getpwnam(outsider.name)
    except KeyError:
        pass
    else:
        raise AssertionError(f"the account {outsider.name} was not removed")
    left = [p for p in os.listdir("/proc") if p.isdigit() and _uid(p) == outsider.uid]
    assert left == [], f"processes of {outsider.name} left: {left}"


def _uid(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


# --- tests ---------------------------------------------------------------------------------------


def test_an_outsider_cannot_join_the_cluster_nor_run_on_its_nodes(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    """The finding, reproduced: on a cluster started as the old docs said, another local
    account joins with its own Ray and runs as root on the sbxkit node (the engine is then
    theirs) — and sbxkit now refuses to dispatch there. On the cluster started as the docs now
    say, the same account is refused by Ray itself."""
    with open_cluster(node_witnesses["raya"].socket_path) as unguarded, local_account() as outsider:
        status, said, got = attack(unguarded, outsider)
        assert status == 0, said
        assert json.loads(got) == [{"uid": 0, "shadow": "root:", "info": "HTTP/1.0 200 OK"}]

        # A driver set up as the docs say (token mode, a token, the secret) is no proof that
        # the cluster checks anything: sbxkit asks the cluster, and refuses it.
        jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
        jobs.write_text(json.dumps(JOB) + "\n")
        refused = _batch(unguarded, jobs, out, {**unguarded.driver_env(), **cluster.auth_env()})
        assert refused.returncode == 69, refused.stderr
        assert "does not enforce token authentication" in refused.stderr
        assert "RAY_AUTH_MODE=token" in refused.stderr  # how to turn it on
        assert "nothing was sent" in refused.stderr
        assert not out.exists() or out.read_text() == ""
    account_gone(outsider)

    nodes_before = _node_ids(cluster)
    with local_account() as outsider:
        assert outsider.run(["cat", str(cluster.token_path)]).returncode != 0
        status, said, got = attack(cluster, outsider)
        assert status != 0, said
        assert "AuthenticationError" in said, said
        assert "AuthenticationError" in got, got  # its driver is refused as well
        # ...and with a token of its own making
        python, env = outsider_ray(cluster, outsider)
        guessed = subprocess.run(
            [*python, "-c", ATTACK, ADDRESS, f"{outsider.home}/ray"],
            env={**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)},
            cwd=outsider.home,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert guessed.returncode != 0
        assert "AuthenticationError" in guessed.stderr, guessed.stderr[-2000:]
    account_gone(outsider)
    assert _node_ids(cluster) == nodes_before  # nobody joined


def test_a_driver_without_the_token_or_the_secret_is_refused_by_name(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
    jobs.write_text(json.dumps(JOB) + "\n")
    env = cluster.driver_env()
    # Ray's own patience (20 tries at the GCS, a second apart) shortened: it says why at once.
    impatient = {**env, "RAY_AUTH_MODE": "disabled", "RAY_gcs_server_port_wait_time_s": "2"}
    no_token = _batch(cluster, jobs, out, impatient)
    assert no_token.returncode == 69, no_token.stderr
    assert "refused this driver's credentials" in no_token.stderr
    assert "RAY_AUTH_MODE=token" in no_token.stderr

    no_secret = {k: v for k, v in env.items() if k != "SBXKIT_CLUSTER_SECRET_FILE"}
    missing = _batch(cluster, jobs, out, no_secret)
    assert missing.returncode == 2, missing.stderr
    assert "SBXKIT_CLUSTER_SECRET_FILE: is not set" in missing.stderr
    readable = tmp_path / "secret"
    readable.write_text(secrets.token_hex(32))
    readable.chmod(0o644)
    loose = _batch(cluster, jobs, out, {**env, "SBXKIT_CLUSTER_SECRET_FILE": str(readable)})
    assert loose.returncode == 2, loose.stderr
    assert f"SBXKIT_CLUSTER_SECRET_FILE: {readable} is readable or writable by others" in (
        loose.stderr
    )
    assert not out.exists() or out.read_text() == ""


ROGUE_PATCH = r'''

# --- the rogue node's own additions (tests/cluster/test_cluster_auth.py) ---
_honest_relay = relay


def relay(*args, **kwargs):
    """Keep everything the batch sends here, and answer with a made-up result."""
    import os as _os

    with open(_os.environ["ROGUE_CAPTURE"], "ab") as _capture:
        _capture.write(repr(args).encode() + b"\n")
    return _forged(args)


def _forged(args):
    import os as _os

    from sbxkit.cluster import wire as _wire
    from sbxkit._consumers.harness import JobResult
    from sbxkit._model.result import PhaseTimings, RunResult

    job_id = "unknown"
    for arg in args:
        if isinstance(arg, bytes):
            try:
                job_id = _wire.decode_job(arg).id
                break
            except Exception:
                pass
    result = RunResult(
        status="exited", exit_code=0, stdout=b"forged by rayr\n", stderr=b"", overflowed=None,
        container_id="f" * 64, lease="forged", timings=PhaseTimings(run_s=0.1),
    )
    fields = {"job": JobResult(id=job_id, result=result), "node": "raya"}
    if "node_id" in _wire.Done.__struct_fields__:
        fields["node_id"] = "forged"
    forged = _wire.encode(_wire.Done(**fields))
    if hasattr(_wire, "SealedOutcome"):  # sealed, with the only secret it has: its own
        from sbxkit.cluster.seal import Keys, context

        keys = Keys(_os.environ["SBXKIT_CLUSTER_SECRET"].encode(), args[0])
        sealed = keys.seal("outcome", context(args[1], args[2]), forged)
        forged = _wire.encode(_wire.SealedOutcome(sealed=sealed))
    return forged
'''


ROGUE_FIRST = """
import importlib.machinery, os, sys


class _RogueFirst(importlib.machinery.PathFinder):
    # Its own sbxkit before any other (Ray puts the driver's paths first in its workers).
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "sbxkit":
            return super().find_spec(name, [os.path.dirname(__file__)], target)
        return None


sys.meta_path.insert(0, _RogueFirst)
"""


def rogue_sbxkit(where: Path) -> Path:
    """This sbxkit, copied, with a relay that keeps what it is sent and returns made-up
    results, imported first by every Python of the node (a ``sitecustomize``): a rogue node's
    code (its agent is sbxkit's own, with a secret of its own)."""
    shutil.copytree(REPO / "sbxkit", where / "sbxkit", ignore=shutil.ignore_patterns("__pycache__"))
    relay = where / "sbxkit" / "cluster" / "relay.py"
    relay.write_text(relay.read_text() + ROGUE_PATCH)
    (where / "sitecustomize.py").write_text(ROGUE_FIRST)
    return where


def test_a_rogue_node_without_the_secret_gets_nothing_and_forges_nothing(
    cluster: LocalCluster, node_witnesses: dict[str, Witness], tmp_path: Path
) -> None:
    """A node that holds Ray's token but not the cluster secret (its own instead), running a
    modified sbxkit on a real engine (rayb's): it is refused by name when it joins, the relays
    Ray places on it before it is judged carry nothing of a job's stdin or environment, the
    results it makes up are refused, and every job ends with its real result."""
    stdin_mark, env_mark = f"stdin-{secrets.token_hex(8)}", f"env-{secrets.token_hex(8)}"
    # Marks long and random enough that ciphertext, in the repr the rogue wrote, never holds
    # one by chance: a bare b"cat" did once in CI (an escape such as \x9c followed by "at").
    command_mark = f"command-{secrets.token_hex(8)}"
    capture = tmp_path / "capture"
    rogue_env = {
        "PYTHONPATH": str(rogue_sbxkit(tmp_path / "rogue")),
        "SBXKIT_CLUSTER_SECRET_FILE": "",
        "SBXKIT_CLUSTER_SECRET": secrets.token_hex(32),
        "ROGUE_CAPTURE": str(capture),
    }
    rogue_resources = {"sbxkit_sandboxes": 16, "sbxkit_memory_mib": 16384}
    rayb = node_witnesses["rayb"]

    def jobs_file(path: Path, count: int, command: str) -> Path:
        rows = [
            {
                "id": f"j{i}",
                "image": PYTHON,
                "command": ["sh", "-c", command],
                "limits": LIMITS,
                "stdin": f"{stdin_mark} {i}\n",
                "env": {"MARK": env_mark},
            }
            for i in range(count)
        ]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path

    # 1. Present when the batch starts: refused by name, not one relay reaches it.
    cluster.start_node("rayr", socket=rayb.socket_path, env=rogue_env, resources=rogue_resources)
    try:
        out = tmp_path / "first.jsonl"
        done = run_batch(cluster, jobs_file(tmp_path / "first-jobs.jsonl", 4, "cat"), out)
        assert done.returncode == 0, done.stderr
        assert "node rayr (" in done.stderr
        assert "its join report does not verify against the cluster secret" in done.stderr
        results = lines(out)
        assert {r["node"] for r in results} <= {"raya", "rayb"}
        assert sorted(r["stdout"] for r in results) == [f"{stdin_mark} {i}\n" for i in range(4)]
        assert not capture.exists(), capture.read_text()[:2000]
    finally:
        cluster.stop_node("rayr")

    # 2. Appearing mid-batch, while relays wait in Ray for room: Ray places some on it before
    # the driver has judged it. They are sealed; what it returns does not verify.
    out = tmp_path / "second.jsonl"
    jobs = jobs_file(
        tmp_path / "second-jobs.jsonl", 24, f'cat; echo "$MARK"; : {command_mark}; sleep 6'
    )
    since = time.time()
    driver = start_batch(cluster, jobs, out)
    try:
        wait_for(
            lambda: all(running(w) == SLOTS for w in node_witnesses.values()),
            120,
            "both nodes full (the rest waiting in Ray)",
        )
        cluster.start_node(
            "rayr", socket=rayb.socket_path, env=rogue_env, resources=rogue_resources
        )
        _, stderr = driver.communicate(timeout=BATCH_TIMEOUT_S)
    finally:
        if driver.poll() is None:
            driver.send_signal(2)
            driver.wait(timeout=90)
        cluster.stop_node("rayr")
    assert driver.returncode == 0, stderr
    assert "node rayr (" in stderr, stderr
    captured = capture.read_bytes() if capture.exists() else b""
    assert captured, "the test can fail: no relay reached the rogue node"
    assert stdin_mark.encode() not in captured
    assert env_mark.encode() not in captured
    assert command_mark.encode() not in captured  # the command neither: the whole job is sealed
    results = lines(out)
    final = [r for r in results if r["status"] != "lost"]
    assert sorted(r["id"] for r in final) == sorted(f"j{i}" for i in range(24))
    assert all(r["status"] == "exited" for r in final), final
    assert all(r["stdout"] == f"{stdin_mark} {r['id'][1:]}\n{env_mark}\n" for r in final)
    assert not any("forged" in json.dumps(r) for r in results)
    placed = Counter(r["node"] for r in final)
    assert set(placed) <= {"raya", "rayb"}, placed
    # The rogue ran nothing on the engine it has (rayb's): rayb's creates are rayb's results.
    assert creates(rayb, since) == placed["rayb"]


def test_a_setting_the_driver_widens_does_not_widen_a_node(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """The driver's profile enables bind mounts and its job binds a directory of the node's
    host: the node, whose own configuration does not, refuses it by the rule (before: the
    driver's settings travelled to the node, and the job read the node's file)."""
    profile = tmp_path / "driver.toml"
    profile.write_text("[sandbox.docker]\nenable_bind_mounts = true\n")
    host = tmp_path / "node-data"
    host.mkdir()
    (host / "file").write_text("the node's own\n")
    jobs, out = tmp_path / "jobs.jsonl", tmp_path / "results.jsonl"
    job = {
        "id": "bind",
        "image": PYTHON,
        "command": ["cat", "/data/file"],
        "limits": LIMITS,
        "mounts": [{"type": "bind", "source": str(host), "target": "/data"}],
    }
    jobs.write_text(json.dumps(job) + "\n")
    done = run_batch(cluster, jobs, out, "--profile", str(profile))
    assert out.exists(), done.stderr
    (result,) = lines(out)
    assert result["status"] == "error", result
    assert result["error"]["type"] == "SpecError", result
    assert "bind mounts are disabled" in result["error"]["message"], result
    assert done.returncode != 0


def _batch(
    cluster: LocalCluster, jobs: Path, out: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cluster.in_ns(
            [
                *(sys.executable, "-m", "sbxkit", "batch", str(jobs), "--out", str(out)),
                *("--ray", ADDRESS, "--no-progress"),
            ]
        ),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=BATCH_TIMEOUT_S,
    )


def _node_ids(cluster: LocalCluster) -> set[Any]:
    script = f"import json, ray; ray.init(address={ADDRESS!r}, log_to_driver=False); " + (
        "print(json.dumps(sorted(n['NodeID'] for n in ray.nodes())))"
    )
    done = subprocess.run(
        cluster.in_ns([sys.executable, "-c", script]),
        cwd=REPO,
        env=cluster.driver_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return set(json.loads(done.stdout.strip().splitlines()[-1]))
