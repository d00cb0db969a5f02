"""Pre-started single-use sandboxes (sbxkit/pool/inprocess.py) on the real engine.

A pooled run is the cold run's contract: stdin byte-exact (sizes around the pipe buffer and
line boundaries), env passed at the claim and never in the create body, the time limit from
the claim, the same caps, exit statuses and verdicts; a container is never handed to a second
claim; everything is removed when the pool closes (the autouse witness checks), and what
cannot ride in one line runs cold.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
import trio

import sbxkit
from sbxkit._consumers.harness import Job, run_many
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from sbxkit.pool import Pool, claim_line, open_pool
from tests.engine.helpers import assert_oom_outcome, spec
from tests.speed import bound
from tests.witness import RUN_LABEL, THIS_RUN, Witness

SIZES = [0, 1, 4095, 4096, 4097, 65535, 65536, 65537, 200_000]


def backend_of(engine: Engine) -> DockerBackend:
    return DockerBackend(engine=engine)


async def wait_ready(pool: Pool, count: int) -> None:
    with trio.fail_after(30):
        while len(pool.parking.ready) < count:  # noqa: ASYNC110 - the pool's own state, polled
            await trio.sleep(0.02)


async def test_stdin_reaches_the_payload_byte_exact(engine: Engine, busybox: str) -> None:
    digest = spec(busybox, "cat >/tmp/in; sha256sum </tmp/in | cut -d' ' -f1; wc -c </tmp/in")
    async with open_pool(digest, size=2, backend=backend_of(engine)) as pool:
        for size in SIZES:
            await wait_ready(pool, 1)
            data = bytes((i * 7 + 3) % 256 for i in range(size))
            result = await pool.run(digest, data)
            assert result.pooled, size
            digest_line, count = result.stdout.split(b"\n")[:2]
            assert digest_line.decode() == hashlib.sha256(data).hexdigest(), size
            assert int(count) == size
        # Lines in stdin are the payload's, not the parked shell's: only the claim line is read.
        await wait_ready(pool, 1)
        lines = await pool.run(spec(busybox, "cat"), b"first\nexport X=1; exec false\n\nlast")
        assert lines.pooled
        assert lines.stdout == b"first\nexport X=1; exec false\n\nlast"


async def test_env_rides_in_the_claim_not_in_the_create_body(
    engine: Engine, busybox: str, witness: Witness
) -> None:
    shape = spec(busybox, "true")
    secret = "s3cr3t 'quoted' $HOME `id` \\ done"
    env_spec = msgspec.structs.replace(
        spec(busybox, 'printf "%s|%s" "$TOKEN" "$SBXKIT_LEASE"'), env={"TOKEN": secret}
    )
    async with open_pool(shape, size=1, backend=backend_of(engine)) as pool:
        await wait_ready(pool, 1)
        parked = pool.parking.ready[0].box.container_id
        config_env = witness.get(f"/containers/{parked}/json")["Config"]["Env"]
        assert not any(secret in item for item in config_env)
        result = await pool.run(env_spec)
    assert result.pooled
    token, lease = result.stdout.decode().split("|")
    assert token == secret
    assert lease == result.lease  # the runtime's own variable still names this sandbox


async def test_exit_status_timeout_overflow_and_oom_are_the_cold_runs(
    engine: Engine, busybox: str, python_image: str, witness: Witness
) -> None:
    async with open_pool(spec(busybox, "true"), size=2, backend=backend_of(engine)) as pool:
        await wait_ready(pool, 1)
        exited = await pool.run(spec(busybox, "echo out; echo err >&2; exit 7"))
        assert (exited.pooled, exited.status, exited.exit_code) == (True, "exited", 7)
        assert (exited.stdout, exited.stderr) == (b"out\n", b"err\n")
        await wait_ready(pool, 1)
        slow = await pool.run(spec(busybox, "sleep 30", timeout_s=1.0))
        assert (slow.pooled, slow.status, slow.exit_code) == (True, "timed_out", None)
        assert slow.timings.run_s < bound(10.0, ceiling=25.0)  # below the payload's 30 s
        await wait_ready(pool, 1)
        loud = await pool.run(spec(busybox, "yes", output_bytes=1000))
        assert (loud.pooled, loud.status, loud.overflowed) == (True, "output_exceeded", "stdout")
        assert len(loud.stdout) == 1000
    oom_spec = spec(python_image, 'python3 -c "x = bytearray(512 * 2**20)"')
    async with open_pool(oom_spec, size=1, backend=backend_of(engine)) as pool:
        await wait_ready(pool, 1)
        oom = await pool.run(oom_spec)
    assert oom.pooled
    assert_oom_outcome(oom, witness)


async def test_the_time_limit_starts_at_the_claim(engine: Engine, busybox: str) -> None:
    job = spec(busybox, "sleep 1; echo done", timeout_s=2.0)
    async with open_pool(job, size=1, backend=backend_of(engine)) as pool:
        await wait_ready(pool, 1)
        await trio.sleep(2.5)  # parked longer than the run's whole limit
        result = await pool.run(job)
    assert (result.pooled, result.status, result.stdout) == (True, "exited", b"done\n")


async def test_a_container_is_never_claimed_twice(engine: Engine, busybox: str) -> None:
    job = spec(busybox, "cat /proc/sys/kernel/random/boot_id >/dev/null; hostname")
    async with open_pool(job, size=2, backend=backend_of(engine)) as pool:
        results = []
        for _ in range(5):
            await wait_ready(pool, 1)
            results.append(await pool.run(job, wait_for_removal=True))
    assert all(r.pooled for r in results)
    assert len({r.container_id for r in results}) == 5
    assert len({r.stdout for r in results}) == 5  # five hostnames: five containers
    assert all(r.timings.remove_s > 0 for r in results)


async def test_runs_on_an_empty_pool_wait_for_its_parks_under_way_not_more(
    engine: Engine, busybox: str
) -> None:
    """Three runs the moment a pool of two opens: two wait for the two parks under way (each
    further along than a cold create), the third has none to wait for and runs cold."""
    job = spec(busybox, "echo done")
    async with open_pool(job, size=2, backend=backend_of(engine), refill=False) as pool:
        results: list[sbxkit.RunResult] = []

        async def one() -> None:
            results.append(await pool.run(job, wait_for_removal=True))

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)
    assert sorted(r.pooled for r in results) == [False, True, True]
    assert [r.stdout for r in results] == [b"done\n"] * 3


async def test_a_batchs_first_jobs_wait_for_their_shapes_parks_instead_of_running_cold(
    engine: Engine, busybox: str, python_image: str
) -> None:
    """Two shapes, two jobs each, two at a time: the batch's pools start parking as it starts,
    and each job waits for a park of its shape under way rather than creating a second
    container (every job ran cold before)."""
    jobs = [
        Job(id=f"{image}-{i}", spec=spec(image, "true"))
        for i in range(2)
        for image in (busybox, python_image)
    ]
    done = await run_many(jobs, parallel=2, pool=sbxkit.PoolPerShape(), engine=engine)
    assert all(j.result is not None and j.result.ok for j in done), done
    assert sum(1 for j in done if j.result is not None and j.result.pooled) >= 3


async def test_what_the_pool_cannot_serve_runs_cold(engine: Engine, busybox: str) -> None:
    shape = spec(busybox, "true")
    other_shape = spec(busybox, "true", memory_bytes=96 * sbxkit.MiB)
    too_long = spec(busybox, "true", timeout_s=120.0)
    async with open_pool(shape, size=1, backend=backend_of(engine), max_timeout_s=60) as pool:
        await wait_ready(pool, 1)
        for job in (other_shape, too_long):
            result = await pool.run(job)
            assert (result.pooled, result.status) == (False, "exited"), job
        assert len(pool.parking.ready) == 1  # none of them took the parked container
    assert claim_line(["-x"], {}) is None
    assert claim_line(["echo", "x"], {"K": "v"}) == b"unset PWD OLDPWD SHLVL; K=v exec echo x\n"


async def test_newlines_ride_spliced_in_the_claim_line(engine: Engine, busybox: str) -> None:
    script = 'printf "%s|%s" "$V" "$1"\nprintf "|two lines"'
    job = msgspec.structs.replace(
        spec(busybox, "true"), command=["sh", "-c", script, "sh", "a\r\nb"], env={"V": "x\ny"}
    )
    async with open_pool(job, size=1, backend=backend_of(engine)) as pool:
        await pool.wait_ready(1)
        result = await pool.run(job)
    assert result.pooled
    assert result.stdout == b"x\ny|a\r\nb|two lines"


async def test_an_idle_container_is_removed_at_its_ttl_and_replaced(
    engine: Engine, busybox: str, witness: Witness
) -> None:
    job = spec(busybox, "true")
    async with open_pool(job, size=1, backend=backend_of(engine), idle_ttl_s=1.0) as pool:
        await wait_ready(pool, 1)
        first = pool.parking.ready[0].box.lease
        assert witness.containers(label=f"sbxkit.lease={first}")  # positive control
        with trio.fail_after(30):
            while not pool.parking.ready or pool.parking.ready[0].box.lease == first:  # noqa: ASYNC110
                await trio.sleep(0.05)
        with trio.fail_after(10):
            while witness.containers(label=f"sbxkit.lease={first}"):  # noqa: ASYNC110
                await trio.sleep(0.05)


async def test_a_claimed_run_may_outlast_the_idle_ttl(engine: Engine, busybox: str) -> None:
    """The idle limit ends at the claim: a run that goes on past it keeps its container (the
    parked time limit covers the idle wait plus the longest claimed run)."""
    job = spec(busybox, "sleep 4; echo finished")
    async with open_pool(job, size=1, backend=backend_of(engine), idle_ttl_s=2.0) as pool:
        await wait_ready(pool, 1)
        result = await pool.run(job)
    assert result.pooled
    assert (result.status, result.stdout) == ("exited", b"finished\n"), result


async def test_a_cancelled_claim_removes_its_container_before_it_returns(
    engine: Engine, busybox: str, witness: Witness
) -> None:
    job = spec(busybox, "sleep 30")
    async with open_pool(job, size=1, backend=backend_of(engine)) as pool:
        await wait_ready(pool, 1)
        claimed = pool.parking.ready[0].box.lease
        assert witness.containers(label=f"sbxkit.lease={claimed}")  # positive control
        with trio.move_on_after(0.5) as scope:
            await pool.run(job)
        assert scope.cancelled_caught
        assert witness.containers(label=f"sbxkit.lease={claimed}") == []


async def test_an_in_process_owner_serves_a_pool_too(engine: Engine, busybox: str) -> None:
    job = spec(busybox, "echo owned")
    backend = DockerBackend(engine=engine, owner=InProcessOwner(engine))
    async with open_pool(job, size=1, backend=backend) as pool:
        await wait_ready(pool, 1)
        result = await pool.run(job)
    assert (result.pooled, result.stdout) == (True, b"owned\n")


@pytest.mark.parametrize(
    ("size", "ttl", "field"),
    [(0, 10.0, "pool.size"), (True, 10.0, "pool.size"), (1, float("inf"), "pool.idle_ttl")],
)
async def test_bad_pool_settings_are_refused_before_anything_runs(
    engine: Engine, busybox: str, size: int, ttl: float, field: str
) -> None:
    with pytest.raises(SpecError) as caught:
        async with open_pool(spec(busybox, "true"), size=size, idle_ttl_s=ttl):
            pass
    assert caught.value.field == field


async def test_run_many_claims_from_a_pool(engine: Engine, busybox: str) -> None:
    job_spec = spec(busybox, 'echo "job $N"')
    jobs = [Job(id=n, spec=msgspec.structs.replace(job_spec, env={"N": str(n)})) for n in range(6)]
    backend = backend_of(engine)
    async with open_pool(job_spec, size=2, backend=backend) as pool:
        await pool.wait_ready()
        results = await run_many(jobs, parallel=2, backend=backend, pool=pool)
        with trio.fail_after(30):
            await pool.wait_ready()  # the batch parked only for itself; the pool refills now
    assert [r.result.stdout if r.result else r.error for r in results] == [
        f"job {n}\n".encode() for n in range(6)
    ]
    assert any(r.result is not None and r.result.pooled for r in results)


@pytest.mark.parametrize("how", ["flag", "profile"])
def test_sbxkit_batch_pool_claims_pre_started_sandboxes_of_every_shape(
    witness: Witness, busybox: str, python_image: str, tmp_path: Path, how: str
) -> None:
    # Two shapes (two images), alternating; the first job of each holds its slot long enough
    # for the pools to park containers for the jobs behind it.
    limits = {"cpus": 0.5, "memory_bytes": 64 * 2**20, "pids": 64, "output_bytes": 4096}
    images = [busybox, python_image]
    lines = [
        {"id": n, "image": images[n % 2]}
        | {"command": ["sh", "-c", f"sleep {2 if n < 2 else 0.3}; echo {n}"]}
        | {"limits": {**limits, "timeout_s": 20}}
        for n in range(6)
    ]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(b"".join(msgspec.json.encode(line) + b"\n" for line in lines))
    out = tmp_path / "out.jsonl"
    pool_args = ["--pool"]
    if how == "profile":
        profile = tmp_path / "pool.toml"
        profile.write_text("[sandbox.docker]\n[sandbox.docker.pool]\nsize = 2\nidle_ttl = 60\n")
        pool_args = ["--profile", str(profile)]
    done = subprocess.run(
        [
            *(sys.executable, "-m", "sbxkit", "batch", str(jobs), "--out", str(out)),
            *("--parallel", "2", "--socket", witness.socket_path, "--no-progress"),
            *pool_args,
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = [msgspec.json.decode(line) for line in out.read_bytes().splitlines()]
    assert sorted((r["id"], r["stdout"]) for r in results) == [(n, f"{n}\n") for n in range(6)]
    assert any(r["pooled"] for r in results if r["id"] % 2 == 0), results  # the first shape
    assert any(r["pooled"] for r in results if r["id"] % 2 == 1), results  # and the second


def created_and_destroyed(witness: Witness, since: float) -> tuple[int, int]:
    """This session's container create and destroy events since ``since``, from the daemon."""
    events = witness.events(
        since,
        time.time(),
        type=["container"],
        event=["create", "destroy"],
        label=[f"{RUN_LABEL}={THIS_RUN}"],
    )
    actions = [e.get("Action") or e.get("status") for e in events]
    return actions.count("create"), actions.count("destroy")


@pytest.mark.parametrize("how", ["open_pool", "PoolPerShape"])
async def test_a_pooled_batch_creates_one_container_per_job_and_no_more(
    witness: Witness, engine: Engine, busybox: str, how: str
) -> None:
    """A batch through a pool parks only for jobs still to claim: N jobs through a pool of P
    create exactly N containers, counted in the daemon's events (a pool kept full to the end
    created and removed P more, unused, when the batch ended)."""
    jobs_n, size = 12, 4
    job_spec = spec(busybox, 'echo "job $N"')
    jobs = [
        Job(id=n, spec=msgspec.structs.replace(job_spec, env={"N": str(n)})) for n in range(jobs_n)
    ]
    backend = backend_of(engine)
    since = time.time()
    if how == "open_pool":
        async with open_pool(job_spec, size=size, backend=backend) as pool:
            results = await run_many(jobs, parallel=size, backend=backend, pool=pool)
    else:
        per_shape = sbxkit.PoolPerShape(size=size)
        results = await run_many(jobs, parallel=size, backend=backend, pool=per_shape)
    assert [r.result.stdout if r.result else r.error for r in results] == [
        f"job {n}\n".encode() for n in range(jobs_n)
    ]
    assert any(r.result is not None and r.result.pooled for r in results)
    assert witness.wait_until_no_sbxkit_containers(10) == []
    assert created_and_destroyed(witness, since) == (jobs_n, jobs_n)


async def test_a_batchs_refill_waits_for_the_claimed_run_to_end(
    witness: Witness, engine: Engine, busybox: str
) -> None:
    """A batch's refill yields to its claims: a claimed container is replaced when its run has
    ended, not while it runs. One job at a time through a pool of one, each sleeping 4 s: in
    the middle of each run the daemon holds that run's container and no other (the pool
    parked a replacement beside every running claim before)."""
    job_spec = spec(busybox, "sleep 4; echo done", timeout_s=30)
    jobs = [Job(id=n, spec=job_spec) for n in range(2)]
    backend = backend_of(engine)
    started: list[trio.Event] = [trio.Event() for _ in jobs]
    alive_mid_run: list[int] = []
    label = f"{RUN_LABEL}={THIS_RUN}"

    async def look_mid_run() -> None:
        for event in started:
            await event.wait()
            await trio.sleep(2.5)
            alive = await trio.to_thread.run_sync(witness.containers, label)
            alive_mid_run.append(len(alive))

    async with open_pool(job_spec, size=1, backend=backend) as pool:
        await pool.wait_ready()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(look_mid_run)
            results = await run_many(
                jobs,
                parallel=1,
                backend=backend,
                pool=pool,
                on_start=lambda job_id: started[int(job_id)].set(),
            )
    assert [r.result.stdout if r.result else r.error for r in results] == [b"done\n"] * 2
    assert [r.result is not None and r.result.pooled for r in results] == [True, True]
    assert alive_mid_run == [1, 1]
