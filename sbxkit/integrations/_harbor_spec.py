"""What sandbox a Harbor trial gets, and what it is refused: pure rules over plain values, so
that they are tested without Harbor (``sbxkit.integrations.harbor`` is the I/O shell).

A trial's sandbox is a workspace (root inside, where that is provably not the host's root) with
its image writable under a disk bound, no network, and the mandatory limits. Each limit comes
from the task if it names one (``cpus``, ``memory_mb``, ``storage_mb``), else from the sbxkit
profile, else from the defaults below.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from sbxkit._grammar.profile import apply_profile, load_profile
from sbxkit._model.settings import Settings
from sbxkit._model.spec import Limits, MiB, SandboxSpec, Workspace
from sbxkit._model.units import GiB
from sbxkit.errors import SpecError

DEFAULT_CPUS = 1.0
DEFAULT_MEMORY_BYTES = 2 * GiB
DEFAULT_PIDS = 1024
DEFAULT_OUTPUT_BYTES = 16 * MiB
"""Per exec and per stream: Harbor reads each command's output whole, into memory."""
DEFAULT_DISK_BYTES = 4 * GiB
"""What the image may take on written, when neither the task nor the profile says."""
DEFAULT_LIFETIME_S = 4 * 3600.0
"""The sandbox's whole life: the agent, the verifier and the transfers of one trial. Only a
hung harness meets it; a dead one loses its sandbox at once (the supervisor's lease)."""
SESSION_LABEL = "sbxkit.harbor.session"
"""Harbor's session id (``task__trial__env``) on the container, for an operator's ``ps``."""
ROOT_NAMES = frozenset({"root", "0", "0:0"})
DOCKERFILE = "Dockerfile"
COMPOSE_FILE = "docker-compose.yaml"


class TaskShape(msgspec.Struct, frozen=True, kw_only=True):
    """What a Harbor task's ``[environment]`` (after Harbor's overrides) asks of its sandbox."""

    image: str
    cpus: float | None = None
    memory_mb: int | None = None
    storage_mb: int | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
    workdir: str | None = None
    session: str = ""


def definition_refusal(
    environment_dir: Path, docker_image: str | None, *, force_build: bool = False
) -> str | None:
    """Why sbxkit will not run this task's environment definition, or None.

    sbxkit never builds or pulls an image and runs one container per trial: a task must name
    a local ``docker_image``; a Dockerfile is used only to say how to make that image, and a
    compose file is refused whatever else the task says."""
    compose = environment_dir / COMPOSE_FILE
    dockerfile = environment_dir / DOCKERFILE
    if compose.exists():
        return (
            f"{compose}: sbxkit runs one hardened container per trial and does not run docker "
            "compose (its services, networks and privileges are outside sbxkit's policy)"
        )
    how = (
        f"build it yourself (docker build -t NAME {environment_dir}) and set "
        "[environment] docker_image = NAME in task.toml"
    )
    if docker_image is None and dockerfile.exists():
        return f"{dockerfile}: sbxkit never builds images; {how}"
    if docker_image is not None and force_build and dockerfile.exists():
        return f"--force-build: sbxkit never builds images ({dockerfile}); {how}"
    return None


def is_root(user: str | int | None) -> bool:
    """Whether a Harbor ``user`` names root inside, the workspace's own user (None: its
    default, which is root)."""
    return user is None or str(user) in ROOT_NAMES


AS_USER = """u=$1 g=; shift
case $u in *:*) g=${u#*:} u=${u%%:*};; esac
if entry=$(getent passwd "$u"); then
  uid=$(echo "$entry" | cut -d: -f3) gid=$(echo "$entry" | cut -d: -f4)
  home=$(echo "$entry" | cut -d: -f6) groups=--init-groups
else
  case $u in ""|*[!0-9]*) echo "sbxkit: no such user in the image: $u" >&2; exit 126;; esac
  uid=$u gid=0 home=/ groups=--clear-groups
fi
HOME=$home exec setpriv --reuid="$uid" --regid="${g:-$gid}" $groups -- bash -c "$1"
"""
"""Run ``bash -c COMMAND`` as ``USER[:GROUP]`` (a name or a uid, as ``docker exec -u`` takes
it), dropped from root inside by ``setpriv``: its groups from the image's ``/etc/group``, its
``HOME`` from its passwd entry, no capabilities left. A uid the image does not know runs with
gid 0 and no supplementary groups, as Docker does."""


def exec_argv(command: str, user: str | int | None) -> list[str]:
    """The argv of one Harbor ``exec``: ``bash -c`` as root, or dropped to ``user`` first."""
    if is_root(user):
        return ["bash", "-c", command]
    return ["sh", "-c", AS_USER, "sbxkit-as-user", str(user), command]


def trial_spec(
    task: TaskShape, *, profile: Path | None = None, lifetime_s: float | None = None
) -> tuple[SandboxSpec, Settings]:
    """The spec and operator settings of one trial's sandbox (validated by the caller's
    ``check_spec``); the profile supplies every default the task leaves open."""
    fsize_given = False
    if profile is not None:
        loaded = load_profile(profile)
        fsize_given = loaded.sandbox.docker.limits.fsize is not None
        spec, settings, _ = apply_profile(loaded, ["unused"], image=task.image)
    else:
        # No limit set: the task's and the defaults below fill every one.
        spec = SandboxSpec(image=task.image, command=["unused"], limits=msgspec.convert({}, Limits))
        settings = Settings()
    if spec.network != "none":
        raise SpecError(
            "sandbox.docker.network",
            f"{spec.network!r} in the profile: a Harbor task's network_mode decides its "
            "network (sbxkit gives no-network tasks none); remove it from the profile",
        )
    base = spec.limits
    limits = msgspec.structs.replace(
        base,
        cpus=float(task.cpus) if task.cpus is not None else base.cpus or DEFAULT_CPUS,
        memory_bytes=(
            task.memory_mb * MiB
            if task.memory_mb is not None
            else base.memory_bytes or DEFAULT_MEMORY_BYTES
        ),
        pids=base.pids or DEFAULT_PIDS,
        output_bytes=base.output_bytes or DEFAULT_OUTPUT_BYTES,
        timeout_s=lifetime_s or base.timeout_s or DEFAULT_LIFETIME_S,
    )
    given = spec.workspace
    if given is not None and not given.root:
        raise SpecError(
            "sandbox.docker.workspace.root",
            "false in the profile: Harbor runs its setup, the oracle and verifiers as root, "
            "so a trial's sandbox is a workspace with root inside",
        )
    disk = given.disk_bytes if given is not None else None
    disk_bytes = task.storage_mb * MiB if task.storage_mb is not None else disk
    disk_bytes = disk_bytes or DEFAULT_DISK_BYTES
    if not fsize_given:
        # One file may fill the task's disk (a dataset, a wheel): sbxkit's 64 MiB default
        # suits a one-shot payload, not a task's image.
        limits = msgspec.structs.replace(limits, fsize_bytes=disk_bytes)
    workspace = Workspace(
        root=True,
        disk_bytes=disk_bytes,
        # Harbor's agents write scripts to /tmp and run them there.
        exec_tmp=given.exec_tmp if given is not None else True,
    )
    labels = {**spec.labels, SESSION_LABEL: task.session} if task.session else spec.labels
    spec = msgspec.structs.replace(
        spec,
        limits=limits,
        workspace=workspace,
        env={**spec.env, **task.env},
        workdir=task.workdir or spec.workdir,
        labels=labels,
    )
    return spec, settings
