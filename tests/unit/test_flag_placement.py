"""Where a flag may go on ``sbxkit``'s command line (issue 25): flags between IMAGE and ``--``
are read as flags, a misplaced flag is never run as the payload, and no flag may be
abbreviated, in any subcommand or standalone entry point."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator

import pytest

from sbxkit._grammar.flags import parse_with_flags_after_image
from sbxkit._model.spec import MiB
from sbxkit.cli import EXIT_REFUSED, build_parser, main, spec_from_args
from sbxkit.cli.batch import main as batch_main
from sbxkit.cli.shell import main as shell_main
from sbxkit.cli.shell import shell_spec
from sbxkit.supervisor.config import build_parser as supervisor_parser

IMAGE = "sbxkit-test/busybox:latest"


def parse(*argv: str) -> argparse.Namespace:
    args, unknown = parse_with_flags_after_image(build_parser(), list(argv))
    assert unknown == []
    return args


def refusal(run: Callable[[], object], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        run()
    assert caught.value.code == EXIT_REFUSED
    return capsys.readouterr().err


# --- flags between IMAGE and -- ----------------------------------------------------------------


def test_flags_between_image_and_the_separator_are_flags() -> None:
    args = parse("run", IMAGE, "--json", "--memory", "64m", "--env", "A=1", "--", "echo", "hi")
    assert args.json is True
    spec = spec_from_args(args)
    assert (spec.image, spec.command) == (IMAGE, ["echo", "hi"])
    assert spec.limits.memory_bytes == 64 * MiB
    assert spec.env == {"A": "1"}


def test_flags_on_both_sides_of_image_add_up() -> None:
    spec = spec_from_args(parse("run", "--env", "A=1", IMAGE, "--env", "B=2", "--", "true"))
    assert spec.env == {"A": "1", "B": "2"}


def test_the_shell_reads_them_too() -> None:
    spec, _ = shell_spec(parse("shell", IMAGE, "--timeout", "5m", "--", "sh"), None)
    assert (spec.command, spec.limits.timeout_s) == (["sh"], 300.0)


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        ([IMAGE, "echo", "--", "hi"], ["echo", "--", "hi"]),  # a command first: all of it runs
        ([IMAGE, "--", "--json"], ["--json"]),  # after --, a flag-like word is the command's
        ([IMAGE, "--", "--", "x"], ["--", "x"]),
        ([IMAGE, "sh", "-c", "echo --json"], ["sh", "-c", "echo --json"]),
    ],
)
def test_what_follows_a_command_or_the_separator_stays_the_command(
    argv: list[str], command: list[str]
) -> None:
    assert spec_from_args(parse("run", *argv)).command == command


def test_a_flag_after_image_without_a_separator_is_refused_not_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refusal(lambda: main(["run", IMAGE, "--json"]), capsys)
    assert err.startswith("usage: sbxkit run")
    assert "--json after IMAGE would be the command" in err


def test_a_word_between_image_and_the_separator_that_is_no_flag_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refusal(lambda: main(["run", IMAGE, "--json", "echo", "--", "hi"]), capsys)
    assert "'echo' is neither a flag nor a flag's value" in err


def test_an_unknown_flag_between_image_and_the_separator_is_named(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refusal(lambda: main(["run", IMAGE, "--bogus", "--", "true"]), capsys)
    assert err.startswith("usage: sbxkit run")
    assert "unrecognized arguments: --bogus" in err


def test_the_standalone_shell_reads_them_and_refuses_the_same(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refusal(lambda: shell_main([IMAGE, "--memroy", "64m", "--", "sh"]), capsys)
    assert "unrecognized arguments: --memroy" in err


# --- no abbreviations ---------------------------------------------------------------------------


def every_parser(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from every_parser(child)


def test_no_parser_takes_abbreviations() -> None:
    parsers = list(every_parser(build_parser()))
    assert len(parsers) >= 9  # sbxkit, run, shell, batch, demo, supervisor, leases and its three
    assert [p.prog for p in parsers if p.allow_abbrev] == []
    assert supervisor_parser().allow_abbrev is False


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--mem", "64m", IMAGE, "--", "true"],
        ["run", "--cpu", "1", IMAGE, "--", "true"],
        ["run", IMAGE, "--mem", "64m", "--", "true"],
        ["shell", "--time", "5", IMAGE],
        ["batch", "jobs.jsonl", "--out", "r.jsonl", "--paral", "2"],
        ["demo", "--sock", "/x"],
        ["leases", "--state", "/x", "list"],
        ["supervisor", "--persist"],
    ],
)
def test_an_abbreviated_flag_is_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    err = refusal(lambda: main(argv), capsys)
    assert f"usage: sbxkit {argv[0]}" in err
    # leases: the unknown flag's value then reads as the subcommand's choice
    assert "unrecognized arguments" in err or "invalid choice: '/x'" in err


def test_the_standalone_entry_points_refuse_abbreviations(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "--paral" in refusal(lambda: batch_main(["j", "--out", "r", "--paral", "2"]), capsys)
    assert "--mem" in refusal(lambda: shell_main(["--mem", "64m", IMAGE]), capsys)
    assert "--idle" in refusal(lambda: supervisor_parser().parse_args(["--idle", "3"]), capsys)
