"""Engine API calls for long-lived sandboxes: exec, resize and the archive endpoints.

Functions over an ``Engine``'s public call surface (``call``, ``call_json``, ``hijack``,
``stream``) and ``api_path``'s quoted paths, kept apart
from ``engine.client`` so the one-shot client stays small. Like the rest of ``sbxkit.engine``
this knows nothing of sandboxes: it speaks the endpoints and returns msgspec models.

Exec has no kill endpoint (moby #9167, #9231, #38704 were closed): ending one exec is the
caller's business (``sbxkit._consumers.session`` kills its process group from inside the container).

The archive endpoints work on what the daemon sees of the container's filesystem: the image
layers plus volumes and bind mounts. They do **not** see tmpfs mounts, and refuse to write
anywhere on a read-only root filesystem (Docker 20.10: ``PUT`` → "container rootfs is marked
read-only"; ``GET`` of a file written into a tmpfs → 404, the daemon reads the image's
directory underneath). sbxkit's sandboxes have exactly that shape, so ``sbxkit._consumers.session``
transfers files with ``tar`` through an exec instead; these two calls are here for completeness
(writable volumes or binds).
"""

from __future__ import annotations

import msgspec

from sbxkit.engine.client import Engine
from sbxkit.engine.models import Body, Reply
from sbxkit.engine.transport import HijackedStream, api_path


class ExecCreate(Body):
    """``POST /containers/{id}/exec``. The flags have no defaults so they are always sent
    (``omit_defaults`` would drop them); ``Privileged`` must be false."""

    cmd: list[str]
    attach_stdin: bool
    attach_stdout: bool
    attach_stderr: bool
    tty: bool
    privileged: bool
    user: str
    env: list[str] | None = None
    working_dir: str | None = None


class ExecCreateReply(Reply):
    id: str


class ExecStart(msgspec.Struct, rename="pascal"):
    detach: bool = False
    tty: bool = False


class ExecInspect(Reply):
    id: str = msgspec.field(default="", name="ID")
    running: bool = False
    exit_code: int | None = None
    pid: int = 0
    container_id: str = msgspec.field(default="", name="ContainerID")


async def exec_create(engine: Engine, container_id: str, body: ExecCreate) -> str:
    """Create an exec instance in a running container; return its id."""
    if body.privileged:
        raise ValueError("privileged execs are never created")
    path = api_path("/containers/{}/exec", container_id)
    reply = await engine.call_json(
        "POST",
        path,
        ExecCreateReply,
        body=msgspec.json.encode(body),
        timeout=engine.deadlines.create,
    )
    return reply.id


async def exec_start(engine: Engine, exec_id: str, *, tty: bool = False) -> HijackedStream:
    """Start an exec, hijacking the connection: multiplexed output (raw if ``tty``), stdin."""
    body = msgspec.json.encode(ExecStart(detach=False, tty=tty))
    return await engine.hijack(
        "POST", api_path("/exec/{}/start", exec_id), body=body, timeout=engine.deadlines.start
    )


async def exec_inspect(engine: Engine, exec_id: str) -> ExecInspect:
    path = api_path("/exec/{}/json", exec_id)
    return await engine.call_json("GET", path, ExecInspect, timeout=engine.deadlines.inspect)


def _size_query(height: int, width: int) -> list[tuple[str, str]]:
    if not (0 < height < 65536 and 0 < width < 65536):
        raise ValueError(f"terminal size must be 1..65535, got {height}x{width}")
    return [("h", str(height)), ("w", str(width))]


async def exec_resize(engine: Engine, exec_id: str, height: int, width: int) -> None:
    """Resize a TTY exec's terminal (rows ``height``, columns ``width``)."""
    path = api_path("/exec/{}/resize", exec_id, query=_size_query(height, width))
    await engine.call("POST", path, timeout=engine.deadlines.kill)


async def container_resize(engine: Engine, container_id: str, height: int, width: int) -> None:
    """Resize a TTY container's terminal (rows ``height``, columns ``width``)."""
    path = api_path("/containers/{}/resize", container_id, query=_size_query(height, width))
    await engine.call("POST", path, timeout=engine.deadlines.kill)


async def archive_get(engine: Engine, container_id: str, path: str, *, max_bytes: int) -> bytes:
    """``GET /containers/{id}/archive?path=``: a tar of ``path``, refused above ``max_bytes``.

    Sees image layers, volumes and binds only (not tmpfs): see the module doc.
    """
    target = api_path("/containers/{}/archive", container_id, query=[("path", path)])
    stream = await engine.stream("GET", target, timeout=engine.deadlines.inspect)
    try:
        return await stream.read_all(max_bytes)  # over it: EngineProtocolError, "body over"
    finally:
        await stream.aclose()


async def archive_put(engine: Engine, container_id: str, path: str, tar: bytes) -> None:
    """``PUT /containers/{id}/archive?path=``: extract ``tar`` (built by the caller) at ``path``.

    Refused by the daemon on a read-only root filesystem unless ``path`` is in a volume.
    """
    target = api_path(
        "/containers/{}/archive",
        container_id,
        query=[("path", path), ("noOverwriteDirNonDir", "true")],
    )
    await engine.call(
        "PUT", target, body=tar, content_type="application/x-tar", timeout=engine.deadlines.create
    )
