"""Mounts on the real engine: what the sandbox sees, what the host sees, what the daemon made.

Binds, named volumes and tmpfs mounts behave as asked (read-only unless ``read_only=False``);
every refusal happens before any container exists, which the independent witness proves from
the daemon's own event log (a control run with the same label shows that the check can see a
create); named volumes are created and removed by the witness only, never by sbxkit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from sbxkit._consumers.runner import run
from sbxkit._kernel.scripts import IO_TARGET
from sbxkit._model.mounts import BindMount, Mount, TmpfsMount, VolumeMount
from sbxkit._model.settings import Settings
from sbxkit._model.spec import MiB, SandboxSpec
from sbxkit.engine.client import Engine
from sbxkit.errors import NotFound, SpecError
from tests.engine.engines import EngineFacts
from tests.engine.helpers import actions, limits, text, unique
from tests.engine.oneshot_paths import OneShot
from tests.witness import Witness

TEST_LABEL = "sbxkit.test"
NOBODY = 65534
BINDS = Settings(enable_bind_mounts=True)
VOLUMES = Settings(enable_named_volumes=True)
BOTH = Settings(enable_bind_mounts=True, enable_named_volumes=True)


def mount_spec(
    image: str,
    script: str,
    mounts: list[Mount],
    *,
    label: str | None = None,
    user: str | None = None,
) -> SandboxSpec:
    return SandboxSpec(
        image=image,
        command=["sh", "-c", script],
        limits=limits(),
        mounts=mounts,
        labels={TEST_LABEL: label} if label else {},
        user=user,
    )


def host_dir(path: Path, *, files: dict[str, str] | None = None, uid: int | None = None) -> Path:
    """A host directory the sandbox user can read (0755, files 0644), optionally owned by uid."""
    path.mkdir(parents=True)
    for name, content in (files or {}).items():
        (path / name).write_text(content)
        (path / name).chmod(0o644)
    path.chmod(0o755)
    if uid is not None:
        os.chown(path, uid, uid)
    return path


# --- the witness's view: events, volumes, containers -------------------------------------------


def container_creates(witness: Witness, label: str, since: float) -> list[dict[str, Any]]:
    events = witness.events(since, time.time(), type=["container"], label=[f"{TEST_LABEL}={label}"])
    return [e for e in events if e.get("Action") == "create"]


def volume_exists(witness: Witness, name: str) -> bool:
    response = witness.session.get(f"{witness.base}/volumes/{name}", timeout=30)
    if response.status_code == 404:
        return False
    response.raise_for_status()
    return True


@contextmanager
def witness_volume(witness: Witness, driver_opts: dict[str, str] | None = None) -> Iterator[str]:
    """A named volume the witness creates and removes; sbxkit only ever inspects it."""
    name = unique("sbxt-vol")
    body: dict[str, Any] = {"Name": name, "Driver": "local", "Labels": {TEST_LABEL: name}}
    if driver_opts:
        body["DriverOpts"] = driver_opts
    response = witness.session.post(f"{witness.base}/volumes/create", json=body, timeout=30)
    response.raise_for_status()
    try:
        yield name
    finally:
        response = witness.session.delete(f"{witness.base}/volumes/{name}", timeout=30)
        assert response.status_code in (204, 404), response.text


def bind_options(device: str) -> dict[str, str]:
    return {"type": "none", "o": "bind", "device": device}


async def assert_refused_before_create(
    witness: Witness,
    image: str,
    mounts: list[Mount],
    settings: Settings,
    field: str,
    *words: str,
) -> SpecError:
    """``run`` raises SpecError(field) and the daemon logged no create for the run's label;
    a valid control run under the same label then shows up, so the event check can fail."""
    label = unique("refused")
    since = time.time() - 1.0
    with pytest.raises(SpecError) as info:
        await run(mount_spec(image, "echo should-not-run", mounts, label=label), settings=settings)
    error = info.value
    assert error.field == field, error
    for word in words:
        assert word in error.rule, error
    assert container_creates(witness, label, since) == []

    control = await run(mount_spec(image, "true", [], label=label), settings=settings)
    assert control.ok, control
    assert len(container_creates(witness, label, since)) == 1
    return error


# --- binds -------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["omitted", "explicit"])
async def test_a_read_only_bind_is_readable_and_not_writable(
    oneshot: OneShot, busybox: str, tmp_path: Path, spelling: str
) -> None:
    source = host_dir(tmp_path / "ro", files={"hello.txt": "hello from the host\n"})
    raw: dict[str, Any] = {"type": "bind", "source": str(source), "target": "/data"}
    if spelling == "explicit":
        raw["read_only"] = True
    mounts = msgspec.convert([raw], list[Mount])  # "omitted" leaves read_only to the default
    script = (
        "cat /data/hello.txt; "
        "echo x > /data/new; echo write=$?; "
        "echo x > /tmp/probe && echo tmp=ok"  # positive control: the write probe itself works
    )

    result = await oneshot(mount_spec(busybox, script, mounts), settings=BINDS)

    assert result.ok, result
    lines = text(result.stdout).splitlines()
    assert lines[0] == "hello from the host"
    assert "tmp=ok" in lines
    assert "write=0" not in lines
    assert any(line.startswith("write=") for line in lines)
    assert "/data/new" in text(result.stderr)
    assert "Read-only file system" in text(result.stderr)
    assert not (source / "new").exists()


async def test_an_explicit_rw_bind_is_writable_and_the_host_sees_the_file(
    oneshot: OneShot, busybox: str, tmp_path: Path
) -> None:
    source = host_dir(tmp_path / "rw", uid=NOBODY)
    mounts: list[Mount] = [BindMount(source=str(source), target="/data", read_only=False)]
    script = "echo written-in-sandbox > /data/out && echo write=ok; id -u"

    # The host directory's owner is named: a uid of the sandbox's own is chosen when it is
    # planned, too late to own a directory made beforehand (docs/security.md).
    spec = mount_spec(busybox, script, mounts, user=f"{NOBODY}:{NOBODY}")
    result = await oneshot(spec, settings=BINDS)

    assert result.ok, result
    assert text(result.stdout).split() == ["write=ok", str(NOBODY)]
    out = source / "out"
    assert out.read_text() == "written-in-sandbox\n"
    assert out.stat().st_uid == NOBODY


async def test_a_target_with_a_trailing_slash_either_works_or_is_refused_up_front(
    oneshot: OneShot, busybox: str, tmp_path: Path, witness: Witness
) -> None:
    source = host_dir(tmp_path / "ro", files={"f": "x\n"})
    label = unique("slash")
    since = time.time() - 1.0
    mounts: list[Mount] = [BindMount(source=str(source), target="/data/")]
    try:
        result = await oneshot(
            mount_spec(busybox, "cat /data/f", mounts, label=label), settings=BINDS
        )
    except SpecError:
        assert container_creates(witness, label, since) == []
    else:
        assert result.ok, result
        assert result.stdout == b"x\n"


# --- named volumes -----------------------------------------------------------------------------


@pytest.mark.engine_cell
async def test_a_named_volume_is_mounted_read_only_and_never_created_or_removed(
    oneshot: OneShot, busybox: str, witness: Witness, engine_facts: EngineFacts
) -> None:
    since = time.time() - 1.0
    with witness_volume(witness) as name:
        created_at = witness.get(f"/volumes/{name}")["CreatedAt"]
        mounts: list[Mount] = [VolumeMount(source=name, target="/vol")]
        script = "ls -d /vol && echo mounted; echo x > /vol/new; echo write=$?"

        result = await oneshot(mount_spec(busybox, script, mounts), settings=VOLUMES)

        assert result.ok, result
        lines = text(result.stdout).splitlines()
        assert lines[:2] == ["/vol", "mounted"]
        assert "write=0" not in lines
        assert "Read-only file system" in text(result.stderr)
        assert volume_exists(witness, name)
        assert witness.get(f"/volumes/{name}")["CreatedAt"] == created_at
        volume_events = actions(witness.events(since, time.time(), type=["volume"], volume=[name]))
        # The witness's create; on Docker 20.10 then the one the daemon itself logs when a
        # container create resolves a volume mount (`docker run --mount type=volume,src=existing`
        # shows the same pair; 26.1 does not): a POST /volumes/create from sbxkit would be one more.
        assert volume_events == list(engine_facts.named_volume_events), volume_events
    assert not volume_exists(witness, name)


async def test_named_volumes_are_refused_unless_enabled(busybox: str, witness: Witness) -> None:
    with witness_volume(witness) as name:
        mounts: list[Mount] = [VolumeMount(source=name, target="/vol")]
        await assert_refused_before_create(
            witness, busybox, mounts, BINDS, "mounts[0].type", "named volumes are disabled"
        )
        assert volume_exists(witness, name)


async def test_a_missing_volume_is_refused_and_not_created(busybox: str, witness: Witness) -> None:
    name = unique("sbxt-missing")
    mounts: list[Mount] = [VolumeMount(source=name, target="/vol")]

    error = await assert_refused_before_create(
        witness, busybox, mounts, VOLUMES, "mounts[0].source", name
    )

    assert "never creates" in error.rule
    assert not volume_exists(witness, name)


async def test_a_bind_backed_volume_is_a_bind(
    oneshot: OneShot, busybox: str, witness: Witness, tmp_path: Path
) -> None:
    device = host_dir(tmp_path / "device", files={"canary": "from-the-device\n"})
    with witness_volume(witness, bind_options(str(device))) as name:
        mounts: list[Mount] = [VolumeMount(source=name, target="/vol")]
        await assert_refused_before_create(
            witness, busybox, mounts, VOLUMES, "mounts[0].source", "bind", str(device)
        )

        # Control: with binds enabled as well it is judged as a bind of a safe dir, and runs.
        result = await oneshot(mount_spec(busybox, "cat /vol/canary", mounts), settings=BOTH)
        assert result.ok, result
        assert result.stdout == b"from-the-device\n"


@pytest.mark.parametrize("device", ["/etc", "/var/run/docker.sock", "/var", "link-to-etc"])
async def test_a_bind_backed_volume_of_a_protected_path_is_refused_even_with_binds_enabled(
    busybox: str, witness: Witness, tmp_path: Path, device: str
) -> None:
    if device == "link-to-etc":
        (tmp_path / "link").symlink_to("/etc")
        device = str(tmp_path / "link")
    with witness_volume(witness, bind_options(device)) as name:
        mounts: list[Mount] = [VolumeMount(source=name, target="/vol")]
        await assert_refused_before_create(
            witness, busybox, mounts, BOTH, "mounts[0].source", "protected host path"
        )


@pytest.mark.parametrize(
    "options",
    [
        {"type": "tmpfs", "o": "rbind", "device": "/etc"},
        {"type": "ext4", "o": "rbind,ro", "device": "/etc"},
        {"type": "overlay", "device": "overlay", "o": "lowerdir=/etc:<empty>"},
    ],
    ids=["rbind-tmpfs", "rbind-ext4", "overlay-lowerdir"],
)
async def test_a_local_volume_that_exposes_host_paths_is_refused_while_binds_are_disabled(
    busybox: str, witness: Witness, tmp_path: Path, options: dict[str, str]
) -> None:
    empty = host_dir(tmp_path / "empty")
    options = {k: v.replace("<empty>", str(empty)) for k, v in options.items()}
    with witness_volume(witness, options) as name:
        mounts: list[Mount] = [VolumeMount(source=name, target="/vol")]
        await assert_refused_before_create(witness, busybox, mounts, VOLUMES, "mounts[0].source")


@pytest.mark.engine_cell
async def test_a_volume_subpath_mounts_only_that_directory_from_api_1_45_and_is_refused_below(
    busybox: str, witness: Witness, engine: Engine, engine_facts: EngineFacts
) -> None:
    with witness_volume(witness) as name:
        mounts: list[Mount] = [VolumeMount(source=name, target="/vol", subpath="sub")]
        if not engine_facts.volume_subpath:  # an older daemon would mount the whole volume
            error = await assert_refused_before_create(
                witness, busybox, mounts, VOLUMES, "mounts[0].subpath", "1.45"
            )
            assert engine.api_version in error.rule
            return
        # The test runs on the daemon's host: the witness fills the volume through its path.
        data = Path(witness.get(f"/volumes/{name}")["Mountpoint"])
        host_dir(data / "sub", files={"inner": "in\n"})
        (data / "outer").write_text("out\n")
        script = "ls -A /vol; cat /vol/inner; echo x > /vol/new; echo write=$?"

        result = await run(mount_spec(busybox, script, mounts), settings=VOLUMES)

        assert result.ok, result
        lines = text(result.stdout).splitlines()
        assert lines[:2] == ["inner", "in"], lines  # only the subdirectory, not "outer"
        assert "write=0" not in lines
        assert "Read-only file system" in text(result.stderr)
        # A subpath the volume lacks fails at start; the daemon's message names the volume's
        # host path, which sbxkit's error replaces with the volume's name.
        missing: list[Mount] = [VolumeMount(source=name, target="/vol", subpath="missing")]
        with pytest.raises(NotFound) as caught:
            await run(mount_spec(busybox, "true", missing), settings=VOLUMES)
        assert f"volume {name}/missing" in str(caught.value)
        assert str(data) not in str(caught.value)
        assert witness.get("/info")["DockerRootDir"] not in str(caught.value)


@pytest.mark.parametrize("suffix", ["?x=1", "\u00e9"], ids=["query", "non-ascii"])
async def test_a_malformed_volume_name_is_a_spec_error_before_create(
    busybox: str, witness: Witness, suffix: str
) -> None:
    with witness_volume(witness) as name:
        mounts: list[Mount] = [VolumeMount(source=name + suffix, target="/vol")]
        await assert_refused_before_create(witness, busybox, mounts, VOLUMES, "mounts[0].source")


# --- tmpfs -------------------------------------------------------------------------------------


async def test_a_tmpfs_mount_is_writable_by_the_sandbox_user_up_to_its_size(
    oneshot: OneShot, busybox: str
) -> None:
    mounts: list[Mount] = [TmpfsMount(target="/scratch2", size_bytes=MiB)]
    script = (
        "stat -c 'owner=%u:%g' /scratch2; echo \"me=$(id -u):$(id -g)\"; "
        "dd if=/dev/zero of=/scratch2/half bs=64k count=8 && echo half=ok; "
        "wc -c < /scratch2/half; rm -f /scratch2/half; "
        "dd if=/dev/zero of=/scratch2/double bs=64k count=32; echo double=$?"
    )

    result = await oneshot(mount_spec(busybox, script, mounts))

    assert result.ok, result
    lines = text(result.stdout).split()
    me = next(line.removeprefix("me=") for line in lines if line.startswith("me="))
    assert f"owner={me}" in lines  # the sandbox's own uid:gid
    assert "half=ok" in lines
    assert str(512 * 1024) in lines
    assert "double=0" not in lines
    assert any(line.startswith("double=") for line in lines)
    assert "No space left" in text(result.stderr)


# --- refusals create no container --------------------------------------------------------------


def _safe(tmp_path: Path) -> str:
    return str(host_dir(tmp_path / "safe", files={"f": "x\n"}))


def _link_to_etc(tmp_path: Path) -> str:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to("/etc")
    return str(tmp_path / "a")


def _fifo(tmp_path: Path) -> str:
    os.mkfifo(tmp_path / "fifo")
    return str(tmp_path / "fifo")


Case = Callable[[Path], tuple[list[Mount], Settings, str, str]]

REFUSALS: dict[str, Case] = {
    "protected-etc": lambda t: (
        [BindMount(source="/etc", target="/data")],
        BINDS,
        "mounts[0].source",
        "protected host path /etc",
    ),
    "docker-socket": lambda t: (
        [BindMount(source="/var/run/docker.sock", target="/docker.sock")],
        BINDS,
        "mounts[0].source",
        "protected host path",
    ),
    "ancestor-var": lambda t: (
        [BindMount(source="/var", target="/data")],
        BINDS,
        "mounts[0].source",
        "ancestor of the protected host path",
    ),
    "symlink-to-etc": lambda t: (
        [BindMount(source=_link_to_etc(t), target="/data")],
        BINDS,
        "mounts[0].source",
        "protected host path /etc",
    ),
    "fifo": lambda t: (
        [BindMount(source=_fifo(t), target="/data")],
        BINDS,
        "mounts[0].source",
        "special file",
    ),
    "target-over-usr": lambda t: (
        [BindMount(source=_safe(t), target="/usr/local/data")],
        BINDS,
        "mounts[0].target",
        "container system directory /usr",
    ),
    "duplicate-target": lambda t: (
        [TmpfsMount(target="/data", size_bytes=MiB), BindMount(source=_safe(t), target="/data")],
        BINDS,
        "mounts[1].target",
        "duplicate",
    ),
    "bind-disabled": lambda t: (
        [BindMount(source=_safe(t), target="/data")],
        Settings(),
        "mounts[0].type",
        "bind mounts are disabled",
    ),
}

REFUSALS_COLON: dict[str, Case] = {
    "colon-in-source": lambda t: (
        [BindMount(source=str(host_dir(t / "x:y")), target="/data")],
        BINDS,
        "mounts[0].source",
        "",
    ),
    "colon-in-target": lambda t: (
        [BindMount(source=_safe(t), target="/da:ta")],
        BINDS,
        "mounts[0].target",
        "",
    ),
}
REFUSALS_XFAIL: dict[str, Case] = {
    "bind-target-double-slash-usr": lambda t: (
        [BindMount(source=_safe(t), target="//usr/local")],
        BINDS,
        "mounts[0].target",
        "normal form",
    ),
    "tmpfs-target-double-slash-usr": lambda t: (
        [TmpfsMount(target="//usr", size_bytes=MiB)],
        BINDS,
        "mounts[0].target",
        "normal form",
    ),
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(case, id=name) for name, case in REFUSALS.items()]
    + [pytest.param(case, id=name) for name, case in REFUSALS_XFAIL.items()]
    + [pytest.param(case, id=name) for name, case in REFUSALS_COLON.items()],
)
async def test_a_refused_mount_creates_no_container(
    busybox: str, witness: Witness, tmp_path: Path, case: Case
) -> None:
    mounts, settings, field, words = case(tmp_path)

    await assert_refused_before_create(witness, busybox, mounts, settings, field, words)


# --- post-create verification ------------------------------------------------------------------


async def test_the_created_container_has_exactly_the_requested_mounts(
    oneshot: OneShot, busybox: str, witness: Witness, tmp_path: Path
) -> None:
    real = host_dir(tmp_path / "real", files={"f": "bound\n"})
    (tmp_path / "alias").symlink_to(real)  # asked through a link: the daemon gets the real path
    label = unique("verify")
    with witness_volume(witness) as volume:
        mounts: list[Mount] = [
            BindMount(source=str(tmp_path / "alias"), target="/data"),
            BindMount(source=str(real / "f"), target="/rw-file", read_only=False),
            VolumeMount(source=volume, target="/vol"),
            TmpfsMount(target="/scratch2", size_bytes=MiB),
        ]
        script = "grep -E ' /(data|rw-file|vol|scratch2) ' /proc/self/mountinfo; sleep 1"
        seen: dict[str, Any] = {}

        def inspect_when_created() -> None:
            """Poll (in a worker thread) for the labelled container; inspect it once seen.

            Never raises: if the run fails, its own error must be the one reported."""
            deadline = time.monotonic() + 10.0
            while not seen and time.monotonic() < deadline:
                for found in witness.containers(label=f"{TEST_LABEL}={label}"):
                    response = witness.session.get(
                        f"{witness.base}/containers/{found['Id']}/json", timeout=30
                    )
                    if response.status_code == 200:
                        seen.update(response.json())
                time.sleep(0.02)

        async def inspect_while_running() -> None:
            await trio.to_thread.run_sync(inspect_when_created)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(inspect_while_running)
            result = await oneshot(mount_spec(busybox, script, mounts, label=label), settings=BOTH)

    assert result.ok, result
    assert seen, "the witness never inspected the running container"
    # On the kernel path, sbxkit's own FIFO directory of the lease, read-only, and no more.
    fifo = [m for m in seen["Mounts"] if m["Destination"] == IO_TARGET]
    if result.evidence == "kernel":
        [io] = fifo
        assert (io["Type"], io["RW"]) == ("bind", False)
        assert io["Source"].endswith(f".io/{result.lease}")
    else:
        assert fifo == []
    got = sorted(
        (m["Type"], m["Name"] if m["Type"] == "volume" else m["Source"], m["Destination"], m["RW"])
        for m in seen["Mounts"]
        if m["Destination"] != IO_TARGET
    )
    assert got == sorted(
        [
            ("bind", str(real.resolve()), "/data", False),
            ("bind", str((real / "f").resolve()), "/rw-file", True),
            ("volume", volume, "/vol", False),
        ]
    )
    binds = {m["Destination"]: m for m in seen["Mounts"] if m["Type"] == "bind"}
    assert {m["Propagation"] for m in binds.values()} == {"rprivate"}
    host_config = seen["HostConfig"]
    asked_binds = [b for b in host_config["Binds"] if f":{IO_TARGET}:" not in b]
    assert sorted(asked_binds) == sorted(
        [f"{real.resolve()}:/data:ro,rprivate", f"{(real / 'f').resolve()}:/rw-file:rw,rprivate"]
    )
    assert set(host_config["Tmpfs"]) == {"/tmp", "/scratch2"}
    own, _, _ = seen["Config"]["User"].partition(":")
    assert host_config["Tmpfs"]["/scratch2"] == (
        f"rw,nosuid,nodev,noexec,size={MiB},mode=700,uid={own},gid={own}"
    )
    assert [m["Target"] for m in host_config.get("Mounts") or []] == ["/vol"]
    # And from inside: the read-only ones really are read-only mounts.
    options = {
        line.split()[4]: line.split()[5].split(",") for line in text(result.stdout).splitlines()
    }
    assert set(options) == {"/data", "/rw-file", "/vol", "/scratch2"}, options
    for destination, mode in {
        "/data": "ro",
        "/vol": "ro",
        "/rw-file": "rw",
        "/scratch2": "rw",
    }.items():
        assert mode in options[destination], (destination, options)
