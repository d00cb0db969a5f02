"""The pure ``sbx`` argv builders and the ``sbx ls`` parser: what each argv means.

Docker's ``sbx`` CLI is not installed anywhere these tests run, so each builder's output is
pinned here exactly, with the reason for each element; the exec script is additionally run
for real with the host's ``sh`` (and bash/busybox where present), since it is shell code.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbxkit._model.gpu import GpuRequest
from sbxkit._model.mounts import TmpfsMount
from sbxkit.backends.sbx_commands import (
    DEFAULT_USER,
    EXEC_SETUP_FAILED,
    check_agent,
    check_binary,
    check_create_args,
    check_host_ports,
    check_kits,
    check_runner_id,
    check_sandbox_fields,
    check_workspace,
    encode_env,
    owner_of,
    parse_sandbox_list,
    runner_prefix,
    sandbox_name,
    sbx_create_args,
    sbx_exec_args,
    sbx_exec_script,
    sbx_list_args,
    sbx_policy_args,
    sbx_remove_args,
)
from sbxkit.errors import SandboxListError, SpecError

NAME = "sbxkit-a1b2c3d4-0123456789abcdef"
WORKSPACE = "/tmp/sbxkit-a1b2c3d4-0123456789abcdef-x1"

# --- names -------------------------------------------------------------------------------------


def test_names_carry_the_runner_id_and_parse_back() -> None:
    name = sandbox_name("a1b2c3d4", "0123456789abcdef")
    assert name == NAME
    assert name.startswith(runner_prefix("a1b2c3d4"))
    assert owner_of(name) == "a1b2c3d4"


@pytest.mark.parametrize(
    "name",
    [
        "claude-myproject",  # a human's sandbox
        "sbxkit-a1b2c3d4",  # no run id
        "sbxkit-a1b2c3d4-0123",  # short run id
        "sbxkit-A1B2-0123456789abcdef",  # upper case is not ours
        "sbxkit-a1-b2-0123456789abcdef",  # a dash in the runner id
        "xsbxkit-a1b2c3d4-0123456789abcdef",
        "sbxkit-a1b2c3d4-0123456789abcdef-extra",
    ],
)
def test_names_not_built_by_a_runner_have_no_owner(name: str) -> None:
    assert owner_of(name) is None


@pytest.mark.parametrize("runner_id", ["", "a-b", "UPPER", "x" * 25, "a b", 7])
def test_runner_ids_are_short_lowercase_alphanumerics(runner_id: object) -> None:
    with pytest.raises(SpecError) as caught:
        check_runner_id(runner_id)
    assert caught.value.field == "runner_id"


def test_run_ids_are_16_hex_digits() -> None:
    with pytest.raises(SpecError):
        sandbox_name("a1", "xyz")


# --- create -------------------------------------------------------------------------------------


def test_create_argv() -> None:
    argv = sbx_create_args(
        "sbx",
        name=NAME,
        agent="shell",
        workspace=WORKSPACE,
        template="docker/sandbox-templates:shell",
    )
    assert argv == [
        "sbx",
        "create",
        "shell",  # the agent, sbx's subcommand-like positional (`sbx create shell PATH`)
        "--name",  # the runner's name: removal and orphan reconciliation find it by this
        NAME,
        "--template",  # the spec's image is the sandbox's container image
        "docker/sandbox-templates:shell",
        WORKSPACE,  # the workspace at its HOST path: sbx mounts it at the same path inside
    ]


def test_create_argv_with_kits_and_the_escape_hatch() -> None:
    argv = sbx_create_args(
        "/opt/sbx/bin/sbx",
        name=NAME,
        agent="claude",
        workspace=WORKSPACE,
        template="img:1",
        kits=["./kits/python", "oci://example/kit:1"],
        create_args=["--memory", "8g", "--cpus", "2"],
    )
    assert argv == [
        "/opt/sbx/bin/sbx",
        "create",
        "claude",
        "--name",
        NAME,
        "--template",
        "img:1",
        "--kit",  # one --kit per reference
        "./kits/python",
        "--kit",
        "oci://example/kit:1",
        "--memory",  # create_args, verbatim, after ours and before the workspace
        "8g",
        "--cpus",
        "2",
        WORKSPACE,  # always last: the one positional path
    ]


@pytest.mark.parametrize(
    "args",
    [["--name", "x"], ["--name=x"], ["--template", "i"], ["--template=i"], ["-t", "i"], ["-ti"]],
)
def test_create_args_may_not_take_the_name_or_the_template(args: list[str]) -> None:
    with pytest.raises(SpecError) as caught:
        check_create_args(args)
    assert caught.value.field == "create_args[0]"
    with pytest.raises(SpecError):
        sbx_create_args("sbx", name=NAME, agent="shell", workspace=WORKSPACE, template="i",
                        create_args=args)  # fmt: skip


@pytest.mark.parametrize("args", [["-m", "4g"], ["--cpus=2"], ["--branch", "main"]])
def test_other_create_args_pass(args: list[str]) -> None:
    assert check_create_args(args) == args


@pytest.mark.parametrize(
    ("args", "field"),
    [("--memory 8g", "create_args"), ([""], "create_args[0]"), (["a\nb"], "create_args[0]")],
)
def test_create_args_shape(args: object, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        check_create_args(args)
    assert caught.value.field == field


@pytest.mark.parametrize(
    "workspace", ["relative/dir", "/tmp/a:ro", "/tmp/../etc", "/tmp/a\nb", "", None]
)
def test_workspaces_are_plain_absolute_host_paths(workspace: object) -> None:
    with pytest.raises(SpecError):
        check_workspace(workspace)


@pytest.mark.parametrize("agent", ["", "Shell", "-x", "a b", "../x", None])
def test_agents_are_plain_names(agent: object) -> None:
    with pytest.raises(SpecError):
        check_agent(agent)


@pytest.mark.parametrize("kits", ["kit", [""], ["-kit"], ["a\tb"], [3]])
def test_kits_are_references_not_flags(kits: object) -> None:
    with pytest.raises(SpecError):
        check_kits(kits)


@pytest.mark.parametrize("binary", ["", "bin/sbx", "-sbx", "/opt/../sbx", "sb\nx", None])
def test_binaries_are_names_or_absolute_paths(binary: object) -> None:
    with pytest.raises(SpecError):
        check_binary(binary)
    assert check_binary("sbx") == "sbx"
    assert check_binary("/usr/local/bin/sbx") == "/usr/local/bin/sbx"


# --- exec ---------------------------------------------------------------------------------------


def test_exec_argv() -> None:
    argv = sbx_exec_args("sbx", NAME, "SCRIPT", ["python3", "-c", "print(1)"])
    assert argv == [
        "sbx",
        "exec",
        "-i",  # stdin stays open: the environment, then the payload's stdin, arrive on it
        "--",  # before the name: ends sbx's flags however it parses them, so -c is not sbx's
        NAME,
        "sh",
        "-c",
        "SCRIPT",
        "sbxkit-exec",  # $0 of the script
        "python3",  # the command: "$@" of the script, exec'd as is
        "-c",
        "print(1)",
    ]
    # No channel for the environment in argv, no user or workdir override.
    assert not {"-e", "--env", "--env-file", "-u", "--user", "-w", "--workdir"} & set(argv[:5])


def test_exec_needs_a_command() -> None:
    with pytest.raises(SpecError):
        sbx_exec_args("sbx", NAME, "SCRIPT", [])


def test_encode_env_exact_bytes() -> None:
    encoded = encode_env({"A": "a b\n", "B": "\\", "C": "", "D": "é"})
    assert encoded == (
        b"A a\\0040b\\0012\n"  # space and newline as printf %b octal escapes
        b"B \\0134\n"  # a backslash is escaped too, so %b never sees an escape of the user's
        b"C \n"  # empty value
        b"D \\0303\\0251\n"  # UTF-8 bytes, one escape each
        b".\n"  # the end of the environment; the payload's stdin follows
    )


@pytest.mark.parametrize("key", ["A.B", "1X", "A-B"])
def test_encode_env_needs_shell_names(key: str) -> None:
    with pytest.raises(SpecError):
        encode_env({key: "v"})


SHELLS = ["sh"] + [s for s in ("dash", "bash") if shutil.which(s)]
if shutil.which("busybox"):
    SHELLS.append("busybox sh")

DUMP = (
    "import json, os, sys; "
    "print(json.dumps({'env': dict(os.environ), 'cwd': os.getcwd(), "
    "'stdin': sys.stdin.read(), 'argv': sys.argv[1:]}))"
)


def run_script(
    shell: str, script: str, stdin: bytes, command: list[str]
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [*shell.split(), "-c", script, "sbxkit-exec", *command],
        input=stdin,
        capture_output=True,
        env={"PATH": os.environ["PATH"]},
        check=False,
        timeout=30,
    )


@pytest.mark.parametrize("shell", SHELLS)
def test_exec_script_links_the_target_reads_env_and_execs(shell: str, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    target = tmp_path / "vm-root" / "work"
    env = {"PLAIN": "value", "TRICKY": " lead\\ntrail \n\n", "EMPTY": "", "U": "ünï"}
    script = sbx_exec_script([(str(target), str(workspace))], str(target))
    done = run_script(
        shell,
        script,
        encode_env(env) + b"payload stdin\nsecond line",
        ["python3", "-c", DUMP, "arg one"],
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert target.is_symlink()
    assert os.readlink(target) == str(workspace)
    assert seen["cwd"] == str(workspace)  # python resolves the link
    for key, value in env.items():
        assert seen["env"][key] == value
    assert not any(k.startswith("sbxkit_") for k in seen["env"])  # the script's own variables
    assert seen["stdin"] == "payload stdin\nsecond line"
    assert seen["argv"] == ["arg one"]


# Variables the shell itself maintains (sh is dash here, often bash elsewhere).
SHELL_OWNED = {"PATH", "PWD", "OLDPWD", "SHLVL", "_", "LINENO", "RANDOM", "SECONDS", "OPTIND"}
SHELL_OWNED |= {"PPID", "BASH_ENV", "ENV", "IFS", "HISTCMD", "SRANDOM", "EPOCHSECONDS"}


@settings(max_examples=15, deadline=None)
@given(
    env=st.dictionaries(
        st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True),
        st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0")),
        max_size=8,
    ),
    stdin=st.binary(max_size=64),
)
def test_any_environment_round_trips_through_stdin(env: dict[str, str], stdin: bytes) -> None:
    env = {k: v for k, v in env.items() if k not in SHELL_OWNED}
    script = sbx_exec_script([], "/")
    done = run_script(
        "sh", script, encode_env(env) + stdin, ["python3", "-c", DUMP.replace("'stdin'", "'x'")]
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)["env"]
    assert {k: seen.get(k) for k in env} == env


def test_exec_script_without_links_runs_in_the_workspace(tmp_path: Path) -> None:
    script = sbx_exec_script([(str(tmp_path), str(tmp_path))], str(tmp_path))
    assert "sbxkit_link " + str(tmp_path) not in script  # same path: nothing to link
    done = run_script("sh", script, encode_env({}), ["pwd"])
    assert done.returncode == 0
    assert done.stdout.decode().strip() == str(tmp_path)


def test_exec_script_fails_without_the_environment_terminator(tmp_path: Path) -> None:
    done = run_script("sh", sbx_exec_script([], str(tmp_path)), b"A 1\n", ["true"])
    assert done.returncode == EXEC_SETUP_FAILED
    assert b"sbxkit-exec: the environment did not arrive on stdin" in done.stderr


def test_exec_script_never_replaces_an_existing_target(tmp_path: Path) -> None:
    target = tmp_path / "occupied"
    target.mkdir()
    script = sbx_exec_script([(str(target), str(tmp_path / "ws"))], str(target))
    done = run_script("sh", script, encode_env({}), ["true"])
    assert done.returncode == EXEC_SETUP_FAILED
    assert b"exists and is not the workspace" in done.stderr
    assert target.is_dir()
    assert not target.is_symlink()


def test_exec_script_paths_must_be_absolute() -> None:
    with pytest.raises(SpecError):
        sbx_exec_script([("work", "/ws")], "/ws")
    with pytest.raises(SpecError):
        sbx_exec_script([], "ws")


# --- policy, rm, ls -----------------------------------------------------------------------------


def test_policy_argv_one_rule_per_typed_port() -> None:
    assert sbx_policy_args("sbx", NAME, [8080, 5432]) == [
        ["sbx", "policy", "allow", "network", "--sandbox", NAME, "localhost:8080"],
        ["sbx", "policy", "allow", "network", "--sandbox", NAME, "localhost:5432"],
    ]
    assert sbx_policy_args("sbx", NAME, []) == []


@pytest.mark.parametrize("ports", [["8080"], [True], [0], [65536], [-1], [80, 80], "80", [8.0]])
def test_host_ports_are_typed(ports: object) -> None:
    with pytest.raises(SpecError) as caught:
        check_host_ports(ports)
    assert caught.value.field.startswith("host_ports")


def test_remove_and_list_argv() -> None:
    # --force: no confirmation prompt in a non-interactive process; it is also the kill.
    assert sbx_remove_args("sbx", NAME) == ["sbx", "rm", "--force", NAME]
    assert sbx_list_args("sbx") == ["sbx", "ls", "--json"]


def test_builders_refuse_non_names() -> None:
    for build in (
        lambda: sbx_remove_args("sbx", "--all"),
        lambda: sbx_exec_args("sbx", "-x", "s", ["true"]),
        lambda: sbx_policy_args("sbx", "a b", [1]),
    ):
        with pytest.raises(SpecError):
            build()


LISTING = [
    {"name": NAME, "agent": "shell", "status": "running", "workspace": WORKSPACE},
    {"name": "claude-proj", "agent": "claude", "status": "stopped"},
]


@pytest.mark.parametrize(
    "output",
    [
        json.dumps(LISTING),
        json.dumps({"sandboxes": LISTING}, indent=2),
        json.dumps({"items": LISTING}),
        "A new version of sbx is available: 9.9\n\n" + json.dumps(LISTING),
        "[notice] update available\n" + json.dumps(LISTING, indent=2),  # a banner with '['
        '{"level":"warn","msg":"slow daemon"}\n' + json.dumps(LISTING),  # a log line first
        json.dumps([NAME, "claude-proj"]),
        json.dumps(LISTING) + "\ntrailing text\n",
    ],
)
def test_list_parses_json_behind_banners(output: str) -> None:
    assert parse_sandbox_list(output) == [NAME, "claude-proj"]
    assert parse_sandbox_list(output.encode()) == [NAME, "claude-proj"]


def test_list_tolerates_missing_fields() -> None:
    output = json.dumps([{"Name": "a1"}, {"agent": "shell"}, {"name": None}, {"name": "-x"}, 3])
    assert parse_sandbox_list(output) == ["a1"]


@pytest.mark.parametrize(
    "output", ["", "\n", "[]", "null", "banner\nnull\n", '{"sandboxes": null}']
)
def test_empty_listings(output: str) -> None:
    assert parse_sandbox_list(output) == []


def test_list_falls_back_to_a_name_table() -> None:
    table = f"NAME   AGENT  STATUS\n{NAME}  shell  running\nclaude-proj claude stopped\n"
    assert parse_sandbox_list(table) == [NAME, "claude-proj"]


@pytest.mark.parametrize("output", ["error: not logged in", "{broken", "Sandboxes: a, b"])
def test_unreadable_listings_are_errors_not_empty(output: str) -> None:
    with pytest.raises(SandboxListError):
        parse_sandbox_list(output)


@given(st.text(max_size=200))
def test_the_list_parser_returns_names_or_raises_its_error(output: str) -> None:
    try:
        names = parse_sandbox_list(output)
    except SandboxListError:  # an SbxError: no other exception may escape
        return
    assert all(isinstance(n, str) and n and not n.startswith("-") for n in names)


# --- what the runtime refuses -------------------------------------------------------------------

FIELDS: dict[str, object] = {
    "network": None,
    "user": None,
    "runtime": None,
    "mounts": [],
    "gpus": None,
    "labels": {},
    "extra_flags": [],
    "env": {},
}


def test_defaults_pass() -> None:
    check_sandbox_fields(**FIELDS)  # type: ignore[arg-type]
    check_sandbox_fields(**{**FIELDS, "network": "none", "user": DEFAULT_USER})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"network": "bridge"}, "network"),
        ({"user": "1000:1000"}, "user"),
        ({"runtime": "gvisor"}, "runtime"),
        ({"mounts": [TmpfsMount(target="/scratch", size_bytes=1024)]}, "mounts"),
        ({"gpus": GpuRequest(count=1)}, "gpus"),
        ({"labels": {"a": "b"}}, "labels"),
        ({"extra_flags": ["--label=a=b"]}, "extra_flags"),
        ({"env": {"A.B": "1"}}, "env['A.B']"),
        ({"env": {"sbxkit_line": "1"}}, "env['sbxkit_line']"),
    ],
)
def test_what_a_microvm_cannot_honour_is_refused(change: dict[str, object], field: str) -> None:
    with pytest.raises(SpecError) as caught:
        check_sandbox_fields(**{**FIELDS, **change})  # type: ignore[arg-type]
    assert caught.value.field == field
