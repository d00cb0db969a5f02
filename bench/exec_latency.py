"""Benchmark ``exec_latency``: exec round trip (``true``) in a warm sandbox, three clients.

Contenders, interleaved round-robin in one trio program against **the same running container**
(one ``sbxkit.open_sandbox`` session, opened before the first round and removed after the last),
so the daemon-side work differs only by what each client asks for:

``sbxkit``
    ``await sandbox.exec(["true"])``: exec create, start (hijacked, demultiplexed), exec
    inspect — with sbxkit's process-group wrapper (``sh`` → ``setsid`` → ``sh`` → ``true``,
    then ``rm`` of the group record), the price of being able to kill the exec's whole group
    on a timeout.
``docker_py``
    docker-py's ``container.exec_run(["true"])`` (create, start, inspect) in a worker thread
    (``trio.to_thread.run_sync``), one ``DockerClient`` for the whole run.
``docker_exec``
    ``docker exec CONTAINER true`` as a subprocess (``trio.run_process``).
``sbxkit_bare`` (diagnostic)
    sbxkit's engine calls (``sbxkit.engine.execapi``) for a plain ``true``, without the
    wrapper: ``sbxkit/sbxkit_bare`` is the price of the process-group guarantee and
    ``sbxkit_bare/docker_py`` the client's.

Target (the issue): sbxkit ≤ 0.8 × docker-py, as a ratio of medians from one run. A missed
target is reported, not fatal; a failing contender or a leaked container is (exit status 1).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import trio

from bench import common
from bench.harness import (
    Contender,
    ContenderFailed,
    StepTimings,
    machine_facts,
    run_interleaved,
    say,
)
from bench.rawapi import RawEngine
from bench.suite import default_busybox, default_socket
from sbxkit._consumers.session import Sandbox, open_sandbox
from sbxkit._model.spec import LEASE_LABEL, Limits, MiB, SandboxSpec
from sbxkit.engine.client import Engine, open_engine
from sbxkit.engine.execapi import ExecCreate, exec_create, exec_inspect, exec_start

NAME = "exec_latency"
SUMMARY = "median exec `true` in a warm sandbox: sbxkit vs docker-py exec_run vs `docker exec`"

TARGET_RATIO = 0.80
"""sbxkit / docker-py, ratio of medians (the issue's target)."""

DEFAULT_ROUNDS = 50
QUICK_ROUNDS = 10
DEFAULT_WARMUP = 5
QUICK_WARMUP = 2
ROUND_COUNTS = common.RoundCounts(DEFAULT_ROUNDS, DEFAULT_WARMUP, QUICK_ROUNDS, QUICK_WARMUP)
DEFAULT_ORDER = ("sbxkit", "docker_py", "docker_exec", "sbxkit_bare")
BENCH_LABEL = "sbxkit.bench-exec"
"""Marks the benchmark's sandbox. Not ``oneshot``'s ``sbxkit.bench``: that benchmark's leak
sweep removes every container carrying its label that it did not see before its run."""
RATIOS = (
    ("sbxkit", "docker_py"),
    ("sbxkit", "docker_exec"),
    ("docker_exec", "docker_py"),
    ("sbxkit", "sbxkit_bare"),
    ("sbxkit_bare", "docker_py"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_round_arguments(parser, ROUND_COUNTS, default_order=",".join(DEFAULT_ORDER))
    parser.add_argument("--socket", default=default_socket(), help="daemon socket")
    parser.add_argument("--image", default=default_busybox(), help="busybox image (local)")
    common.add_out_argument(parser, "exec_latency.json / .md")


def session_spec(image: str, seconds: float) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["unused"],  # replaced by the session's keep-alive
        limits=Limits(
            cpus=1.0, memory_bytes=64 * MiB, pids=64, output_bytes=1 * MiB, timeout_s=seconds
        ),
        labels={BENCH_LABEL: NAME},
    )


# --- contenders ----------------------------------------------------------------------------


def sbxkit_contender(sandbox: Sandbox) -> Contender:
    async def once() -> StepTimings:
        t0 = time.perf_counter()
        result = await sandbox.exec(["true"])
        elapsed = time.perf_counter() - t0
        if not result.ok:
            raise RuntimeError(f"sbxkit exec: {result.status} {result.exit_code} {result.stderr!r}")
        t = result.timings
        steps = {"create": t.create_s, "start": t.start_s, "stream": t.run_s}
        return {**steps, "outside": elapsed - sum(steps.values())}

    return Contender(
        "sbxkit",
        "sbxkit",
        'await sandbox.exec(["true"]) (exec create, hijacked start, inspect; group wrapper)',
        once,
    )


def bare_contender(sandbox: Sandbox, engine: Engine) -> Contender:
    """Diagnostic: sbxkit's own engine calls for a plain ``true`` — no group wrapper, no
    result object — so ``sbxkit/sbxkit_bare`` is the price of the process-group guarantee."""
    body = ExecCreate(
        cmd=["true"],
        attach_stdin=False,
        attach_stdout=True,
        attach_stderr=True,
        tty=False,
        privileged=False,
        user=sandbox.spec.user,
    )

    async def once() -> StepTimings:
        exec_id = await exec_create(engine, sandbox.container_id, body)
        stream = await exec_start(engine, exec_id)
        try:
            while await stream.receive_some():
                pass
        finally:
            await stream.aclose()
        info = await exec_inspect(engine, exec_id)
        if info.running or info.exit_code != 0:
            raise RuntimeError(f"bare exec: {info!r}")
        return {}

    return Contender(
        "sbxkit_bare",
        "sbxkit, no wrapper",
        "sbxkit.engine.execapi create/start/inspect of a plain `true` (diagnostic)",
        once,
    )


def docker_py_contender(socket_path: str, container_id: str) -> tuple[Contender, Any]:
    import docker

    client = docker.DockerClient(base_url=f"unix://{socket_path}")
    container = client.containers.get(container_id)

    def blocking() -> None:
        result = container.exec_run(["true"])
        if result.exit_code != 0:
            raise RuntimeError(f"docker-py exec_run: exit {result.exit_code} {result.output!r}")

    async def once() -> StepTimings:
        await trio.to_thread.run_sync(blocking)
        return {}

    return (
        Contender(
            "docker_py",
            "docker-py exec_run",
            f'container.exec_run(["true"]) in a worker thread (docker {docker.__version__})',
            once,
        ),
        client,
    )


# --- the run -----------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, rounds: int, warmup: int) -> dict[str, Any]:
    docker_cli = shutil.which("docker")
    if docker_cli is None:
        raise SystemExit(f"bench {NAME}: no `docker` on PATH (needed for the docker exec baseline)")
    env = dict(os.environ, DOCKER_HOST=f"unix://{args.socket}")
    witness = RawEngine(args.socket)
    errors: list[str] = []
    contenders: list[Contender] = []
    lease = container_id = ""
    # The session must outlive the measurement: allow ~1 s per exec with a generous floor.
    seconds = max(600.0, (rounds + warmup) * 3 * 1.0)
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        await common.require_image(engine, args.image, NAME)
        async with open_sandbox(session_spec(args.image, seconds), engine=engine) as sandbox:
            lease, container_id = sandbox.lease, sandbox.container_id
            docker_py, client = docker_py_contender(args.socket, container_id)
            cli_command = [docker_cli, "exec", container_id, "true"]
            contenders = common.order_contenders(
                [
                    sbxkit_contender(sandbox),
                    docker_py,
                    common.cli_contender("docker_exec", "docker exec", cli_command, env),
                    bare_contender(sandbox, engine),
                ],
                args.order,
                NAME,
                only=args.only,
            )
            say(
                f"{NAME}: {warmup} warm-up + {rounds} measured rounds of "
                + " → ".join(c.key for c in contenders)
            )
            try:
                await run_interleaved(
                    contenders,
                    rounds=rounds,
                    warmup=warmup,
                    progress=lambda text: say(f"  {text}"),
                )
            except ContenderFailed as exc:
                errors.append(str(exc))
            finally:
                client.close()
    leaks = await trio.to_thread.run_sync(witness.containers, f"{LEASE_LABEL}={lease}")
    witness.close()
    facts["loadavg_at_end"] = list(os.getloadavg())
    return build_report(args, rounds, warmup, facts, contenders, errors, leaks, container_id)


def build_report(
    args: argparse.Namespace,
    rounds: int,
    warmup: int,
    facts: dict[str, Any],
    contenders: Sequence[Contender],
    errors: list[str],
    leaks: list[dict[str, Any]],
    container_id: str,
) -> dict[str, Any]:
    complete = not errors and all(len(c.totals_s) == rounds for c in contenders)
    ratios = common.interleaved_ratios(contenders, RATIOS, complete)
    measured = ratios.get("sbxkit/docker_py", {}).get("ratio")
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": facts,
        "config": {
            **common.interleaving_config(args, rounds, warmup, contenders),
            "image": args.image,
            "container": container_id[:12],
            "sandbox_spec": msgspec.to_builtins(session_spec(args.image, 0.0))["limits"],
        },
        "contenders": common.contender_report(contenders),
        "ratios": ratios,
        "target": common.at_most_target(
            f"sbxkit/docker_py <= {TARGET_RATIO:.2f}", measured, TARGET_RATIO
        ),
        "errors": errors,
        "leaks": [{"id": c["Id"][:12], "names": c.get("Names")} for c in leaks],
        "ok": not errors and not leaks,
    }


def render_text(report: dict[str, Any]) -> str:
    cfg = report["config"]
    lines = [
        f"{NAME} — {cfg['rounds']} rounds (+{cfg['warmup']} warm-up), interleaved "
        + " → ".join(cfg["order"]),
        *common.ms_table_text(report["contenders"], 20),
        "(ms, wall time per exec round trip)",
        *common.ratio_lines_text(report["ratios"], 26),
    ]
    lines += common.target_lines(report["target"])
    for info in report["contenders"].values():
        if info["steps_median_ms"]:
            steps = "  ".join(f"{k} {v:.1f}" for k, v in info["steps_median_ms"].items())
            lines.append(f"  {info['label']:<20} {steps}")
    return "\n".join(lines + common.errors_text(report))


def render_markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    m = report["machine"]
    out = [
        f"# {NAME} — exec `true` in a warm sandbox",
        "",
        f"{m['date']} · {cfg['rounds']} measured rounds (+{cfg['warmup']} warm-up), interleaved "
        f"`{' → '.join(cfg['order'])}` on one running sandbox · "
        + common.docker_md(m, runtime=m["default_runtime"], kernel=True)
        + common.git_md(m),
        "",
        *common.ms_table_md(report["contenders"]),
    ]
    out += common.ratio_table_md(report["ratios"], "ratio of medians", "first half / second half")
    out += common.target_md(report["target"])
    out += ["", "What each contender does:", ""]
    out += [f"- **{i['label']}**: {i['description']}" for i in report["contenders"].values()]
    sbx = report["contenders"].get("sbxkit", {}).get("steps_median_ms")
    if sbx:
        client = sum(v for k, v in sbx.items() if k != "stream")
        out += [
            "",
            "sbxkit median ms per step: " + ", ".join(f"{k} {v:.1f}" for k, v in sbx.items()),
            "",
            f"Where the time goes: `stream` ({sbx.get('stream', 0.0):.1f} ms) is the daemon "
            "running the exec (containerd → runc exec → the wrapper and `true` → exit → stream "
            "closed), "
            "the same work every client waits for; sbxkit's own calls and bookkeeping are the "
            f"rest ({client:.1f} ms). `sbxkit_bare` shows the floor an Engine-API exec client "
            "can reach; `sbxkit/sbxkit_bare` is the price of the process-group wrapper.",
        ]
    return common.md(out + common.errors_md(report))


def main(args: argparse.Namespace) -> int:
    rounds, warmup = common.rounds_and_warmup(args, NAME, ROUND_COUNTS)
    report = trio.run(measure, args, rounds, warmup)
    print(render_text(report))
    common.write_report(args.out, NAME, report, render_markdown)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
