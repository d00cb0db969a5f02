"""docker's spellings on sbxkit's command line: taken where the meaning is the same, answered
with what to use instead where it is not, all before anything exists."""

from __future__ import annotations

from pathlib import Path

import pytest

from sbxkit._grammar.common import subcommand_parser
from sbxkit._grammar.docker_habits import (
    NAME_LABEL,
    advice,
    env_file_pairs,
    mount_option,
    user_flag,
    volume_mount,
)
from sbxkit._grammar.flags import flag_for, spec_from_args
from sbxkit._grammar.run_grammar import take_docker_stdin
from sbxkit._model.mounts import BindMount, TmpfsMount, VolumeMount
from sbxkit._model.spec import MiB
from sbxkit.cli.parser import build_parser
from sbxkit.errors import SpecError


def _run_args(*argv: str):  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["run", *argv])


def test_short_flags_mean_what_docker_means(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    env_file.write_text("# a comment\n\nA=1\nB=from file\n")
    args = _run_args(
        "-e",
        "B=flag",
        "-m",
        "64m",
        "-w",
        "/tmp",
        "-u",
        "1234",
        "-l",
        "k=v",
        "--env-file",
        str(env_file),
        "--name",
        "job-7",
        "--rm",
        "--read-only",
        "--entrypoint",
        "/bin/echo",
        "img:1",
        "--",
        "hi",
    )
    spec = spec_from_args(args)
    assert spec.env == {"A": "1", "B": "flag"}  # a flag wins over the file, as in docker
    assert spec.limits.memory_bytes == 64 * MiB
    assert (spec.workdir, spec.user) == ("/tmp", "1234:1234")
    assert spec.labels == {"k": "v", NAME_LABEL: "job-7"}
    assert spec.command == ["/bin/echo", "hi"]


def test_volumes_and_mounts_read_as_docker_reads_them(tmp_path: Path) -> None:
    assert volume_mount(f"{tmp_path}:/data") == BindMount(
        source=str(tmp_path), target="/data", read_only=True
    )
    assert volume_mount("./x:/data:rw") == BindMount(
        source=str(Path("x").absolute()), target="/data", read_only=False
    )
    assert volume_mount("cache:/c") == VolumeMount(source="cache", target="/c", read_only=True)
    assert mount_option("type=tmpfs,target=/scratch,tmpfs-size=8m") == TmpfsMount(
        target="/scratch", size_bytes=8 * MiB
    )
    assert mount_option("type=bind,source=/srv,target=/srv,readonly") == BindMount(
        source="/srv", target="/srv", read_only=True
    )
    for bad, rule in [
        ("a", "must be SRC:DST"),
        ("/a:/b:rx", "mode 'rx'"),
    ]:
        with pytest.raises(SpecError, match=rule):
            volume_mount(bad)
    for bad, rule in [
        ("type=tmpfs,target=/x", "tmpfs-size= is required"),
        ("type=bind,target=/x", "source= is required"),
        ("type=npipe,source=a,target=/x", "type 'npipe'"),
        ("type=bind,source=/a,target=/x,bind-propagation=shared", "unknown option"),
    ]:
        with pytest.raises(SpecError, match=rule):
            mount_option(bad)


def test_a_bind_mount_is_refused_naming_the_flag_unless_the_operator_enables_it() -> None:
    from sbxkit._grammar.flags import flags_in_errors
    from sbxkit._model.spec import validate_spec

    args = _run_args("-v", "/srv:/srv", "img:1", "--", "true")
    spec = spec_from_args(
        args,
        defaults={"cpus": "1", "memory": "64m", "pids": "8", "max_output": "1k", "timeout": "5"},
    )
    with (
        pytest.raises(SpecError, match=r"-v/--mount\[0\]: bind mounts are disabled") as caught,
        flags_in_errors(args),
    ):
        validate_spec(spec)
    assert "enable_bind_mounts = true" in str(caught.value)


def test_user_alone_is_its_own_group() -> None:
    assert user_flag("1000") == "1000:1000"
    assert user_flag("1000:2000") == "1000:2000"
    assert user_flag("nobody") == "nobody"  # refused later, by name


def test_env_file_refusals_name_the_flag(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="--env-file: cannot read"):
        env_file_pairs([str(tmp_path / "absent")])
    (tmp_path / "bin").write_bytes(b"A=\xff\n")
    with pytest.raises(SpecError, match="is not UTF-8"):
        env_file_pairs([str(tmp_path / "bin")])


def test_i_is_stdin_and_t_is_refused_with_the_way_to_a_terminal() -> None:
    args = _run_args("-i", "img:1", "--", "cat")
    take_docker_stdin(args)
    assert args.stdin == "-"
    with pytest.raises(SpecError, match="-t: sbxkit run has no terminal; sbxkit shell"):
        take_docker_stdin(_run_args("-it", "img:1", "--", "sh"))
    with pytest.raises(SpecError, match="-i: and --stdin f: name one source"):
        take_docker_stdin(_run_args("-i", "--stdin", "f", "img:1", "--", "cat"))


@pytest.mark.parametrize(
    ("unknown", "said"),
    [
        (["--memmory", "5m"], "unrecognized arguments: --memmory 5m (did you mean --memory?)"),
        (["--privileged"], "--privileged: not a flag of sbxkit's: never"),
        (["-p", "80:80"], "-p: not a flag of sbxkit's: --port [ADDR:][HOST_PORT:]PORT forwards"),
        (["--pull=always"], "--pull: not a flag of sbxkit's: sbxkit never pulls"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    ],
)
def test_unknown_flags_say_what_to_use_instead(unknown: list[str], said: str) -> None:
    run = subcommand_parser(build_parser(), "run")
    assert advice(run, unknown).startswith(said)


@pytest.mark.parametrize(
    ("field", "flag"),
    [
        ("limits.output_bytes", "--max-output"),
        ("limits.memory_bytes", "--memory"),
        ("network.allow[0]", "--allow[0]"),
        ("env['K']", "--env['K']"),
        ("command[1]", "CMD[1]"),
        ("workspace.disk_bytes", "--disk"),
        ("mounts[1].source", "-v/--mount[1]"),
        ("something.else", "something.else"),
        ("network.tls", "--tls-ca/--tls-cert/--tls-key"),
        ("network.max_connections", "network.max_connections"),
        ("workspace.exec_tmp", "--exec-tmp"),
    ],
)
def test_spec_fields_are_named_as_their_flags(field: str, flag: str) -> None:
    assert flag_for(field) == flag


def test_no_doc_installs_sbxkit_from_pypi() -> None:
    """sbxkit is installed from its clone (`pip install '.[mcp]'`): `pip install
    'sbxkit[...]'` fails with "No matching distribution" (issue 43, item 1)."""
    import re

    root = Path(__file__).resolve().parents[2]
    texts = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    texts += sorted((root / "sbxkit").rglob("*.py"))
    offenders = [
        f"{path.relative_to(root)}: {match.group(0)}"
        for path in texts
        for match in re.finditer(r"pip install '?sbxkit\[", path.read_text())
    ]
    assert offenders == []
