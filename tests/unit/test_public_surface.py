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
        "import sys; from sbxkit.cli.parser import build_parser; build_parser(); "
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


def test_public_names_show_the_path_users_import_them_by() -> None:
    """``sbxkit.DockerBackend.__module__`` is ``sbxkit``, not the module defining it, so reprs,
    tracebacks and pickles name the public path — even when it was reached through that module
    first (a fresh process imports it that way). msgspec Structs keep their defining module
    (sbxkit/_util/public.py says why) and are the only exception."""
    code = (
        "import sbxkit.backends.docker as d, sbxkit._lifecycle.supervised as s\n"
        "print(d.DockerBackend.__module__, s.SupervisedOwner.__module__)\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert shown == ["sbxkit", "sbxkit"]
    structs = []
    for name in sbxkit.__all__:
        value = getattr(sbxkit, name)
        if hasattr(value, "__struct_fields__"):
            structs.append(name)
            continue
        if not (isinstance(value, type) or (callable(value) and hasattr(value, "__code__"))):
            continue  # constants, type aliases and submodules have no module of their own
        assert value.__module__ in ("sbxkit", "sbxkit.errors"), (name, value.__module__)
        assert getattr(sys.modules[value.__module__], value.__name__) is value, name
    assert "SandboxSpec" in structs  # the exception is the Structs, and the test sees them


def test_the_cli_package_loads_only_what_is_asked_of_it() -> None:
    """``sbxkit.cli`` is lazy (as ``sbxkit.pool``): one subcommand's module loads neither
    ``main`` nor the other subcommands; a name of the package loads its one module."""
    code = (
        "import sys, sbxkit.cli.cluster\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('sbxkit.cli'))))\n"
        "from sbxkit.cli import EXIT_REFUSED\n"
        "print(EXIT_REFUSED, 'sbxkit.cli.parser' in sys.modules)\n"
    )
    first, second = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert first.split() == ["sbxkit.cli", "sbxkit.cli.cluster"]
    assert second == "2 False"
