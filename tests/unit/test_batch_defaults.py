"""``sbxkit batch`` has ``sbxkit run``'s default limits (issue 43, item 4): ``--image`` alone
is a complete batch; a flag, a profile or a job line still set their own."""

from __future__ import annotations

from sbxkit._model.spec import MiB
from sbxkit.cli.jobs import defaults_from_args
from sbxkit.cli.parser import build_parser


def _defaults(*argv: str) -> dict[str, object]:
    args = build_parser().parse_args(["batch", "--out", "r.jsonl", *argv, "jobs.jsonl"])
    defaults, _ = defaults_from_args(args)
    return defaults


def test_image_alone_gets_sbxkit_runs_limits() -> None:
    assert _defaults("--image", "busybox:1")["limits"] == {
        "cpus": 1.0,
        "memory_bytes": 256 * MiB,
        "pids": 128,
        "output_bytes": MiB,
        "timeout_s": 30.0,
    }


def test_a_flag_wins_over_the_default() -> None:
    limits = _defaults("--image", "busybox:1", "--memory", "1g", "--timeout", "5m")["limits"]
    assert isinstance(limits, dict)
    assert (limits["memory_bytes"], limits["timeout_s"], limits["pids"]) == (1024 * MiB, 300.0, 128)


def test_the_help_says_the_defaults() -> None:
    text = build_parser()._subparsers._group_actions[0].choices["batch"].format_help()  # type: ignore[union-attr]
    assert "every job's memory; default 256m, as sbxkit run's" in " ".join(text.split())
