"""The cluster integration's pure parts, without Ray or a daemon: resources, the join verdict,
the batch's attempt accounting, the wire, image content, result lines of attempts, and the
refusals of bad options (the real cluster is tests/cluster/)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

import sbxkit
from sbxkit.cli.progress import Progress
from sbxkit.cli.results import encode_result, scan_results
from sbxkit.cluster import ClusterUnavailable, RayCluster
from sbxkit.cluster.dispatch import Dispatch
from sbxkit.cluster.images import content_fingerprint
from sbxkit.cluster.join import image_reference, judge
from sbxkit.cluster.resources import (
    MEMORY_MIB,
    SANDBOXES,
    declaration_problem,
    declared,
    fits,
    job_resources,
    node_resources,
)
from sbxkit.cluster.wire import Done, NodeReport, RemoteJob, decode_job, decode_outcome, encode
from sbxkit.errors import EngineUnavailable, SpecError
from sbxkit.harness import Job, JobError, JobResult, Need, run_many
from sbxkit.result import PhaseTimings, RunResult
from sbxkit.settings import Settings
from sbxkit.spec import Limits, MiB, SandboxSpec

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
    assert declared({"CPU": 4.0, SANDBOXES: 4.0}) == {SANDBOXES: 4.0}
    problem = declaration_problem({SANDBOXES: 4.0})
    assert problem is not None
    assert MEMORY_MIB in problem
    assert declaration_problem({SANDBOXES: 4.0, MEMORY_MIB: 1024.0}) is None
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
    assert image_reference([report("a", images={"img": None})]) == {"img": None}


def test_each_refusal_names_the_node_and_what_to_fix() -> None:
    reference = {"img": "sha256:1"}
    reports = [
        report("ok", images={"img": "sha256:1"}),
        report("noengine", engine_error="Docker engine at /x is unavailable: refused"),
        report("stale", images={"img": "sha256:2"}),
        report("missing", images={"img": None}),
        report("other", implementation="older", images={"img": "sha256:1"}),
        report("nosup", images={"img": "sha256:1"}, supervisor_error="unsafe state dir"),
    ]
    accepted, refused = judge(reports, implementation="impl", reference=reference)
    assert [r.name for r in accepted] == ["ok"]
    why = {r.name: str(r) for r in refused}
    assert set(why) == {"noengine", "stale", "missing", "other", "nosup"}
    assert "node noengine" in why["noengine"]
    assert "no Docker engine" in why["noengine"]
    assert "'img' differs" in why["stale"]
    assert "sha256:2" in why["stale"]
    assert "'img' is missing" in why["missing"]
    assert "never pulls" in why["missing"]
    assert "different sbxkit" in why["other"]
    assert "supervisor" in why["nosup"]


def test_without_a_majority_no_holder_is_accepted() -> None:
    reports = [report("a", images={"img": "sha256:1"}), report("b", images={"img": "sha256:2"})]
    accepted, refused = judge(reports, implementation="impl", reference=image_reference(reports))
    assert accepted == []
    assert all("no majority" in str(r) for r in refused)


# --- the batch's accounting ---------------------------------------------------------------------


def test_jobs_go_in_order_within_parallel_and_the_nodes_capacity() -> None:
    d = Dispatch(5, parallel=3, retries=1, previous=[0] * 5)
    assert d.next(capacity=0) is None  # no accepted node: nothing goes
    assert [d.next(capacity=2), d.next(capacity=2), d.next(capacity=2)] == [0, 1, None]
    assert d.next(capacity=8) == 2
    assert d.next(capacity=8) is None  # parallel=3
    d.finished(0)
    assert d.next(capacity=8) == 3


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
    done = Done(job=JobResult(id="a", result=exited(b"out\xff")), node="raya")
    assert decode_outcome(encode(done)) == done


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

    async def run_jobs(self, jobs: Sequence[Job], needs: Sequence[Need], **kw: Any) -> list[Any]:
        self.calls.append({"jobs": list(jobs), "needs": list(needs), **kw})
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
    with pytest.raises(SpecError, match=r"sbxkit\[ray\]"):
        import_ray()


def test_cluster_unavailable_is_an_engine_unavailable() -> None:
    error = ClusterUnavailable("h:1", "no node can run the batch: node a refused")
    assert isinstance(error, EngineUnavailable)  # sbxkit batch exits 69
    assert str(error) == "Ray cluster at h:1: no node can run the batch: node a refused"
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
