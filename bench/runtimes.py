"""Benchmark ``runtimes``: a one-shot ``true`` under each OCI runtime of one engine.

For each runtime in ``--runtimes`` (default ``runc,crun,runsc``) two contenders, interleaved
round by round with every other runtime's:

``raw_R`` The floor (``bench.oneshot.raw_one_shot``: create → start → wait → delete through the
standard-library client, one keep-alive connection) with ``HostConfig.Runtime = R``. ``sbxkit_R``
``sbxkit._consumers.runner.run(spec, engine=engine)`` with ``spec.runtime = R`` (the default owner,
the supervisor).

The raw floor asks for the daemon's default runtime (runc on Docker, crun on Podman) by no name;
sbxkit's cell names each runtime (without a name sbxkit plans crun on a runc-default Docker daemon
that registers it). Every cell uses the same bounds, with **gVisor's floor of pids** (so all
cells are alike); on Podman the floor also sets sbxkit's ``nofile``/``nproc`` ulimits, without
which nothing starts there. Ratios:
``sbxkit_R/raw_R`` (sbxkit's price under each runtime) and ``raw_R/raw_runc``,
``sbxkit_R/sbxkit_runc`` (each runtime's price against runc's, same run). A runtime the
daemon does not list is reported as an errored contender pair, never silently dropped.

One run measures one engine (``--socket``): results go to ``runtimes.json`` (or
``runtimes-ENGINE.json`` for ``--engine`` other than docker), and ``--combine`` draws every
engine's run found in the results directory as one table and one plot (``runtimes-matrix``).
Ratios are only ever taken within one run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import msgspec
import trio

from bench import common
from bench.harness import (
    RESULTS_DIR,
    ContenderFailed,
    fmt_ms,
    machine_facts,
    ratio_of_medians,
    run_interleaved,
    say,
    summarise_ms,
    write_atomically,
    write_json,
)
from bench.oneshot import raw_contender, sbxkit_contender
from bench.plot import plot_report
from bench.rawapi import RawEngine
from bench.suite import ActivityWatch, LeakCheck, default_busybox, label_of, peer_body
from sbxkit._model.runtimes import GVISOR_MIN_PIDS
from sbxkit._model.spec import Limits, MiB, SandboxSpec
from sbxkit._plan.policy import PODMAN_ULIMITS
from sbxkit.engine.client import open_engine
from sbxkit.engine.discovery import ping_socket

NAME = "runtimes"
SUMMARY = "one-shot `true`: raw floor and sbxkit under runc, crun and runsc (one engine per run)"

COUNTS = common.RoundCounts(rounds=20, warmup=3, quick_rounds=5, quick_warmup=1)
DEFAULT_RUNTIMES = "runc,crun,runsc"
DAEMON_DEFAULT = "runc"
"""The reference runtime of the ratios (Docker's default; Podman's is crun)."""
CPUS = 1.0
MEMORY_BYTES = 64 * MiB
PIDS = GVISOR_MIN_PIDS
"""gVisor's floor (sbxkit refuses less under runsc); every cell uses it so they compare."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_round_arguments(parser, COUNTS, "raw_R, sbxkit_R for each runtime in turn")
    common.add_daemon_arguments(parser, default_busybox())
    parser.add_argument(
        "--runtimes", default=DEFAULT_RUNTIMES, help=f"comma-separated (default {DEFAULT_RUNTIMES})"
    )
    parser.add_argument(
        "--engine",
        default=None,
        help="engine name for the results (default: docker, or podman when the socket is one)",
    )
    parser.add_argument(
        "--combine",
        action="store_true",
        help="measure nothing: draw every runtimes*.json in the results directory as one "
        "table and one plot (runtimes-matrix.md / .png)",
    )


def cell_runtime(runtime: str, default: str = DAEMON_DEFAULT) -> str | None:
    """What a cell asks for: nothing for the daemon's own default runtime, as a default run."""
    return None if runtime == default else runtime


def spec_for(image: str, runtime: str) -> SandboxSpec:
    """sbxkit's cell names its runtime even where it is the daemon's default: a spec that
    names none runs under crun on a runc-default Docker daemon that registers it
    (``sbxkit._model.runtimes.plan_runtime``), so the runc cell would measure crun."""
    return SandboxSpec(
        image=image,
        command=["true"],
        limits=Limits(
            cpus=CPUS, memory_bytes=MEMORY_BYTES, pids=PIDS, output_bytes=MiB, timeout_s=30
        ),
        labels=label_of(NAME, f"sbxkit_{runtime}"),
        runtime=runtime,
    )


def raw_body_for(
    image: str, runtime: str, default: str = DAEMON_DEFAULT, *, podman: bool = False
) -> dict[str, Any]:
    body = peer_body(
        image,
        ["true"],
        label_of(NAME, f"raw_{runtime}"),
        cpus=CPUS,
        memory_bytes=MEMORY_BYTES,
        pids=PIDS,
        runtime=cell_runtime(runtime, default),
    )
    body["HostConfig"] = {"AutoRemove": False, **body["HostConfig"]}
    if podman:
        body["HostConfig"]["Ulimits"] = [
            {"Name": u.name, "Soft": u.soft, "Hard": u.hard} for u in PODMAN_ULIMITS
        ]
    return body


async def engine_name(socket_path: str) -> str:
    """``podman`` when the socket's /_ping carries Libpod-Api-Version, else ``docker``."""
    ping = await ping_socket(socket_path, timeout=10.0)
    return "podman" if ping.is_podman else "docker"


async def measure(args: argparse.Namespace, rounds: int, warmup: int) -> dict[str, Any]:
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    engine_label = args.engine or await engine_name(args.socket)
    errors: list[str] = []
    leases: list[str] = []
    unavailable: dict[str, str] = {}
    leaks = LeakCheck(args.socket, NAME)
    activity = ActivityWatch(args.socket, NAME)
    raw_api = RawEngine(args.socket)
    async with open_engine(args.socket) as engine:
        facts = await machine_facts(engine)
        facts["engine"] = engine_label
        await common.require_image(engine, args.image, NAME)
        registered = set(facts.get("runtimes") or [])
        default = str(facts.get("default_runtime") or DAEMON_DEFAULT)
        contenders = []
        measured: list[str] = []
        for runtime in runtimes:
            if cell_runtime(runtime, default) is not None and runtime not in registered:
                reason = (
                    f"runtime {runtime!r} is not registered in the daemon ({sorted(registered)})"
                )
                unavailable[f"raw_{runtime}"] = unavailable[f"sbxkit_{runtime}"] = reason
                continue
            measured.append(runtime)
            contenders += [
                raw_contender(
                    raw_api,
                    raw_body_for(args.image, runtime, default, podman=engine.is_podman),
                    key=f"raw_{runtime}",
                    label=f"raw floor, {runtime}",
                    what=f"the floor's body, runtime {runtime}",
                ),
                sbxkit_contender(
                    engine,
                    spec_for(args.image, runtime),
                    leases,
                    key=f"sbxkit_{runtime}",
                    label=f"sbxkit, {runtime}",
                ),
            ]
        contenders = common.order_contenders(contenders, args.order, NAME, only=args.only)
        say(
            f"{NAME} on {engine_label}: {warmup} warm-up + {rounds} rounds of "
            + " → ".join(c.key for c in contenders)
        )
        await trio.to_thread.run_sync(activity.start)
        try:
            await run_interleaved(
                contenders, rounds=rounds, warmup=warmup, progress=lambda t: say(f"  {t}")
            )
        except ContenderFailed as exc:
            errors.append(str(exc))
        finally:
            with trio.CancelScope(shield=True):
                raw_api.close()
                found = await common.stop_and_sweep(facts, activity, leaks)
    complete = not errors and all(len(c.totals_s) == rounds for c in contenders)
    by_key = {c.key: c for c in contenders}
    ratios: dict[str, Any] = {}
    if complete:
        base = DAEMON_DEFAULT if DAEMON_DEFAULT in measured else None
        for runtime in measured:
            sbx, raw = by_key[f"sbxkit_{runtime}"], by_key[f"raw_{runtime}"]
            ratios[f"sbxkit_{runtime}/raw_{runtime}"] = ratio_of_medians(sbx.totals_s, raw.totals_s)
        for runtime in measured:
            if base is not None and runtime != base:
                for kind in ("raw", "sbxkit"):
                    ratios[f"{kind}_{runtime}/{kind}_{base}"] = ratio_of_medians(
                        by_key[f"{kind}_{runtime}"].totals_s, by_key[f"{kind}_{base}"].totals_s
                    )
    summaries = {
        c.key: {
            "label": c.label,
            "description": c.description,
            "total_ms": summarise_ms(c.totals_s),
            "steps_median_ms": {
                step: summarise_ms(values)["median"] for step, values in c.steps_s.items()
            },
        }
        for c in contenders
    }
    return {
        "bench": NAME,
        "summary": SUMMARY,
        "engine": engine_label,
        "machine": facts,
        "config": {
            "rounds": rounds,
            "warmup": warmup,
            "quick": bool(args.quick),
            "order": [c.key for c in contenders],
            "runtimes": measured,
            "image": args.image,
            "sbxkit_spec": msgspec.to_builtins(spec_for(args.image, DAEMON_DEFAULT)),
            "raw_create_body": raw_body_for(args.image, DAEMON_DEFAULT),
        },
        "contenders": summaries,
        "ratios": ratios,
        "errored_contenders": unavailable,
        "plot": plot_of([(engine_label, measured, summaries)]) if complete else {},
        **common.outcome(errors, found, leaks.leftovers),
    }


def plot_of(runs: list[tuple[str, list[str], dict[str, Any]]]) -> dict[str, Any]:
    """Groups ``engine/runtime``; two series (the floor, sbxkit) at medians, p10–p90."""
    groups: list[str] = []
    series: dict[str, dict[str, list[Any]]] = {
        kind: {"median": [], "low": [], "high": []} for kind in ("raw", "sbxkit")
    }
    for engine, runtimes, contenders in runs:
        for runtime in runtimes:
            groups.append(f"{engine}/{runtime}")
            for kind, values in series.items():
                total = contenders[f"{kind}_{runtime}"]["total_ms"]
                values["median"].append(total.get("median"))
                values["low"].append(total.get("p10"))
                values["high"].append(total.get("p90"))
    labels = {"raw": "raw API floor", "sbxkit": "sbxkit.run (hardened, supervised)"}
    return {
        "title": "one-shot `true` per engine and OCI runtime",
        "ylabel": "ms (median, whiskers p10–p90)",
        "groups": groups,
        "series": [{"label": labels[k], **v} for k, v in series.items()],
        "note": f"ratios only within one run (one engine); {PIDS} pids in every cell",
    }


def table_md(report: dict[str, Any]) -> list[str]:
    """One row per runtime of this run: medians, and the ratios of the same run."""
    engine, ratios, contenders = report["engine"], report["ratios"], report["contenders"]
    out = []
    for runtime in report["config"]["runtimes"]:
        raw = contenders[f"raw_{runtime}"]["total_ms"]
        sbx = contenders[f"sbxkit_{runtime}"]["total_ms"]
        own = ratios.get(f"sbxkit_{runtime}/raw_{runtime}", {}).get("ratio")
        floor = ratios.get(f"raw_{runtime}/raw_{DAEMON_DEFAULT}", {}).get("ratio")
        out.append(
            f"| {engine} | {runtime} | {fmt_ms(raw.get('median'))} | "
            f"{fmt_ms(sbx.get('median'))} | {_ratio(own)} | "
            f"{_ratio(floor if runtime != DAEMON_DEFAULT else 1.0)} | {raw['n']} |"
        )
    return out


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


TABLE_HEAD = [
    "| engine | runtime | floor median ms | sbxkit median ms | sbxkit / floor | floor / runc floor "
    "| n |",
    "|---|---|---:|---:|---:|---:|---:|",
]


def render_markdown(report: dict[str, Any]) -> str:
    cfg, m = report["config"], report["machine"]
    out = [
        f"# runtimes — one-shot `true` per OCI runtime on {report['engine']}",
        "",
        f"{m['date']} · {cfg['rounds']} rounds (+{cfg['warmup']} warm-up), interleaved "
        f"`{' → '.join(cfg['order'])}` · {common.docker_md(m)}{common.git_md(m)}",
        "",
        *TABLE_HEAD,
        *table_md(report),
        "",
        *common.ms_table_md(report["contenders"]),
        *common.ratio_table_md(report["ratios"]),
    ]
    for key, reason in report["errored_contenders"].items():
        out.append(f"\n- `{key}` not measured: {reason}")
    return common.finish_md(out, report)


def combine(directory: Path) -> int:
    """One table and one plot from every engine's last complete run in ``directory``."""
    reports = [
        json.loads(path.read_text())
        for path in sorted(directory.glob(f"{NAME}*.json"))
        if "failed" not in path.name and "matrix" not in path.name
    ]
    reports = [r for r in reports if r.get("ok") and r.get("plot")]
    reports.sort(
        key=lambda r: (r["engine"] != "docker", r["engine"])
    )  # Docker, the reference, first
    if not reports:
        say(f"{NAME} --combine: no complete runtimes*.json in {directory}")
        return 1
    out = [
        "# runtimes — one-shot `true` per engine × OCI runtime",
        "",
        "Each engine's rows come from one run of its own; ratios are never taken across runs.",
        "",
        *TABLE_HEAD,
    ]
    for report in reports:
        out += table_md(report)
    out.append("")
    for report in reports:
        m = report["machine"]
        out.append(
            f"- {report['engine']}: {m['date']}, {report['config']['rounds']} rounds, "
            f"server {m['docker_server_version']} (API {m['docker_server_api']})"
        )
    write_atomically(directory / f"{NAME}-matrix.md", common.md(out))
    runs = [(r["engine"], r["config"]["runtimes"], r["contenders"]) for r in reports]
    plot_report({"plot": plot_of(runs)}, directory / f"{NAME}-matrix.png")
    say(f"wrote {directory / NAME}-matrix.md and .png")
    print(common.md(out))
    return 0


def main(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out not in (None, "-") else RESULTS_DIR
    if args.combine:
        return combine(out)
    rounds, warmup = common.rounds_and_warmup(args, NAME, COUNTS)
    report = trio.run(measure, args, rounds, warmup)
    text = render_markdown(report)
    print(text)
    if args.out == "-":
        return 0 if report["ok"] else 1
    stem = NAME if report["engine"] == "docker" else f"{NAME}-{report['engine']}"
    if not report["ok"]:
        stem += ".failed"
    write_json(out / f"{stem}.json", report)
    write_atomically(out / f"{stem}.md", text)
    if report["ok"]:
        plot_report(report, out / f"{stem}.png")
    say(f"wrote {out / stem}.json, .md and .png")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
