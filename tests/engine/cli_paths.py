"""The two paths of ``sbxkit run`` as a process (issue 21, item 5), for the CLI tests that must
hold on each: ``handed`` — the run handed to the state directory's running supervisor
(sbxkit/handoff) — and ``full`` — the whole CLI in the process (``SBXKIT_HANDOFF=off``).

On the handed path every ``sbxkit`` command of the test must say, in ``SBXKIT_HANDOFF_TRACE``,
that it was handed off, unless the test names the fall-back it expects (``falls_back``): a
silent fall-back to the full path fails the test, and so does a trace with nothing in it.

``cli_path`` also starts the supervisor the commands find (a persistent one on a private state
directory, ``SBXKIT_STATE_DIR``); ``cli_handoff`` does not, for tests that start their own and
point the commands at it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.supervision import private_state_dir, running_supervisor


class CliPath:
    def __init__(self, mode: str, trace: Path | None) -> None:
        self.mode = mode
        self.trace = trace
        self.expected: list[str] = []

    @property
    def handed(self) -> bool:
        return self.mode == "handed"

    def falls_back(self, *reasons: str) -> None:
        """On the handed path, commands of this test run the full path (at least one), each
        for one of these reasons (parts of its trace line): a refusal the full path
        reproduces, a piped stdin ..."""
        self.expected.extend(reasons)

    def lines(self) -> list[str]:
        if self.trace is None or not self.trace.exists():
            return []
        return self.trace.read_text().splitlines()

    def check(self) -> None:
        if not self.handed:
            return
        lines = [line for line in self.lines() if "not `sbxkit run`" not in line]
        assert lines, "no sbxkit run traced its path"  # other subcommands are never handed off
        unexpected = [
            line
            for line in lines
            if line != "handed off" and not any(reason in line for reason in self.expected)
        ]
        assert not unexpected, f"fell back to the full path: {unexpected}"
        if self.expected:
            assert any(line != "handed off" for line in lines), f"no fall-back: {lines}"


@pytest.fixture(params=["handed", "full"])
def cli_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliPath]:
    """``sbxkit`` commands on the handed path (a supervisor running for their state directory)
    or on the full path."""
    if request.param == "full":
        monkeypatch.setenv("SBXKIT_HANDOFF", "off")
        yield CliPath("full", None)
        return
    state_dir = private_state_dir()
    trace = state_dir.parent / "handoff.trace"
    try:
        with running_supervisor(state_dir, "--persistent"):
            monkeypatch.setenv("SBXKIT_STATE_DIR", str(state_dir))
            monkeypatch.setenv("SBXKIT_HANDOFF_TRACE", str(trace))
            path = CliPath("handed", trace)
            yield path
        path.check()
    finally:
        shutil.rmtree(state_dir.parent, ignore_errors=True)


@pytest.fixture(params=["handed", "full"])
def cli_handoff(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[CliPath]:
    """As ``cli_path`` for a test that starts its own supervisor and points its commands at
    it: only the switch and the trace."""
    if request.param == "full":
        monkeypatch.setenv("SBXKIT_HANDOFF", "off")
        yield CliPath("full", None)
        return
    trace = tmp_path / "handoff.trace"
    monkeypatch.setenv("SBXKIT_HANDOFF_TRACE", str(trace))
    path = CliPath("handed", trace)
    yield path
    path.check()
