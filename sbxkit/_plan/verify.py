"""Post-create inspection: the container the daemon made must be the one we asked for.

Pure: an inspect reply and the create body in, a ContainerMismatch out. Run before start, so a
mismatch means the payload never ran (the caller removes the container).

A Podman API service answers in its own dialect (``podman=True``): it spells ulimits
``RLIMIT_NOFILE``, adds ``tmpcopyup``/``rprivate`` to tmpfs options, lists the capabilities it
dropped instead of ``ALL``, reports a private IPC namespace as ``shareable``, leaves
``CgroupnsMode`` and ``Runtime`` (always ``oci``) unreported, and names images
``localhost/…``. Those fields are compared in that dialect; everything else exactly as for
Docker. What Podman does not report is proven inside the sandbox by the conformance subset
(docs/backends.md).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sbxkit._model.mounts import ExpectedMount
from sbxkit._plan.policy import LEASE_LABEL
from sbxkit.engine.models import ContainerCreate, ContainerInspect
from sbxkit.errors import ContainerMismatch, ImageChanged


def check_created(
    info: ContainerInspect,
    body: ContainerCreate,
    *,
    lease: str,
    name: str,
    container_id: str | None = None,
    expected_mounts: Sequence[ExpectedMount] = (),
    podman: bool = False,
    image_id: str = "",
    launched: bool = False,
    rlimits_by_host: bool = False,
) -> None:
    """Raise ContainerMismatch naming the first field that differs from the request
    (``ImageChanged`` when the container's image is not ``image_id``, the one planned on).
    ``launched``: its owner may have started it already (``Register.launch``: a kernel path
    container, whose shell waits for its caller's go line), so ``running`` is its state too.
    ``rlimits_by_host``: see ``ulimits_problem``."""
    labels = info.config.labels or {}

    def mismatch(what: str) -> ContainerMismatch:
        return ContainerMismatch(info.id, what)

    if container_id is not None and info.id != container_id:
        raise mismatch(f"inspected id {info.id!r} is not the created id {container_id!r}")
    if image_id and _is_image_id(info.image) and _bare(info.image) != _bare(image_id):
        raise ImageChanged(
            info.id,
            f"created from image {info.image!r}, not {image_id!r}: {body.image!r} was moved "
            "to another image after it was inspected",
        )
    if labels.get(LEASE_LABEL) != lease:
        raise mismatch(f"label {LEASE_LABEL}={labels.get(LEASE_LABEL)!r}, expected {lease!r}")
    if info.name.lstrip("/") != name:
        raise mismatch(f"name {info.name!r}, expected {name!r}")
    if not (launched and info.state.status == "running") and (
        info.state.status != "created" or info.state.running
    ):
        started = " (or a running one its owner started)" if launched else ""
        raise mismatch(
            f"state {info.state.status!r}, expected a stopped 'created' container{started}"
        )
    found = sorted(
        (m.type, m.name if m.type == "volume" else m.source, m.destination, m.rw)
        for m in info.mounts or []
    )
    wanted = sorted((m.type, m.source, m.destination, m.rw) for m in expected_mounts)
    if found != wanted:
        raise mismatch(f"mounts are {found}, expected exactly {wanted}")
    asked = body.host_config
    got = info.host_config
    if asked is None:
        return
    pairs: list[tuple[str, object, object]] = [
        ("HostConfig.Memory", asked.memory, got.memory),
        ("HostConfig.MemorySwap", asked.memory_swap, got.memory_swap),
        ("HostConfig.NanoCpus", asked.nano_cpus, got.nano_cpus),
        ("HostConfig.PidsLimit", asked.pids_limit, got.pids_limit),
        ("HostConfig.ReadonlyRootfs", asked.readonly_rootfs, got.readonly_rootfs),
        ("HostConfig.NetworkMode", asked.network_mode, got.network_mode),
        ("HostConfig.ShmSize", asked.shm_size, got.shm_size),
        ("HostConfig.StorageOpt", asked.storage_opt, got.storage_opt),
        ("HostConfig.Tmpfs", asked.tmpfs, _podman_tmpfs(got.tmpfs) if podman else got.tmpfs),
    ]
    for field, want, have in pairs:
        if want is not None and want != have:
            raise mismatch(f"{field} is {have!r}, expected {want!r}")
    if got.privileged:
        raise mismatch("HostConfig.Privileged is true")
    granted = _podman_granted_caps(asked.cap_add, got.cap_add, got.cap_drop) if podman else None
    if granted is not None:
        raise mismatch(granted)
    if not podman and sorted(got.cap_add or []) != sorted(asked.cap_add or []):
        added = asked.cap_add or "none"
        raise mismatch(f"HostConfig.CapAdd is {got.cap_add!r}, expected {added!r}")
    if (got.binds or []) != (asked.binds or []):
        raise mismatch(f"HostConfig.Binds is {got.binds!r}, expected {asked.binds!r}")
    if asked.runtime is not None and not podman and got.runtime != asked.runtime:
        raise mismatch(f"HostConfig.Runtime is {got.runtime!r}, expected {asked.runtime!r}")
    if body.user is not None and info.config.user != body.user:
        raise mismatch(f"Config.User is {info.config.user!r}, expected {body.user!r}")
    image = info.config.image
    if podman and image == PODMAN_LOCAL + body.image:
        image = body.image
    cap_drop = got.cap_drop
    if podman and asked.cap_drop == ["ALL"] and got.cap_drop:
        cap_drop = ["ALL"]  # Podman lists the ones of its defaults it dropped (above)
    ipc_mode = "private" if podman and got.ipc_mode == "shareable" else got.ipc_mode
    config_pairs: list[tuple[str, object, object]] = [
        ("Config.Image", body.image, image),
        ("Config.Cmd", body.cmd, info.config.cmd),
        ("Config.Entrypoint", body.entrypoint, info.config.entrypoint),
        ("HostConfig.IpcMode", asked.ipc_mode, ipc_mode),
        ("HostConfig.CgroupnsMode", None if podman else asked.cgroupns_mode, got.cgroupns_mode),
        ("HostConfig.AutoRemove", asked.auto_remove, got.auto_remove),
        ("HostConfig.CapDrop", asked.cap_drop, cap_drop),
        ("HostConfig.SecurityOpt", asked.security_opt, got.security_opt),
        ("HostConfig.Init", asked.init, got.init),
        (
            "HostConfig.LogConfig.Type",
            asked.log_config and asked.log_config.type,
            got.log_config and got.log_config.type,
        ),
        (
            "HostConfig.RestartPolicy.Name",
            asked.restart_policy and asked.restart_policy.name,
            got.restart_policy and got.restart_policy.name,
        ),
    ]
    for field, want, have in config_pairs:
        if want is not None and want != have:
            raise mismatch(f"{field} is {have!r}, expected {want!r}")
    problem = ulimits_problem(
        [(u.name, u.soft, u.hard) for u in asked.ulimits or []],
        [(u.name, u.soft, u.hard) for u in got.ulimits or []],
        podman=podman,
        rlimits_by_host=rlimits_by_host,
    )
    if problem is not None:
        raise mismatch(problem)


def ulimits_problem(
    asked: Sequence[tuple[str, int, int]],
    got: Sequence[tuple[str, int, int]],
    *,
    podman: bool,
    rlimits_by_host: bool,
) -> str | None:
    """Why the container's ulimits are not the body's, or None. Podman spells them
    ``RLIMIT_NOFILE``. ``rlimits_by_host``: the host sets them on the sandbox's processes
    before its payload runs (``sbxkit._kernel.rlimits``, rootless Podman, which drops them):
    then a Podman container with none at all is accepted — never one with other values."""
    asked_set = set(asked)
    got_set = {
        (name.removeprefix("RLIMIT_").lower() if podman else name, soft, hard)
        for name, soft, hard in got
    }
    if asked_set == got_set or (podman and rlimits_by_host and not got_set):
        return None
    return f"HostConfig.Ulimits are {sorted(got_set)}, expected {sorted(asked_set)}"


PODMAN_LOCAL = "localhost/"
"""Podman names images loaded from ``docker save`` archives (and short names) ``localhost/…``."""


PODMAN_TMPFS_EXTRAS = frozenset({"rprivate", "tmpcopyup"})


def _podman_tmpfs(tmpfs: dict[str, str] | None) -> dict[str, str] | None:
    """Podman appends ``tmpcopyup`` (or ``rprivate``) to tmpfs options; nothing else changes."""
    if tmpfs is None:
        return None
    return {
        target: ",".join(o for o in options.split(",") if o not in PODMAN_TMPFS_EXTRAS)
        for target, options in tmpfs.items()
    }


def _bare(image_id: str) -> str:
    """An image id without its digest algorithm (Podman may leave it out)."""
    return image_id.removeprefix("sha256:")


def _podman_granted_caps(
    asked: list[str] | None, added: list[str] | None, dropped: list[str] | None
) -> str | None:
    """Podman's compat inspect names capabilities against its own default set: ``CapAdd`` the
    granted ones outside it, ``CapDrop`` the ones of it not granted (``CAP_`` left off). So a
    body's ``CapAdd`` (all of them in that set: a workspace's root's) shows as no ``CapAdd``
    and a ``CapDrop`` without them. Why the container's grant is not the body's, or None; the
    capabilities the payload holds are also proven inside (tests/engine/test_podman_userns.py)."""
    want = {cap.removeprefix("CAP_") for cap in asked or []}
    extra = {cap.removeprefix("CAP_") for cap in added or []} - want
    if extra:
        return f"HostConfig.CapAdd is {added!r}: {sorted(extra)} granted beyond {asked or 'none'}"
    if not dropped:
        return "HostConfig.CapDrop is empty: Podman granted its default capabilities"
    lost = want & {cap.removeprefix("CAP_") for cap in dropped}
    if lost:
        return f"HostConfig.CapDrop is {dropped!r}: {sorted(lost)} dropped, though asked for"
    return None


def _is_image_id(text: str) -> bool:
    """Whether the inspected ``Image`` is an id: Podman before 4.3 put the image's name there
    (podman#15832), which says nothing about which image it was."""
    return re.fullmatch(r"(sha256:)?[0-9a-f]{64}", text) is not None
