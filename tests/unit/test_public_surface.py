"""The one public surface: every name in ``sbxkit.__all__`` resolves, lazily (PEP 562)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import sbxkit


def test_every_public_name_resolves() -> None:
    assert sorted(sbxkit.__all__) == sorted(set(sbxkit.__all__))
    for name in sbxkit.__all__:
        assert getattr(sbxkit, name) is not None, name
    assert sorted(dir(sbxkit)) == sorted(sbxkit.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        sbxkit.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def test_the_command_line_does_not_load_what_it_does_not_use() -> None:
    """``python -m sbxkit run`` is a process per sandbox for some harnesses: the session, PTY,
    grant-broker and asyncio layers stay unloaded."""
    code = (
        "import sys; from sbxkit.cli.main import build_parser; build_parser(); "
        "print(' '.join(sorted(sys.modules)))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert "sbxkit.backends.docker" in loaded  # the test can fail: the CLI loads the backend
    assert not loaded & {
        "sbxkit._consumers.broker",
        "sbxkit._consumers.session",
        "sbxkit._consumers.pty",
        "sbxkit.aio",
        "asyncio",
    }
