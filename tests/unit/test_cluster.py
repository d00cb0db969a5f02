"""The cluster integration's pure parts, without Ray or a daemon: resources, the join verdict,
the batch's attempt accounting, the wire and its seals, the cluster secret's checks, the token
authentication probe's verdict, a node's own settings, image content, result lines of attempts,
and the refusals of bad options (the real cluster is tests/cluster/)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

import sbxkit
from sbxkit._consumers.harness import ClusterBatch, Job, JobError, JobResult, Need, run_many
from sbxkit._model.result import PhaseTimings, RunResult
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit.cli.progress import Progress
from sbxkit.cli.results import encode_result, scan_results
from sbxkit.cluster import ClusterUnauthenticated, ClusterUnavailable, RayCluster
from sbxkit.cluster.agent import NODE_PROFILE_ENV, node_settings
from sbxkit.cluster.dispatch import AHEAD_MIN, Dispatch
from sbxkit.cluster.images import content_fingerprint
from sbxkit.cluster.join import image_reference, judge
from sbxkit.cluster.rayauth import probe_environment, verdict
from sbxkit.cluster.resources import (
    MEMORY_MIB,
    SANDBOXES,
    declaration_problem,
    declared,
    fits,
    job_resources,
    node_resources,
    node_slots,
)
from sbxkit.cluster.seal import BATCH_ID_BYTES, Forged, Keys, context, new_batch_id
from sbxkit.cluster.secret import (
    MIN_SECRET_BYTES,
    SECRET_ENV,
    SECRET_FILE_ENV,
    file_problem,
    length_problem,
    load_secret,
)
from sbxkit.cluster.wire import (
    AgentTerms,
    Done,
    JoinRefused,
    NodeReport,
    RemoteJob,
    Unsealed,
    decode_job,
    decode_join_reply,
    decode_outcome,
    decode_reply,
    decode_terms,
    encode,
)
from sbxkit.errors import EngineUnavailable, SpecError

SPEC = SandboxSpec(
    image="sbxkit-test/python:latest",
    command=["true"],
    limits=Limits(cpus=0.5, memory_bytes=64 * MiB, pids=32, output_bytes=MiB, timeout_s=10),
)

# --- resources ----------------------------------------------------------------------------------


def test_a_job_asks_for_one_sandbox_and_its_memory_in_whole_mib() -> None:
    assert job_resources(Need(64 * MiB, 0)) == {SANDBOXES: 1, MEMORY_MIB: 64}
    assert job_resources(Need(64 * MiB + 1, 0))[MEMORY_MIB] == 65  # rounded up, never under
    assert job_resources(Need(0, 0))[MEMORY_MIB] == 1


def test_a_node_runs_as_many_jobs_at_once_as_its_sandboxes_and_cpus_allow() -> None:
    """Each running relay is a Ray worker process holding a CPU: a 2-core node advertising 64
    sandboxes runs 2 at once (the rest wait in Ray), not 64 workers."""
    assert node_slots({SANDBOXES: 64.0, MEMORY_MIB: 1024.0, "CPU": 2.0}) == 2
    assert node_slots({SANDBOXES: 4.0, MEMORY_MIB: 1024.0, "CPU": 8.0}) == 4
    assert node_slots({SANDBOXES: 4.0, MEMORY_MIB: 1024.0}) == 0


def test_a_node_advertises_its_supervisor_budget() -> None:
    gib = 1024 * MiB
    # The supervisor's default: MemTotal less the larger of 1 GiB and 10 %.
    assert node_resources(max_workers=64, mem_total=24 * gib) == {
        SANDBOXES: 64,
        MEMORY_MIB: (24 * gib - 24 * gib // 10) // MiB,
    }
    assert node_resources(max_workers=8, mem_total=0, memory_budget_bytes=2 * gib) == {
        SANDBOXES: 8,
        MEMORY_MIB: 2048,
    }


def test_declarations() -> None:
    assert declared({"CPU": 4.0}) is None  # not a sandbox node (the head, say)
    assert declared({"CPU": 4.0, SANDBOXES: 4.0}) == {SANDBOXES: 4.0, "CPU": 4.0}
    assert declared({SANDBOXES: 4.0}) == {SANDBOXES: 4.0, "CPU": 0.0}
    problem = declaration_problem({SANDBOXES: 4.0, "CPU": 4.0})
    assert problem is not None
    assert MEMORY_MIB in problem
    assert declaration_problem({SANDBOXES: 4.0, MEMORY_MIB: 1024.0, "CPU": 1.0}) is None
    # A relay holds a CPU while its job runs: a node with none could run nothing.
    no_cpu = declaration_problem({SANDBOXES: 4.0, MEMORY_MIB: 1024.0, "CPU": 0.0})
    assert no_cpu is not None
    assert "CPU=0" in no_cpu
    assert "--num-cpus" in no_cpu
    assert fits({SANDBOXES: 1, MEMORY_MIB: 512}, {SANDBOXES: 4, MEMORY_MIB: 1024})
    assert not fits({SANDBOXES: 1, MEMORY_MIB: 2048}, {SANDBOXES: 4, MEMORY_MIB: 1024})


# --- joining ------------------------------------------------------------------------------------


def report(name: str, **changes: Any) -> NodeReport:
    base = NodeReport(
        node_id=f"{name}-id", name=name, implementation="impl", engine="unix:///x", agent_pid=1
    )
    return msgspec.structs.replace(base, **changes)


def test_the_reference_is_a_strict_majority_of_the_nodes_that_have_the_image() -> None:
    reports = [
        report("a", images={"img": "sha256:1", "other": None}),
        report("b", images={"img": "sha256:1", "other": "sha256:9"}),
        report("c", images={"img": "sha256:2", "other": None}),
    ]
    assert image_reference(reports) == {"img": "sha256:1", "other": "sha256:9"}
    tie = [report("a", images={"img": "sha256:1"}), report("b", images={"img": "sha256:2"})]
    assert image_reference(tie) == {"img": None}
    assert image_reference([report("a", images={"img": None})]) == {}  # nobody has it


def test_each_refusal_names_the_node_and_what_to_fix() -> None:
    reference = {"img": "sha256:1"}
    reports = [
        report("ok", images={"img": "sha256:1"}),
        report("noengine", engine_error="Docker engine at /x is unavailable: refused"),
        report("stale", images={"img": "sha256:2"}),
        report("lacks", images={"img": None}),
        report("other", implementation="older", images={"img": "sha256:1"}),
        report("nosup", images={"img": "sha256:1"}, supervisor_error="unsafe state dir"),
        report("badconf", config_error="SBXKIT_NODE_PROFILE: no such file"),
    ]
    accepted, refused = judge(reports, implementation="impl", reference=reference)
    # A node lacking an image is not refused: that image's jobs are placed elsewhere.
    assert [r.name for r in accepted] == ["ok", "lacks"]
    why = {r.name: str(r) for r in refused}
    assert set(why) == {"noengine", "stale", "other", "nosup", "badconf"}
    assert "its own configuration: SBXKIT_NODE_PROFILE" in why["badconf"]
    assert "node noengine" in why["noengine"]
    assert "no Docker engine" in why["noengine"]
    assert "'img' differs" in why["stale"]
    assert "sha256:2" in why["stale"]
    assert "different sbxkit" in why["other"]
    assert "supervisor" in why["nosup"]


def test_without_a_majority_no_holder_is_accepted() -> None:
    reports = [report("a", images={"img": "sha256:1"}), report("b", images={"img": "sha256:2"})]
    accepted, refused = judge(reports, implementation="impl", reference=image_reference(reports))
    assert accepted == []
    assert all("no majority" in str(r) for r in refused)


# --- the batch's accounting ---------------------------------------------------------------------


def test_jobs_go_in_order_within_parallel() -> None:
    d = Dispatch(5, parallel=3, retries=1, previous=[0] * 5)
    assert [d.next(capacity=8), d.next(capacity=8), d.next(capacity=8)] == [0, 1, 2]
    assert d.next(capacity=8) is None  # parallel=3
    d.finished(0)
    assert d.next(capacity=8) == 3


def test_work_beyond_the_nodes_capacity_waits_in_ray_as_demand() -> None:
    """Relays beyond what the accepted nodes hold are submitted (Ray queues them against the
    sbxkit resources: its resource demand), as many again as the capacity, at least
    AHEAD_MIN; never beyond parallel."""
    d = Dispatch(100, parallel=100, retries=0, previous=[0] * 100)
    submitted = []
    while (index := d.next(capacity=0)) is not None:  # no accepted node yet: demand all the same
        submitted.append(index)
    assert submitted == list(range(AHEAD_MIN))
    while (index := d.next(capacity=8)) is not None:
        submitted.append(index)
    assert len(submitted) == 16  # 8 running, 8 waiting in Ray
    assert len(d.in_flight) == 16
    small = Dispatch(10, parallel=3, retries=0, previous=[0] * 10)
    assert [small.next(capacity=8) for _ in range(4)] == [0, 1, 2, None]


def test_a_lost_attempt_is_retried_first_then_ends_when_retries_are_used_up() -> None:
    d = Dispatch(3, parallel=1, retries=1, previous=[0, 0, 0])
    assert d.next(capacity=1) == 0
    assert d.lost(0) is True  # retried...
    assert d.next(capacity=1) == 0  # ...before the jobs behind it
    assert d.attempt(0) == 2
    assert d.lost(0) is False  # retries used up: the job ends
    assert d.next(capacity=1) == 1
    d.finished(1)
    assert d.next(capacity=1) == 2
    d.finished(2)
    assert d.all_ended


def test_not_placed_is_not_an_attempt_and_resumes_count_on() -> None:
    d = Dispatch(1, parallel=1, retries=0, previous=[2])  # two lost lines in the results
    assert d.next(capacity=1) == 0
    assert d.attempt(0) == 3
    d.not_placed(0)
    assert d.next(capacity=1) == 0
    assert d.attempt(0) == 3
    d.finished(0)
    assert d.all_ended


def test_skipped_jobs_end_without_an_attempt() -> None:
    d = Dispatch(2, parallel=2, retries=0, previous=[0, 0])
    d.skip(0)
    assert d.next(capacity=2) == 1
    d.finished(1)
    assert d.all_ended


@pytest.mark.parametrize("retries", [-1, 1.5, True])
def test_bad_retries_are_refused(retries: Any) -> None:
    with pytest.raises(SpecError, match="retries"):
        Dispatch(1, parallel=1, retries=retries, previous=[0])


# --- the wire and image content -----------------------------------------------------------------


def exited(stdout: bytes) -> RunResult:
    return RunResult(
        status="exited",
        exit_code=0,
        stdout=stdout,
        stderr=b"",
        overflowed=None,
        container_id="c" * 64,
        lease="l",
        timings=PhaseTimings(run_s=0.5),
    )


def test_jobs_and_outcomes_cross_as_bytes() -> None:
    job = RemoteJob(id=7, spec=SPEC, stdin=b"\x00in", attempt=2)
    assert decode_job(encode(job)) == job
    done = Done(job=JobResult(id="a", result=exited(b"out\xff")), node="raya", node_id="n1")
    assert decode_outcome(encode(done)) == done
    assert decode_join_reply(encode(JoinRefused(reason="no secret"))) == JoinRefused(
        reason="no secret"
    )
    assert decode_reply(encode(Unsealed(reason="x"))) == Unsealed(reason="x")


def test_the_driver_sends_a_node_no_policy() -> None:
    """What an agent is started with carries labels, not settings: nothing the driver sends
    can switch on bind mounts or anything else a node allows."""
    assert set(AgentTerms.__struct_fields__) == {"batch_id", "labels", "capacity_wait_s"}
    widened = {"batch_id": b"b" * 16, "labels": {}, "capacity_wait_s": 1.0}
    widened["settings"] = {"enable_bind_mounts": True}
    with pytest.raises(msgspec.ValidationError, match="settings"):
        decode_terms(msgspec.msgpack.encode(widened))


def test_a_nodes_settings_are_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NODE_PROFILE_ENV, raising=False)
    monkeypatch.setenv("SBXKIT_LABELS", "node=own,shared=node")
    own = node_settings({"shared": "driver", "run": "r1"})
    assert own.enable_bind_mounts is False
    assert own.enable_named_volumes is False
    assert own.labels == {"shared": "node", "run": "r1", "node": "own"}  # the node's win
    profile = tmp_path / "node.toml"
    profile.write_text("[sandbox.docker]\nenable_bind_mounts = true\n")
    monkeypatch.setenv(NODE_PROFILE_ENV, str(profile))
    assert node_settings({}).enable_bind_mounts is True  # the node's operator may


# --- the seals ----------------------------------------------------------------------------------

SECRET = b"s" * MIN_SECRET_BYTES


def test_a_sealed_message_opens_only_where_it_was_bound() -> None:
    batch = new_batch_id()
    keys = Keys(SECRET, batch)
    sealed = keys.seal("outcome", context(3, 1), b"result")
    assert Keys(SECRET, batch).open("outcome", context(3, 1), sealed) == b"result"
    assert b"result" not in sealed  # encrypted, not only signed
    forged = {
        "another secret": lambda: Keys(b"t" * 32, batch).open("outcome", context(3, 1), sealed),
        "another batch": lambda: Keys(SECRET, new_batch_id()).open(
            "outcome", context(3, 1), sealed
        ),
        "another purpose": lambda: keys.open("report", context(3, 1), sealed),
        "another attempt": lambda: keys.open("outcome", context(3, 2), sealed),
        "another job": lambda: keys.open("outcome", context(4, 1), sealed),
        "one bit changed": lambda: keys.open(
            "outcome", context(3, 1), sealed[:-1] + bytes([sealed[-1] ^ 1])
        ),
        "truncated": lambda: keys.open("outcome", context(3, 1), sealed[:20]),
        "not sealed at all": lambda: keys.open("outcome", context(3, 1), b"result"),
    }
    for attempt in forged.values():
        with pytest.raises(Forged):  # each of them
            attempt()
    assert keys.seal("job", b"", b"x") != keys.seal("job", b"", b"x")  # a fresh nonce each
    assert len(batch) == BATCH_ID_BYTES
    with pytest.raises(ValueError, match="a batch id has 16 bytes"):
        Keys(SECRET, b"short")


def test_contexts_are_unambiguous() -> None:
    assert context(12, 3) != context(1, 23)
    assert context(b"ab", "c") != context(b"a", "bc")


# --- the cluster secret -------------------------------------------------------------------------


def test_a_secret_is_long_enough() -> None:
    assert length_problem(b"x" * MIN_SECRET_BYTES) is None
    short = length_problem(b"x" * (MIN_SECRET_BYTES - 1))
    assert short is not None
    assert "too short (31 bytes; at least 32)" in short
    assert "secrets.token_hex(32)" in short  # says how to make one


def test_a_secret_file_is_its_owners_alone() -> None:
    me = 1000
    assert file_problem(stat.S_IFREG | 0o600, me, me) is None
    assert file_problem(stat.S_IFREG | 0o400, 0, me) is None  # root's, say a mounted secret
    group = file_problem(stat.S_IFREG | 0o640, me, me)
    assert group is not None
    assert "mode 0640" in group
    assert "chmod 600" in group
    world = file_problem(stat.S_IFREG | 0o604, me, me)
    assert world is not None
    assert "mode 0604" in world
    other = file_problem(stat.S_IFREG | 0o600, 1001, me)
    assert other is not None
    assert "uid 1001" in other
    assert file_problem(stat.S_IFIFO | 0o600, me, me) == "is not a regular file"


def test_load_secret_refuses_by_name(tmp_path: Path) -> None:
    def refused(environ: dict[str, str]) -> SpecError:
        with pytest.raises(SpecError) as caught:
            load_secret(environ)
        return caught.value

    assert refused({}).field == SECRET_FILE_ENV  # missing
    assert "is not set" in str(refused({}))
    assert refused({SECRET_ENV: "short"}).field == SECRET_ENV
    good = tmp_path / "secret"
    good.write_text("k" * 64 + "\n")
    os.chmod(good, 0o600)
    assert load_secret({SECRET_FILE_ENV: str(good)}) == b"k" * 64  # the newline stripped
    assert load_secret({SECRET_ENV: "v" * 40}) == b"v" * 40
    both = refused({SECRET_FILE_ENV: str(good), SECRET_ENV: "v" * 40})
    assert "both set" in str(both)
    os.chmod(good, 0o644)
    readable = refused({SECRET_FILE_ENV: str(good)})
    assert (readable.field, "mode 0644" in str(readable)) == (SECRET_FILE_ENV, True)
    short = tmp_path / "short"
    short.write_text("k" * 10)
    os.chmod(short, 0o600)
    assert "too short" in str(refused({SECRET_FILE_ENV: str(short)}))
    assert "absolute" in str(refused({SECRET_FILE_ENV: "secret"}))
    assert "cannot be opened" in str(refused({SECRET_FILE_ENV: str(tmp_path / "none")}))


# --- asking the cluster about token authentication ---------------------------------------------


def test_the_probe_runs_without_any_token() -> None:
    environ = {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": "t",
        "RAY_AUTH_TOKEN_PATH": "/t",
        "PATH": "/bin",
    }
    assert probe_environment(environ) == {"RAY_AUTH_MODE": "disabled", "PATH": "/bin"}


def test_only_a_refusal_for_authentication_counts_as_enforced() -> None:
    assert verdict(0, 'noise\n{"enforced": true, "said": "x"}\n') is True
    assert verdict(0, '{"enforced": false}') is False
    assert verdict(0, '{"error": "ConnectionError: gone"}') == "ConnectionError: gone"
    assert "without a verdict" in str(verdict(1, "Traceback ..."))
    assert "without a verdict" in str(verdict(0, ""))


def test_image_content_is_its_layers_and_run_configuration() -> None:
    layers = ["sha256:aa", "sha256:bb"]
    config = {"Cmd": ["sh"], "Env": ["PATH=/bin"], "User": "", "Labels": {"built": "monday"}}
    same = content_fingerprint(layers, {**config, "Labels": {"built": "tuesday"}})
    assert content_fingerprint(layers, config) == same  # labels, dates, IDs: not content
    assert content_fingerprint(layers[:1], config) != same
    assert content_fingerprint(layers, {**config, "Env": ["PATH=/usr/bin"]}) != same


# --- result lines of attempts -------------------------------------------------------------------


def test_a_lost_attempt_has_its_own_line_and_leaves_the_job_to_run() -> None:
    lost = JobResult(
        id="a",
        error=JobError(type="NodeLost", message="node rayb died"),
        node="rayb",
        attempt=1,
        lost=True,
    )
    final = JobResult(id="a", result=exited(b""), node="raya", attempt=2)
    lines = [json.loads(encode_result(d, cluster=True)) for d in (lost, final)]
    assert [(x["status"], x["node"], x["attempt"]) for x in lines] == [
        ("lost", "rayb", 1),
        ("exited", "raya", 2),
    ]
    scan = scan_results(encode_result(lost, cluster=True))
    assert scan.done == set()
    assert scan.lost == {"a": 1}
    scan = scan_results(encode_result(lost, cluster=True) + encode_result(final, cluster=True))
    assert scan.done == {"a"}
    assert scan.lost == {"a": 1}
    assert "node" not in json.loads(encode_result(final))  # local lines are as they were


def test_progress_counts_a_lost_attempt_apart() -> None:
    progress = Progress(1, 0, sys.stderr, enabled=False)
    progress.start("a")
    progress.record(JobResult(id="a", error=JobError(type="NodeLost", message="x"), lost=True))
    assert (progress.done, progress.lost, progress.errors, progress.running) == (0, 1, 0, 0)


# --- refusals before anything runs --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"address": ""}, "cluster.address"),
        ({"address": "h:1", "retries": -1}, "cluster.retries"),
        ({"address": "h:1", "join_timeout_s": 0}, "cluster.join_timeout_s"),
        ({"address": "h:1", "nodes": "raya"}, "cluster.nodes"),
        ({"address": "h:1", "nodes": []}, "cluster.nodes"),
    ],
)
def test_bad_cluster_options_are_refused(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as caught:
        RayCluster(**kwargs)
    assert caught.value.field == field


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def run_jobs(self, batch: ClusterBatch) -> list[Any]:
        self.calls.append({**vars(batch), "jobs": list(batch.jobs), "needs": list(batch.needs)})
        return []


async def test_run_many_hands_a_cluster_batch_over_whole() -> None:
    recorder = _Recorder()
    jobs = [Job(id="a", spec=SPEC), Job(id="b", spec=SPEC, stdin=b"x")]
    settings = Settings(labels={"k": "v"})
    await run_many(jobs, parallel=3, cluster=recorder, settings=settings, capacity_wait_s=5)
    (call,) = recorder.calls
    assert [job.id for job in call["jobs"]] == ["a", "b"]
    assert call["needs"] == [Need(64 * MiB, 500_000_000)] * 2
    assert (call["parallel"], call["settings"], call["capacity_wait_s"]) == (3, settings, 5)


@pytest.mark.parametrize(
    "local",
    [{"socket_path": "/x"}, {"host_memory_bytes": MiB}, {"owner_factory": lambda e: None}],
)
async def test_run_many_refuses_local_options_beside_a_cluster(local: dict[str, Any]) -> None:
    recorder = _Recorder()
    with pytest.raises(SpecError, match=f"cluster: .*{next(iter(local))}"):
        await run_many([Job(id="a", spec=SPEC)], parallel=1, cluster=recorder, **local)
    assert recorder.calls == []


def test_ray_missing_is_named_with_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from sbxkit.cluster.driver import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SpecError, match=r"pip install '\.\[ray\]' in the sbxkit clone"):
        import_ray()


def test_cluster_unavailable_is_an_engine_unavailable() -> None:
    error = ClusterUnavailable("h:1", "no node can run the batch: node a refused")
    assert isinstance(error, EngineUnavailable)  # sbxkit batch exits 69
    assert str(error) == "Ray cluster at h:1: no node can run the batch: node a refused"
    assert isinstance(ClusterUnauthenticated("h:1", "x"), ClusterUnavailable)
    assert sbxkit.RayCluster is RayCluster


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--pool"], "--pool"),
        (["--socket", "/x"], "--socket"),
        (["--memory-budget", "1g"], "--memory-budget"),
    ],
)
def test_batch_refuses_local_flags_beside_ray(tmp_path: Path, flags: list[str], named: str) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("")
    out = subprocess.run(
        [
            *(sys.executable, "-m", "sbxkit", "batch", str(jobs)),
            *("--out", str(tmp_path / "r"), "--ray", "127.0.0.1:9", *flags),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert f"--ray: runs each job on a node's own engine; {named}" in out.stderr
    assert not (tmp_path / "r").exists()


def test_cluster_resources_prints_the_json_for_ray_start() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sbxkit",
            "cluster",
            "resources",
            "--memory-budget",
            "2g",
            "--max-workers",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {SANDBOXES: 8, MEMORY_MIB: 2048}
