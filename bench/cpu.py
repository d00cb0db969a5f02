"""Benchmark ``cpu``: where the CPU of one harness job goes, process by process.

The HumanEval jobs of ``bench humaneval`` (the first ``--limit`` problems, ``--parallel`` at
once, 8 unless given) run against a daemon this benchmark starts for itself
(``scripts/engine-up`` with private paths), so that every process it involves can be told
apart:

- the daemon is started inside a cgroup of its own in the cpuacct hierarchy (cgroup v1 here;
  the unified hierarchy where that is all there is), so ``dockerd``, ``containerd`` and every
  process they start — the short-lived ``containerd-shim-runc-v2`` and ``runc`` of each
  container, which are re-parented to PID 1 and never reaped by anyone who counts them — are
  charged to it;
- the containers go under a second cgroup (``--cgroup-parent``), so the payloads' CPU (and
  ``runc init``'s, once it has joined) is charged there;
- ``dockerd`` and ``containerd`` are read from ``/proc/PID/stat``; shims and runc are the engine
  cgroup's rest;
- the benchmark's own process (the client: sbxkit's ``run_many`` or docker-py's thread pool)
  from ``getrusage``; sbxkit's supervisor (started by the default owner for a state directory
  of this run's own) from ``/proc/PID/stat``;
- ``/proc/stat`` gives the machine's busy and idle time; what is busy but in none of the above
  is "other" (another load on the machine, the kernel's own threads).

``sbxkit`` runs under sbxkit's default runtime (crun where a runc-default Docker daemon registers
it, as this benchmark's daemon does: docs/backends.md); ``sbxkit_runc`` names runc, the runtime
that was the default before, so one run shows what the choice saves. ``docker_py`` runs under
the daemon's default (runc). ``sbxkit_inproc`` is ``run_many`` with ``InProcessOwner``: no
supervisor, so no guarantee that a killed caller leaves nothing (docker-py's own class), which
shows what the supervisor's share of a job is.

Contenders alternate whole runs (A, B, C, A, B, C …) as in ``bench humaneval``. Each figure is
CPU milliseconds per job: the delta over a run divided by its jobs, median over runs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import signal
import socket as sock
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from bench import common, humaneval
from bench.harness import ContenderFailed, machine_facts, say
from bench.suite import LeakCheck, default_python, dockerpy_client, fmt, summarise
from sbxkit._consumers.pacing import parse_proc_stat
from sbxkit._kernel.cgroup_stats import parse_counter, parse_keyed
from sbxkit._kernel.scripts import io_root
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit.engine.client import open_engine

NAME = "cpu"
SUMMARY = (
    "CPU per harness job by process (client, supervisor, dockerd, containerd, shim+runc, payload)"
)

CONTENDERS = humaneval.CONTENDERS
LABELS = {
    **humaneval.LABELS,
    "sbxkit_inproc": "sbxkit run_many, in-process owner (no supervisor)",
    "sbxkit_runc": "sbxkit run_many, runc (named: the default before crun)",
    "sbxkit_crun": "sbxkit run_many, crun",
    "docker_py_crun": "docker-py, thread pool, crun",
}
DEFAULT_ROUNDS = 3
QUICK_ROUNDS = 1
DEFAULT_LIMIT = 64
PRIVATE = "sbxkit-bench-cpu"
CATEGORIES = ("client", "supervisor", "dockerd", "containerd", "shim_runc", "payload", "other")
CATEGORY_LABELS = {
    "client": "client (bench process)",
    "supervisor": "sbxkit supervisor",
    "dockerd": "dockerd",
    "containerd": "containerd",
    "shim_runc": "shims + runc",
    "payload": "payloads (containers)",
    "other": "rest of the machine",
}
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parent.parent


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rounds", type=int, default=None, help=f"default {DEFAULT_ROUNDS}")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROUNDS} run each")
    parser.add_argument(
        "--limit", type=int, default=DEFAULT_LIMIT, help="the first N HumanEval problems"
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=humaneval.PARALLEL,
        help=f"jobs in flight for every contender (default {humaneval.PARALLEL})",
    )
    parser.add_argument("--image", default=default_python())
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated, in round order, of {', '.join(LABELS)}",
    )
    parser.add_argument(
        "--name",
        default=PRIVATE,
        help=f"the private daemon's name: /run/NAME, /var/lib/NAME, containerd namespace NAME "
        f"(default {PRIVATE}; give each concurrent run its own)",
    )
    parser.add_argument("--out", default=None, help="results directory ('-' for none)")


# --- the counters ---------------------------------------------------------------------------


def cpuacct_root() -> Path:
    """Where cgroups of the cpuacct controller are made: v1's own hierarchy, else v2's."""
    v1 = Path("/sys/fs/cgroup/cpuacct")
    if (v1 / "cpuacct.usage").exists():
        return v1
    return Path("/sys/fs/cgroup")


def cgroup_cpu_s(path: Path) -> float:
    """CPU seconds charged to a cgroup and its descendants (those removed included)."""
    usage = path / "cpuacct.usage"
    if usage.exists():
        ns = parse_counter(usage.read_text())
        if ns is not None:
            return ns / 1e9
    usec = parse_keyed((path / "cpu.stat").read_text()).get("usage_usec")
    if usec is None:
        raise RuntimeError(f"{path}: no cpuacct.usage and no usage_usec in cpu.stat")
    return usec / 1e6


def process_cpu_s(pid: int) -> float:
    """utime + stime of a live process (all its threads), in seconds; 0 once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # fields 14 and 15 of stat(5)


def machine_s() -> tuple[float, float]:
    """The machine's busy and idle CPU seconds since boot (idle + iowait is idle)."""
    times = parse_proc_stat(Path("/proc/stat").read_text())
    return times.busy * TICK_S, (times.total - times.busy) * TICK_S


def self_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def answers(socket: str) -> bool:
    """Whether something accepts connections on the Unix socket ``socket``."""
    with contextlib.closing(sock.socket(sock.AF_UNIX, sock.SOCK_STREAM)) as probe:
        try:
            probe.connect(socket)
        except OSError:
            return False
    return True


def pids_with(words: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # Another user's process may have any bytes in its argv.
                raw = (entry / "cmdline").read_bytes()
                cmdline = raw.replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if words in cmdline:
                found.append(int(entry.name))
    return found


@dataclass
class Snapshot:
    engine: float
    payload: float
    dockerd: float
    containerd: float
    client: float
    supervisors: dict[int, float]
    busy: float
    idle: float
    at: float


class PrivateEngine:
    """A dockerd of the benchmark's own, in a cpuacct cgroup of its own, its containers under
    another; gone (daemon stopped, cgroups removed) when the benchmark ends."""

    def __init__(self, name: str = PRIVATE) -> None:
        if not name.startswith(PRIVATE) or not name.replace("-", "").isalnum():
            raise SystemExit(
                f"bench cpu: --name {name!r}: letters, digits and '-', starting with {PRIVATE!r}"
            )
        self.name = name
        self.group = cpuacct_root() / f"{name}-{os.getpid()}"
        self.engine_group = self.group / "engine"
        self.payload_group = self.group / "payload"
        self.run = Path(f"/run/{name}")
        self.data = Path(f"/var/lib/{name}")
        self.socket = str(self.run / "docker.sock")
        self.pidfile = self.run / "docker.pid"
        self.state_dir = Path(tempfile.mkdtemp(prefix="sbxkit-bench-cpu-"))
        self.dockerd = 0
        self.containerd = 0

    def start(self) -> None:
        if os.geteuid() != 0:
            raise SystemExit("bench cpu: needs root (a daemon of its own, cgroups)")
        if answers(self.socket):
            # engine-up would adopt it: a daemon outside our cgroup, stopped by us at the end.
            raise SystemExit(
                f"bench cpu: a daemon already answers on {self.socket} (another run's?): "
                "give this run its own --name"
            )
        self.engine_group.mkdir(parents=True)
        self.payload_group.mkdir()
        self.run.mkdir(parents=True, exist_ok=True)
        self.data.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SBXKIT_TEST_SOCKET": self.socket,
            "SBXKIT_ENGINE_PIDFILE": str(self.pidfile),
            "SBXKIT_ENGINE_DATA_ROOT": str(self.data / "docker"),
            "SBXKIT_ENGINE_EXEC_ROOT": str(self.run / "exec"),
            "SBXKIT_ENGINE_CONFIG": str(self.data / "daemon.json"),
            "SBXKIT_ENGINE_LOG": str(self.data / "dockerd.log"),
            "SBXKIT_ENGINE_PYDATA": "0",  # the python image is all the jobs need
            "SBXKIT_DOCKERD_ARGS": f"--cgroup-parent=/{self.group.name}/payload "
            f"--containerd-namespace {self.name} "
            f"--containerd-plugins-namespace {self.name}-plugins",
        }
        # The shell joins the engine's cgroup before it execs engine-up: dockerd, containerd
        # and all they start later are charged there.
        join = f"echo $$ > {self.engine_group}/cgroup.procs && exec bash scripts/engine-up"
        subprocess.run(["sh", "-c", join], cwd=REPO, env=env, check=True)
        self.dockerd = int(self.pidfile.read_text())
        found = [p for p in pids_with(f"containerd --config {self.run}/exec/") if p != self.dockerd]
        if len(found) != 1:
            raise RuntimeError(f"bench cpu: not one containerd of the private daemon: {found}")
        self.containerd = found[0]
        os.environ["SBXKIT_STATE_DIR"] = str(self.state_dir)

    def supervisors(self) -> dict[int, float]:
        return {p: process_cpu_s(p) for p in pids_with(f"--state-dir {self.state_dir}")}

    def snapshot(self) -> Snapshot:
        busy, idle = machine_s()
        return Snapshot(
            engine=cgroup_cpu_s(self.engine_group),
            payload=cgroup_cpu_s(self.payload_group),
            dockerd=process_cpu_s(self.dockerd),
            containerd=process_cpu_s(self.containerd),
            client=self_cpu_s(),
            supervisors=self.supervisors(),
            busy=busy,
            idle=idle,
            at=time.monotonic(),
        )

    def stop(self) -> None:
        for pid in self.supervisors():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        if self.dockerd:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.dockerd, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while Path(f"/proc/{self.dockerd}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
        for group in (self.payload_group, self.engine_group, self.group):
            _remove_cgroup(group)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        shutil.rmtree(io_root(self.state_dir), ignore_errors=True)  # its FIFOs' sibling


def _remove_cgroup(path: Path) -> None:
    """rmdir a cgroup once its last process has left (a stopped daemon's shims linger)."""
    deadline = time.monotonic() + 30
    while path.exists():
        for child in [p for p in path.iterdir() if p.is_dir()]:
            _remove_cgroup(child)
        try:
            path.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                say(f"bench cpu: could not remove {path}: processes still in it")
                return
            time.sleep(0.2)


def per_job(before: Snapshot, after: Snapshot, jobs: int) -> dict[str, float]:
    """CPU milliseconds per job by category, from two snapshots around one run."""
    supervisor = sum(
        cpu - before.supervisors.get(pid, 0.0) for pid, cpu in after.supervisors.items()
    )
    dockerd = after.dockerd - before.dockerd
    containerd = after.containerd - before.containerd
    parts = {
        "client": after.client - before.client,
        "supervisor": supervisor,
        "dockerd": dockerd,
        "containerd": containerd,
        "shim_runc": max(0.0, after.engine - before.engine - dockerd - containerd),
        "payload": after.payload - before.payload,
    }
    parts["other"] = max(0.0, after.busy - before.busy - sum(parts.values()))
    out = {k: 1000 * v / jobs for k, v in parts.items()}
    out["total"] = sum(out[k] for k in CATEGORIES if k != "other")
    out["wall_s"] = after.at - before.at
    out["idle_share"] = (after.idle - before.idle) / max(
        1e-9, (after.idle - before.idle) + (after.busy - before.busy)
    )
    return out


# --- the run --------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, rounds: int) -> dict[str, Any]:
    programs = humaneval.load_programs(args.limit)
    contenders = common.chosen_keys(args.contenders, LABELS, NAME)
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in contenders}
    errors: list[str] = []
    engine_box = PrivateEngine(args.name)
    await trio.to_thread.run_sync(engine_box.start)
    leaks = LeakCheck(engine_box.socket, humaneval.NAME)
    client = dockerpy_client(engine_box.socket, args.parallel)
    pool = ThreadPoolExecutor(args.parallel, "sbxbench-cpu")
    found: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}
    try:
        async with open_engine(engine_box.socket) as engine:
            facts = await machine_facts(engine)

            async def run_all(key: str) -> dict[str, Any]:
                runtime = next((r for r in ("crun", "runc") if key.endswith(f"_{r}")), None)
                if key.startswith("sbxkit"):
                    return await humaneval.sbxkit_all(
                        engine,
                        args.image,
                        programs,
                        pooled=key == "sbxkit_pooled",
                        runtime=runtime,
                        parallel=None if key == "sbxkit_auto" else args.parallel,
                        owner_factory=InProcessOwner if key == "sbxkit_inproc" else None,
                    )
                return await trio.to_thread.run_sync(
                    humaneval.dockerpy_all, client, pool, args.image, programs, runtime
                )

            say(
                f"{NAME}: {rounds} runs × {contenders}, {len(programs)} jobs at "
                f"{args.parallel}, one warm-up"
            )
            for round_no in range(-1, rounds):
                for key in contenders:
                    before = engine_box.snapshot()
                    try:
                        verdicts = await run_all(key)
                    except Exception as exc:
                        raise ContenderFailed(key, round_no, exc) from exc
                    after = engine_box.snapshot()
                    failed = [t for t, v in verdicts.items() if not v["passed"]]
                    if failed:
                        errors.append(f"{key}: not every solution passed: {failed[:5]}")
                    if round_no < 0:
                        continue
                    sample = per_job(before, after, len(programs))
                    samples[key].append(sample)
                    say(
                        f"  run {round_no + 1} {key:<14} wall {sample['wall_s']:5.1f} s, "
                        f"cpu/job {sample['total']:6.1f} ms "
                        f"(client {sample['client']:.1f}, supervisor {sample['supervisor']:.1f})"
                    )
    except ContenderFailed as exc:
        errors.append(str(exc))
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: pool.shutdown(wait=True))
            client.close()
            found = await trio.to_thread.run_sync(leaks.sweep)
            await trio.to_thread.run_sync(engine_box.stop)
    return {
        "args": args,
        "rounds": rounds,
        "n": len(programs),
        "samples": samples,
        "facts": facts,
        "errors": errors,
        "leaks": found,
        "leftovers": leaks.leftovers,
    }


def build_report(m: dict[str, Any]) -> dict[str, Any]:
    keys = (*CATEGORIES, "total", "wall_s", "idle_share")
    order = tuple(m["samples"])
    contenders = {
        k: {
            "label": LABELS[k],
            **{c: summarise([s[c] for s in m["samples"][k]]) for c in keys},
        }
        for k in m["samples"]
    }
    complete = not m["errors"] and all(len(v) == m["rounds"] for v in m["samples"].values())

    def median(key: str, category: str) -> float | None:
        value = contenders[key][category].get("median")
        return None if value is None else float(value)

    ratios: dict[str, Any] = {}
    mains = ("sbxkit", "sbxkit_pooled", "sbxkit_inproc", "sbxkit_crun", "sbxkit_runc")
    pairs = [(k, "docker_py") for k in mains]
    pairs += [("sbxkit_crun", "docker_py_crun")]
    for key, base_key in pairs if complete else []:
        if key not in contenders or base_key not in contenders:
            continue
        ours = (median(key, "client") or 0) + (median(key, "supervisor") or 0)
        theirs = median(base_key, "client") or 0
        ratios[f"{key} client+supervisor / {base_key} client"] = (
            round(ours / theirs, 3) if theirs else None
        )
        total, base = median(key, "total"), median(base_key, "total")
        ratios[f"{key} / {base_key} total"] = round(total / base, 3) if total and base else None
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "machine": m["facts"],
        "config": {
            "rounds": m["rounds"],
            "jobs": m["n"],
            "parallel": m["args"].parallel,
            "image": m["args"].image,
            "order": "alternating whole runs: " + " → ".join(order),
            "daemon": "private dockerd in its own cpuacct cgroup; containers under another",
        },
        "contenders": contenders,
        "ratios": ratios,
        "plot": {
            "title": f"CPU per job by process: {m['n']} HumanEval jobs at {m['args'].parallel}",
            "ylabel": "CPU ms per job (median, whiskers min–max)",
            "groups": [CATEGORY_LABELS[c] for c in CATEGORIES],
            "series": [
                common.min_max_series(LABELS[k], [contenders[k][c] for c in CATEGORIES])
                for k in order
            ]
            if complete
            else [],
        },
        **common.outcome(m["errors"], m["leaks"], m["leftovers"]),
    }


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    contenders = report["contenders"]
    out = [
        f"# cpu — CPU per harness job, by process ({cfg['jobs']} HumanEval jobs at "
        f"{cfg['parallel']})",
        "",
        f"{m['date']} · {cfg['rounds']} runs per contender, {cfg['order']} · `{cfg['image']}` · "
        f"{cfg['daemon']} · {common.docker_md(m)}",
        "",
        "CPU milliseconds per job, median over runs (min–max):",
        "",
        "| process | " + " | ".join(info["label"] for info in contenders.values()) + " |",
        "|---|" + "---:|" * len(contenders),
    ]
    for category in (*CATEGORIES, "total"):
        cells = []
        for info in contenders.values():
            s = info[category]
            cells.append(
                f"{fmt(s.get('median'), 1)} ({fmt(s.get('min'), 1)}–{fmt(s.get('max'), 1)})"
            )
        name = "**total (without the rest)**" if category == "total" else CATEGORY_LABELS[category]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    walls = " | ".join(fmt(info["wall_s"].get("median"), 1) for info in contenders.values())
    idle = " | ".join(
        f"{100 * float(info['idle_share'].get('median') or 0):.0f} %"
        for info in contenders.values()
    )
    out += [f"| wall s per run | {walls} |", f"| machine idle | {idle} |"]
    if report["ratios"]:
        out += ["", "| ratio (medians of CPU ms per job) | value |", "|---|---:|"]
        out += [f"| {name} | {fmt(value, 3)} |" for name, value in report["ratios"].items()]
    return common.finish_md(out, report)


def main(args: argparse.Namespace) -> int:
    rounds = common.pick(args.rounds, args.quick, QUICK_ROUNDS, DEFAULT_ROUNDS)
    report = build_report(trio.run(measure, args, rounds))
    return common.publish(args, NAME, report, render_markdown(report))


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
