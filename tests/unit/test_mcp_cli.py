"""``sbxkit mcp`` at the command line, before any sandbox: the SDK stays out of everything but
the server itself, a missing extra is said plainly, bad input is refused by name (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SDK = ("mcp", "mcp_types", "anyio", "uvicorn", "starlette", "pydantic")
PROFILE = """
[sandbox.docker]
image = "sbxkit-test/busybox:latest"

[sandbox.docker.limits]
cpus = 1
memory = "64m"
pids = 32
max_output = "64k"
timeout = 10
"""
RECORD_SDK_IMPORTS = f"""
import importlib.abc, sys

asked = set()

class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {SDK!r}:
            asked.add(name.split(".")[0])
        return None

sys.meta_path.insert(0, Recorder())
"""
BLOCK_SDK = """
import importlib.abc, sys

class NoSdk(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {"mcp", "mcp_types"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoSdk())
from sbxkit.cli import main
main(sys.argv[1:])
"""


def python(
    code: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
        check=False,
        env=env,
    )


def sbxkit_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return python("from sbxkit.cli import main; import sys; main(sys.argv[1:])", *args, env=env)


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "profile.toml"
    path.write_text(PROFILE)
    return path


def test_only_the_server_imports_the_sdk() -> None:
    """Whether the SDK is installed or not: nothing but the server even asks for it."""
    code = RECORD_SDK_IMPORTS + (
        "import sbxkit, sbxkit.cli.parser, sbxkit._grammar.profile, sbxkit.mcp.policy, "
        "sbxkit.mcp.schemas, sbxkit.mcp.hub\n"
        "print(' '.join(sorted(asked)))\n"
        "try:\n    import sbxkit.mcp.server\nexcept ImportError:\n    pass\n"
        "print(' '.join(sorted(asked)))\n"
    )
    before, after = python(code).stdout.split("\n")[:2]
    assert before == ""
    assert after.split()  # the test can fail: the server does ask for the SDK


def test_a_missing_extra_says_how_to_install_it(profile: Path) -> None:
    done = python(BLOCK_SDK, "mcp", "--profile", str(profile))
    assert done.returncode == 2, done.stderr
    assert "needs the MCP SDK" in done.stderr
    assert "pip install '.[mcp]' in the sbxkit clone" in done.stderr


@pytest.mark.parametrize("address", ["0.0.0.0:8765", "192.168.1.10:80", "localhost:8765"])
def test_http_refuses_a_non_loopback_address_by_name(profile: Path, address: str) -> None:
    done = sbxkit_cli("mcp", "--profile", str(profile), "--http", address)
    assert done.returncode == 2, done.stderr
    host = address.rpartition(":")[0]
    assert "--http: " in done.stderr
    assert host in done.stderr
    assert "loopback" in done.stderr


def test_a_bad_mcp_table_is_refused_by_path(profile: Path) -> None:
    profile.write_text(PROFILE + "\n[mcp]\nmax_sandbox = 3\n")
    done = sbxkit_cli("mcp", "--profile", str(profile))
    assert done.returncode == 2, done.stderr
    assert "mcp.max_sandbox: unknown field" in done.stderr


def test_a_profile_without_a_ceiling_is_refused_by_path(profile: Path) -> None:
    profile.write_text(PROFILE.replace("pids = 32\n", ""))
    done = sbxkit_cli("mcp", "--profile", str(profile))
    assert done.returncode == 2, done.stderr
    assert "sandbox.docker.limits.pids: mandatory for sbxkit mcp" in done.stderr


def test_production_refuses_a_bridge_profile_at_start(profile: Path) -> None:
    bridge = PROFILE.replace("[sandbox.docker]\n", '[sandbox.docker]\nnetwork = "bridge"\n')
    profile.write_text(bridge)
    env = {**os.environ, "SBXKIT_ENV": "production"}
    done = sbxkit_cli("mcp", "--profile", str(profile), env=env)
    assert done.returncode == 2, done.stderr
    assert "network: " in done.stderr
    assert "production" in done.stderr


HOST_FILES = [
    (
        '[[sandbox.docker.mounts]]\ntype = "bind"\nsource = "{missing}"\ntarget = "/data"\n',
        "sandbox.docker.mounts[0].source: {missing} must exist on the host",
    ),
    (
        'network_audit_log = "{missing}/egress.jsonl"\n',
        "sandbox.docker.network_audit_log: {missing}/egress.jsonl: its directory {missing} "
        "does not exist",
    ),
    (
        '[sandbox.docker.network]\ncallback = "https://harness.internal:8443"\n'
        '[sandbox.docker.network.tls]\nca = "{missing}.pem"\n',
        "sandbox.docker.network.tls.ca: cannot read {missing}.pem",
    ),
    (
        '[sandbox.docker.supervisor]\nbinary = "{missing}"\n',
        "sandbox.docker.supervisor.binary: {missing} is not an executable file",
    ),
]


@pytest.mark.parametrize(
    ("table", "says"), HOST_FILES, ids=["mount", "audit-log", "tls", "supervisor"]
)
def test_a_missing_host_file_is_refused_at_start(
    profile: Path, tmp_path: Path, table: str, says: str
) -> None:
    """Issue 43: a profile naming a host file that is not there started, then failed every
    call. Now the server does not start: exit 2, the key and the path named."""
    missing = str(tmp_path / "not-there")
    text = PROFILE.replace("[sandbox.docker]\n", "[sandbox.docker]\nenable_bind_mounts = true\n")
    if table.startswith("network_audit_log"):
        text = text.replace("[sandbox.docker]\n", "[sandbox.docker]\n" + table)
    else:
        text += "\n" + table
    profile.write_text(text.format(missing=missing))
    done = sbxkit_cli("mcp", "--profile", str(profile))
    assert done.returncode == 2, done.stderr
    assert says.format(missing=missing) in done.stderr
    assert "Traceback" not in done.stderr


def test_the_profile_is_required() -> None:
    done = sbxkit_cli("mcp")
    assert done.returncode == 2
    assert "--profile" in done.stderr


GOOD_TOKEN = "k" * 43


@pytest.mark.parametrize(
    ("content", "mode", "rule"),
    [
        (None, 0o600, "no such file"),
        (GOOD_TOKEN, 0o644, "is open to group or others (mode 0644)"),
        (GOOD_TOKEN, 0o660, "is open to group or others (mode 0660)"),
        ("tooshort-but-secret", 0o600, "line 1: the token is 19 characters; at least 32"),
        (f"a {GOOD_TOKEN}\n{GOOD_TOKEN}x\n", 0o600, "line 2: name each token"),
    ],
)
def test_a_token_file_is_refused_by_name(
    profile: Path, tmp_path: Path, content: str | None, mode: int, rule: str
) -> None:
    """Before anything listens (exit 2): the option and the file named, the rule said, the
    token never shown."""
    path = tmp_path / "tokens"
    if content is not None:
        path.write_text(content)
        path.chmod(mode)
    done = sbxkit_cli(
        "mcp", "--profile", str(profile), "--http", "127.0.0.1:0", "--token-file", str(path)
    )
    assert done.returncode == 2, done.stderr
    assert f"--token-file {path}: {rule}" in done.stderr
    assert "serving" not in done.stderr
    for secret in (GOOD_TOKEN, "tooshort-but-secret"):
        assert secret not in done.stderr


def test_a_token_file_is_for_http(profile: Path, tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_text(GOOD_TOKEN)
    path.chmod(0o600)
    done = sbxkit_cli("mcp", "--profile", str(profile), "--token-file", str(path))
    assert done.returncode == 2, done.stderr
    assert "--token-file: authenticates HTTP clients: use it with --http" in done.stderr


def test_a_token_file_is_not_followed_through_a_link(profile: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_text(GOOD_TOKEN)
    real.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(real)
    done = sbxkit_cli(
        "mcp", "--profile", str(profile), "--http", "127.0.0.1:0", "--token-file", str(link)
    )
    assert done.returncode == 2, done.stderr
    assert f"--token-file {link}: is a symbolic link; name the file itself" in done.stderr
