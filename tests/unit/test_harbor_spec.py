"""What sandbox a Harbor trial gets (sbxkit/integrations/_harbor_spec.py): the task's resources
over the profile's over the defaults, and what is refused by name. No Harbor needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from sbxkit._model.spec import GiB, MiB
from sbxkit._plan.plan import check_spec
from sbxkit.errors import SpecError
from sbxkit.integrations._harbor_spec import (
    DEFAULT_DISK_BYTES,
    DEFAULT_LIFETIME_S,
    DEFAULT_MEMORY_BYTES,
    SESSION_LABEL,
    TaskShape,
    definition_refusal,
    exec_argv,
    is_root,
    trial_spec,
)
from tests.doc_blocks import all_blocks

IMAGE = "sbxkit-test/python:latest"


def profile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.toml"
    path.write_text(text)
    return path


def test_the_tasks_resources_are_the_sandboxs_limits_and_disk() -> None:
    task = TaskShape(
        image=IMAGE,
        cpus=2.0,
        memory_mb=768,
        storage_mb=300,
        env={"A": "1"},
        workdir="/app",
        session="t__x__env",
    )
    spec, _ = trial_spec(task)
    assert (spec.limits.cpus, spec.limits.memory_bytes) == (2.0, 768 * MiB)
    assert spec.workspace is not None
    assert (spec.workspace.root, spec.workspace.disk_bytes) == (True, 300 * MiB)
    assert spec.workspace.exec_tmp
    assert spec.limits.fsize_bytes == 300 * MiB  # one file may take the whole disk
    assert (spec.network, spec.user, spec.workdir) == ("none", None, "/app")
    assert spec.env == {"A": "1"}
    assert spec.labels == {SESSION_LABEL: "t__x__env"}
    check_spec(spec)  # a valid spec by every rule


def test_what_the_task_leaves_open_comes_from_the_defaults() -> None:
    spec, _ = trial_spec(TaskShape(image=IMAGE))
    assert spec.limits.memory_bytes == DEFAULT_MEMORY_BYTES
    assert spec.limits.timeout_s == DEFAULT_LIFETIME_S
    assert spec.workspace is not None
    assert spec.workspace.disk_bytes == DEFAULT_DISK_BYTES
    assert spec.workdir is None  # the image's own WORKDIR
    check_spec(spec)


def test_the_profile_fills_what_the_task_leaves_open_and_the_task_wins(tmp_path: Path) -> None:
    path = profile(
        tmp_path,
        '[sandbox.docker]\nimage = "ignored:latest"\nworkdir = "/srv"\n'
        '[sandbox.docker.env]\nB = "2"\n'
        '[sandbox.docker.limits]\ncpus = 1.5\nmemory = "1g"\npids = 99\ntimeout = "2h"\n'
        '[sandbox.docker.workspace]\ndisk = "3g"\nexec_tmp = false\n',
    )
    spec, _ = trial_spec(TaskShape(image=IMAGE, memory_mb=640, env={"A": "1"}), profile=path)
    assert spec.image == IMAGE
    assert (spec.limits.cpus, spec.limits.memory_bytes, spec.limits.pids) == (1.5, 640 * MiB, 99)
    assert spec.limits.timeout_s == 7200
    assert spec.workspace is not None
    assert (spec.workspace.disk_bytes, spec.workspace.exec_tmp) == (3 * GiB, False)
    assert spec.env == {"B": "2", "A": "1"}
    assert spec.workdir == "/srv"
    assert spec.limits.fsize_bytes == 3 * GiB
    spec, _ = trial_spec(TaskShape(image=IMAGE, storage_mb=10), profile=path, lifetime_s=60)
    assert spec.workspace is not None
    assert spec.workspace.disk_bytes == 10 * MiB
    assert spec.limits.timeout_s == 60
    fixed = profile(tmp_path, '[sandbox.docker.limits]\nfsize = "8m"\n')
    spec, _ = trial_spec(TaskShape(image=IMAGE, storage_mb=10), profile=fixed)
    assert spec.limits.fsize_bytes == 8 * MiB  # the profile's own, kept


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ('network = "bridge"\n', "sandbox.docker.network", "'bridge' in the profile"),
        (
            "[sandbox.docker.workspace]\nroot = false\n",
            "sandbox.docker.workspace.root",
            "Harbor runs its setup, the oracle and verifiers as root",
        ),
    ],
)
def test_a_profile_cannot_take_what_the_task_decides(
    tmp_path: Path, text: str, field: str, words: str
) -> None:
    path = profile(tmp_path, "[sandbox.docker]\n" + text)
    with pytest.raises(SpecError) as refused:
        trial_spec(TaskShape(image=IMAGE), profile=path)
    assert refused.value.field == field
    assert words in refused.value.rule


def test_building_and_compose_are_refused_by_name(tmp_path: Path) -> None:
    env = tmp_path / "environment"
    env.mkdir()
    assert definition_refusal(env, IMAGE) is None
    assert definition_refusal(env, None) is None  # Harbor's own check names the missing image
    (env / "Dockerfile").write_text("FROM x\n")
    refusal = definition_refusal(env, None)
    assert refusal is not None
    assert refusal.startswith(f"{env}/Dockerfile: sbxkit never builds")
    assert f"docker build -t NAME {env}" in refusal
    assert definition_refusal(env, IMAGE) is None  # the prebuilt image is used
    forced = definition_refusal(env, IMAGE, force_build=True)
    assert forced is not None
    assert forced.startswith("--force-build: sbxkit never builds images")
    (env / "docker-compose.yaml").write_text("services: {}\n")
    composed = definition_refusal(env, IMAGE)
    assert composed is not None
    assert "does not run docker compose" in composed


@pytest.mark.parametrize(
    ("user", "root"),
    [
        (None, True),
        ("root", True),
        (0, True),
        ("0", True),
        ("0:0", True),
        ("agent", False),
        (1000, False),
        ("1000:1000", False),
    ],
)
def test_only_root_names_the_workspaces_user(user: str | int | None, root: bool) -> None:
    assert is_root(user) is root


def test_root_runs_bash_and_another_user_is_dropped_to_first() -> None:
    assert exec_argv("echo hi", None) == ["bash", "-c", "echo hi"]
    assert exec_argv("echo hi", "root") == ["bash", "-c", "echo hi"]
    argv = exec_argv("echo hi", 1000)
    assert argv[:2] == ["sh", "-c"]
    assert argv[3:] == ["sbxkit-as-user", "1000", "echo hi"]  # the command is never spliced in
    assert "setpriv --reuid" in argv[2]


def test_the_documented_profile_is_one_a_trial_takes(tmp_path: Path) -> None:
    """docs/integrations.md's Harbor profile: the task's values over it, its own elsewhere."""
    text = (Path(__file__).parents[2] / "docs" / "integrations.md").read_text()
    harbor = text[: text.index("## Harbor")].count("\n") + 1  # the section's first line
    blocks = [b for b in all_blocks() if b.source == "docs/integrations.md" and b.line > harbor]
    (block,) = [b for b in blocks if b.lang == "toml"]
    path = profile(tmp_path, block.code)
    spec, _ = trial_spec(TaskShape(image=IMAGE, memory_mb=1024), profile=path)
    assert (spec.runtime, spec.limits.cpus, spec.limits.memory_bytes) == ("gvisor", 2, GiB)
    assert (spec.limits.pids, spec.limits.output_bytes) == (2048, 32 * MiB)
    assert spec.limits.timeout_s == 6 * 3600
    assert spec.workspace is not None
    assert spec.workspace.disk_bytes == 10 * GiB
    check_spec(spec)
