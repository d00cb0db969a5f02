"""Developer sessions. ``./dev test`` and ``./dev demo`` are the README's two commands."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

ENGINE_UP = "scripts/engine-up"


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite: pure unit tests and real-engine tests (provisions the engine first)."""
    session.run("bash", ENGINE_UP, external=True)
    session.install("-e", ".[test,inspect]")
    session.run("pytest", *session.posargs)


@nox.session
def unit(session: nox.Session) -> None:
    """Only the pure tests (no daemon needed)."""
    session.install("-e", ".[test]")
    session.run("pytest", "tests/unit", *session.posargs)


@nox.session
def demo(session: nox.Session) -> None:
    """The main job: hostile payloads in real sandboxes, each limit shown holding."""
    session.run("bash", ENGINE_UP, external=True)
    session.install("-e", ".")
    session.run("sbxkit", "demo", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.5")
    session.run("ruff", "check", "sbxkit", "tests", "bench", "noxfile.py")
    session.run("ruff", "format", "--check", "sbxkit", "tests", "bench", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test,inspect]", "mypy>=1.10")
    session.run("mypy")
    # What callers' type checkers must refuse (each line carries the error it must raise).
    session.run("mypy", "--warn-unused-ignores", "tests/typing")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: ratios against baselines measured in the same run."""
    session.run("bash", ENGINE_UP, external=True)
    session.install("-e", ".[bench]")
    session.run("python", "-m", "bench", *session.posargs)
