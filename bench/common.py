"""What the benchmark modules repeat beyond ``bench.harness`` and ``bench.suite``: argument
boilerplate and round counts, the tables of a report rendered as text and markdown, the report's
closing keys, the end-of-run watch stop and leak sweep, and the end of a run (print, write the
results, exit status).

Every helper renders exactly what the modules rendered by hand before; the markdown ones return
lists of lines to append (empty when there is nothing to say).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import trio

from bench.harness import (
    RESULTS_DIR,
    Contender,
    StepTimings,
    fmt_ms,
    ratio_of_medians,
    say,
    summarise_ms,
    write_atomically,
    write_json,
)
from bench.suite import (
    ActivityWatch,
    LeakCheck,
    default_socket,
    shared_daemon_warning,
    standalone,
    write_outputs,
)
from sbxkit.engine.client import Engine
from sbxkit.errors import NotFound

# --- contenders ---------------------------------------------------------------------------------


def order_contenders(
    contenders: list[Contender], order: str | None, bench: str, *, only: str | None = None
) -> list[Contender]:
    """Apply ``--order`` (comma-separated keys; unnamed contenders keep their place after) or
    ``--only`` (those keys alone, in that order: a decision run of one ratio need not run the
    rest). Both at once: ``--only`` decides."""
    chosen = only or order
    if not chosen:
        return contenders
    wanted = [key.strip() for key in chosen.split(",") if key.strip()]
    by_key = {c.key: c for c in contenders}
    unknown = [key for key in wanted if key not in by_key]
    if unknown:
        flag = "--only" if only else "--order"
        raise SystemExit(f"bench {bench}: {flag} names unknown contenders {unknown}")
    rest = [] if only else [c for c in contenders if c.key not in wanted]
    return [by_key[k] for k in wanted] + rest


def chosen_keys(text: str, labels: Mapping[str, str], bench: str) -> tuple[str, ...]:
    """``--contenders``: comma-separated keys of ``labels``, in round order."""
    keys = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in keys if k not in labels]
    if unknown or not keys:
        raise SystemExit(f"bench {bench}: --contenders {text!r}: choose from {', '.join(labels)}")
    return keys


def cli_contender(key: str, label: str, command: Sequence[str], env: dict[str, str]) -> Contender:
    """A contender that runs a command line (the docker CLI) and must exit 0."""

    async def once() -> StepTimings:
        done = await trio.run_process(
            list(command), capture_stdout=True, capture_stderr=True, check=False, env=env
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{label} exited {done.returncode}: {done.stderr.decode(errors='replace')}"
            )
        return {}

    return Contender(key, label, "subprocess: " + " ".join(command), once)


async def require_image(engine: Engine, image: str, bench: str) -> None:
    """Benchmarks never pull: a missing image ends the run with a clear message."""
    try:
        await engine.image_inspect(image)
    except NotFound:
        raise SystemExit(
            f"bench {bench}: image {image} is not present (scripts/engine-up loads it)"
        ) from None


# --- arguments -----------------------------------------------------------------------------------


def pick(value: int | None, quick: bool, quick_value: int, default_value: int) -> int:
    """``value`` when given on the command line, else the quick or the default count."""
    if value is not None:
        return value
    return quick_value if quick else default_value


@dataclass(frozen=True)
class RoundCounts:
    """Measured and discarded rounds of an interleaved benchmark, by default and with --quick."""

    rounds: int
    warmup: int
    quick_rounds: int
    quick_warmup: int


def add_round_arguments(
    parser: argparse.ArgumentParser, counts: RoundCounts, default_order: str
) -> None:
    """``--rounds``, ``--warmup``, ``--quick`` and ``--order`` of an interleaved benchmark."""
    parser.add_argument(
        "--rounds", type=int, default=None, help=f"measured rounds (default {counts.rounds})"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help=f"discarded rounds (default {counts.warmup})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{counts.quick_rounds} rounds, {counts.quick_warmup} warm-up "
        "(a smoke run, not a figure)",
    )
    parser.add_argument(
        "--order",
        default=None,
        help=f"comma-separated contender keys (default: {default_order})",
    )
    parser.add_argument(
        "--only",
        default=None,
        metavar="KEYS",
        help="run only these contenders (comma-separated keys), in this order",
    )


def add_out_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """``--out DIR`` (default ``bench/results``; ``-`` writes nothing)."""
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR,
        help=f"directory for {what} ('-' to write nothing)",
    )


def add_daemon_arguments(parser: argparse.ArgumentParser, image: str) -> None:
    """A suite benchmark's ``--socket``, ``--image`` (default ``image``) and ``--out``."""
    parser.add_argument("--socket", default=default_socket())
    parser.add_argument("--image", default=image)
    parser.add_argument("--out", default=None, help="results directory ('-' for none)")


def add_contenders_argument(parser: argparse.ArgumentParser, contenders: Sequence[str]) -> None:
    parser.add_argument(
        "--contenders", default=",".join(contenders), help="comma-separated, in round order"
    )


def rounds_and_warmup(args: argparse.Namespace, name: str, counts: RoundCounts) -> tuple[int, int]:
    """The measured and discarded round counts; exits on impossible ones."""
    rounds = pick(args.rounds, args.quick, counts.quick_rounds, counts.rounds)
    warmup = pick(args.warmup, args.quick, counts.quick_warmup, counts.warmup)
    if rounds < 1 or warmup < 0:
        raise SystemExit(f"bench {name}: --rounds must be >= 1 and --warmup >= 0")
    return rounds, warmup


# --- markdown ------------------------------------------------------------------------------------


def docker_md(
    machine: Mapping[str, Any], *, runtime: str | None = None, kernel: bool = False
) -> str:
    """``Docker V (API A, [runtime R, ]cgroup vN) · [kernel K · ]N CPUs``."""
    m = machine
    return (
        f"Docker {m['docker_server_version']} (API {m['docker_server_api']}, "
        + (f"runtime {runtime}, " if runtime else "")
        + f"cgroup v{m['cgroup_version']}) · "
        + (f"kernel {m['kernel']} · " if kernel else "")
        + f"{m['nproc']} CPUs"
    )


def git_md(machine: Mapping[str, Any]) -> str:
    """`` · sbxkit at COMMIT[ (sbxkit/ modified)]``."""
    git = machine.get("git") or {}
    return f" · sbxkit at {str(git.get('commit', '?'))[:10]}" + (
        " (sbxkit/ modified)" if git.get("sbxkit_dirty") else ""
    )


def ms_table_md(contenders: Mapping[str, Any]) -> list[str]:
    """The contenders' ``total_ms`` summaries as a markdown table."""
    out = [
        "| contender | median ms | p10 | p90 | min | max | n |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for info in contenders.values():
        t = info["total_ms"]
        out.append(
            f"| {info['label']} | {fmt_ms(t.get('median'))} | {fmt_ms(t.get('p10'))} | "
            f"{fmt_ms(t.get('p90'))} | {fmt_ms(t.get('min'))} | {fmt_ms(t.get('max'))} | "
            f"{t['n']} |"
        )
    return out


def ratio_table_md(
    ratios: Mapping[str, Any],
    title: str = "ratio (of medians)",
    halves_title: str | None = "halves",
) -> list[str]:
    """A blank line and the ratios as a markdown table (nothing without ratios); without
    ``halves_title``, no halves column. A ratio without a bootstrap interval shows ``-``."""
    if not ratios:
        return []
    if halves_title is None:
        out = ["", f"| {title} | value | bootstrap 95 % |", "|---|---:|---:|"]
    else:
        out = ["", f"| {title} | value | {halves_title} | bootstrap 95 % |", "|---|---:|---:|---:|"]
    for name, r in ratios.items():
        cells = [name, f"{r['ratio']:.3f}"]
        if halves_title is not None:
            cells.append(" / ".join(f"{h:.3f}" for h in r.get("halves", [])))
        boot = r.get("bootstrap95")
        cells.append(f"{boot[0]:.3f}–{boot[1]:.3f}" if boot else "-")
        out.append("| " + " | ".join(cells) + " |")
    return out


def target_md(target: Mapping[str, Any], note: str = "") -> list[str]:
    """``Target `EXPR`: **met** (R)NOTE.`` after a blank line, when the ratio was measured."""
    if target["ratio"] is None:
        return []
    verdict = "**met**" if target["met"] else "**not met**"
    ratio = f"{target['ratio']:.3f}{_undecided(target)}"
    return ["", f"Target `{target['expression']}`: {verdict} ({ratio}){note}."]


def _undecided(target: Mapping[str, Any]) -> str:
    """What a verdict this run did not decide says (``ratio_target``); nothing otherwise."""
    if target.get("decided") is False:
        return "; undecided: its halves or bootstrap interval reach across the target"
    return ""


def shared_daemon_md(machine: Mapping[str, Any]) -> list[str]:
    """The shared-daemon warning, when other clients created containers during the run."""
    warning = shared_daemon_warning(machine.get("daemon_activity_during_run") or {})
    return ["", f"**Warning:** {warning}."] if warning else []


def errors_md(report: Mapping[str, Any]) -> list[str]:
    """The run's errors and leaks as a markdown list (nothing when there are none)."""
    if not report["errors"] and not report["leaks"]:
        return []
    out = ["", "**Errors / leaks:**", ""]
    out += [f"- {e}" for e in report["errors"]]
    out += [f"- leaked {leak}" for leak in report["leaks"]]
    return out


def md(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def finish_md(out: list[str], report: Mapping[str, Any]) -> str:
    """A suite report's markdown: ``out``, the shared-daemon warning, errors and leaks."""
    return md(out + shared_daemon_md(report["machine"]) + errors_md(report))


# --- text ----------------------------------------------------------------------------------------


def interleaving_config(
    args: argparse.Namespace, rounds: int, warmup: int, contenders: Sequence[Contender]
) -> dict[str, Any]:
    """The config entries every interleaved benchmark reports (its own follow)."""
    seed = getattr(args, "shuffle", None)
    return {
        "rounds": rounds,
        "warmup": warmup,
        "quick": bool(args.quick),
        "order": [c.key for c in contenders],
        "shuffle": seed,
        "interleaving": (
            "round-robin in the order above, one trio event loop"
            if seed is None
            else f"each round in an order drawn afresh (random.Random({seed}).shuffle of the "
            "order above), one trio event loop"
        ),
        "clock": "time.perf_counter around each awaited contender call",
    }


def order_words(cfg: Mapping[str, Any]) -> str:
    """``A → B → C``, or that order shuffled each round (``--shuffle``)."""
    order = " → ".join(cfg["order"])
    seed = cfg.get("shuffle")
    return order if seed is None else f"{order}, shuffled each round (seed {seed})"


def target_lines(target: Mapping[str, Any]) -> list[str]:
    """``target EXPR: MET (ratio)`` for a plain-text report; nothing when not measured."""
    if target["ratio"] is None:
        return []
    verdict = "MET" if target["met"] else "NOT met"
    return [f"target {target['expression']}: {verdict} ({target['ratio']:.3f}{_undecided(target)})"]


def contender_report(contenders: Sequence[Contender]) -> dict[str, Any]:
    """Each contender's label, description, summary in ms, median step times and samples."""
    return {
        c.key: {
            "label": c.label,
            "description": c.description,
            "total_ms": summarise_ms(c.totals_s),
            "steps_median_ms": {
                name: sorted(v)[len(v) // 2] * 1000.0 for name, v in c.steps_s.items() if v
            },
            "samples_ms": [round(s * 1000.0, 3) for s in c.totals_s],
        }
        for c in contenders
    }


def interleaved_ratios(
    contenders: Sequence[Contender], pairs: Sequence[tuple[str, str]], complete: bool
) -> dict[str, Any]:
    """``ratio_of_medians`` for each (numerator, denominator) pair both present, when every
    contender ran every round (``complete``); none otherwise."""
    by_key = {c.key: c for c in contenders}
    if not complete:
        return {}
    return {
        f"{num}/{den}": ratio_of_medians(by_key[num].totals_s, by_key[den].totals_s)
        for num, den in pairs
        if num in by_key and den in by_key
    }


def at_most_target(expression: str, ratio: float | None, target: float) -> dict[str, Any]:
    """A ``ratio <= target`` verdict: None when the ratio could not be measured."""
    return {
        "expression": expression,
        "ratio": ratio,
        "met": None if ratio is None else ratio <= target,
    }


def ratio_target(
    expression: str, info: Mapping[str, Any] | None, target: float, *, at_most: bool = True
) -> dict[str, Any]:
    """A verdict on a ``ratio_of_medians`` result (None: not measured), ``<= target`` or, with
    ``at_most=False``, ``>= target``: met by the median; decided only when both halves and the
    bootstrap interval fall on the median's side of the target — else this run alone does not
    decide it (run again with more rounds)."""

    def on_side(value: float) -> bool:
        return value <= target if at_most else value >= target

    if info is None:
        return {"expression": expression, "ratio": None, "met": None, "decided": None}
    met = on_side(info["ratio"])
    hints = [*info["halves"], *info["bootstrap95"]]
    return {
        "expression": expression,
        "ratio": info["ratio"],
        "met": met,
        "decided": all(on_side(value) == met for value in hints),
    }


def ms_table_text(contenders: Mapping[str, Any], width: int) -> list[str]:
    """The contenders' ``total_ms`` summaries as aligned text, labels ``width`` wide."""
    head = "contender"
    lines = [f"{head:<{width}} {'median':>8} {'p10':>8} {'p90':>8} {'min':>8} {'max':>8} {'n':>4}"]
    for info in contenders.values():
        t = info["total_ms"]
        lines.append(
            f"{info['label']:<{width}} {fmt_ms(t.get('median')):>8} {fmt_ms(t.get('p10')):>8} "
            f"{fmt_ms(t.get('p90')):>8} {fmt_ms(t.get('min')):>8} {fmt_ms(t.get('max')):>8} "
            f"{t['n']:>4}"
        )
    return lines


def ratio_lines_text(ratios: Mapping[str, Any], name_width: int | None = None) -> list[str]:
    """One line per ratio: value, halves, bootstrap interval; names padded to ``name_width``
    (or followed by two spaces)."""
    lines = []
    for name, info in ratios.items():
        halves = " / ".join(f"{h:.3f}" for h in info["halves"])
        low, high = info["bootstrap95"]
        shown = f"{name:<{name_width}} " if name_width is not None else f"{name}  "
        lines.append(
            f"{shown}{info['ratio']:.3f}   halves {halves}   bootstrap95 {low:.3f}–{high:.3f}"
        )
    return lines


def errors_text(report: Mapping[str, Any]) -> list[str]:
    return [f"ERROR: {error}" for error in report["errors"]] + [
        f"LEAK: {leak}" for leak in report["leaks"]
    ]


def outcome(errors: list[str], leaks: list[dict[str, Any]], leftovers: list[Any]) -> dict[str, Any]:
    """The last keys of a report: what went wrong, what leaked, what an earlier run left
    behind, and whether the run counts (``ok``)."""
    return {
        "errors": errors,
        "leaks": leaks,
        "leftovers_before_run": leftovers,
        "ok": not errors and not leaks,
    }


async def stop_and_sweep(
    facts: dict[str, Any], activity: ActivityWatch, leaks: LeakCheck
) -> list[dict[str, Any]]:
    """Stop the shared-daemon watch (its tally goes to ``facts``), then sweep the leaks."""
    facts["daemon_activity_during_run"] = await trio.to_thread.run_sync(activity.stop)
    return await trio.to_thread.run_sync(leaks.sweep)


# --- the end of a run ----------------------------------------------------------------------------


def min_max_series(label: str, summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One plot series, a bar per group: each summary's median, whiskers min–max."""
    return {
        "label": label,
        "median": [s.get("median") for s in summaries],
        "low": [s.get("min") for s in summaries],
        "high": [s.get("max") for s in summaries],
    }


def publish(args: argparse.Namespace, name: str, report: dict[str, Any], text: str) -> int:
    """A suite benchmark's end: print the markdown, write JSON + markdown + PNG to ``--out``
    (``bench/results`` by default), exit status 0 only for a complete, leak-free run."""
    print(text)
    write_outputs(args.out if args.out is not None else RESULTS_DIR, name, report, text)
    return 0 if report["ok"] else 1


def write_report(
    out: Path, name: str, report: dict[str, Any], render: Callable[[dict[str, Any]], str]
) -> None:
    """``NAME.json`` and ``NAME.md`` in ``out`` (nothing for ``-``); a run that failed to
    measure writes ``NAME.failed.*``, never overwriting a complete result."""
    if str(out) == "-":
        return
    stem = name if report["ok"] else name + ".failed"
    write_json(out / f"{stem}.json", report)
    write_atomically(out / f"{stem}.md", render(report))
    say(f"wrote {out / stem}.json and .md")


def run_as_script(
    name: str,
    summary: str,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    main: Callable[[argparse.Namespace], int],
) -> NoReturn:
    """``python -m bench.NAME [options]``: the same as ``python -m bench NAME [options]``."""
    sys.exit(standalone(name, summary, add_arguments, main))
