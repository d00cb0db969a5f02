"""Engine API calls for long-lived sandboxes: exec, resize and the archive endpoints.

Functions over an ``Engine`` (its transport, versioned paths and cached decoders), kept apart
from ``engine.client`` so the one-shot client stays small. Like the rest of ``sbxkit.engine``
this knows nothing of sandboxes: it speaks the endpoints and returns msgspec models.

Exec has no kill endpoint (moby #9167, #9231, #38704 were closed): ending one exec is the
caller's business (``sbxkit.session`` kills its process group from inside the container).

The archive endpoints work on what the daemon sees of the container's filesystem: the image
layers plus volumes and bind mounts. They do **not** see tmpfs mounts, and refuse to write
anywhere on a read-only root filesystem (Docker 20.10: ``PUT`` → "container rootfs is marked
read-only"; ``GET`` of a file written into a tmpfs → 404, the daemon reads the image's
directory underneath). sbxkit's sandboxes have exactly that shape, so ``sbxkit.session``
transfers files with ``tar`` through an exec instead; these two calls are here for completeness
(writable volumes or binds).
"""

from __future__ import annotations

import msgspec

from sbxkit.engine.client import Engine
from sbxkit.engine.models import Body, Reply
from sbxkit.engine.transport import HijackedStream, join_query
from sbxkit.errors import EngineProtocolError

_JSON = [("Content-Type", "application/json")]


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
    path = engine._path(f"/containers/{container_id}/exec")
    data = msgspec.json.encode(body)
    response = await engine._transport.request(
        "POST", path, body=data, headers=_JSON, timeout=engine.deadlines.create
    )
    return engine._decode(response.body, ExecCreateReply, f"POST {path}").id


async def exec_start(engine: Engine, exec_id: str, *, tty: bool = False) -> HijackedStream:
    """Start an exec, hijacking the connection: multiplexed output (raw if ``tty``), stdin."""
    path = engine._path(f"/exec/{exec_id}/start")
    body = msgspec.json.encode(ExecStart(detach=False, tty=tty))
    return await engine._transport.hijack(
        "POST", path, body=body, headers=_JSON, timeout=engine.deadlines.start
    )


async def exec_inspect(engine: Engine, exec_id: str) -> ExecInspect:
    path = engine._path(f"/exec/{exec_id}/json")
    response = await engine._transport.request("GET", path, timeout=engine.deadlines.inspect)
    return engine._decode(response.body, ExecInspect, f"GET {path}")


def _size_query(path: str, height: int, width: int) -> str:
    if not (0 < height < 65536 and 0 < width < 65536):
        raise ValueError(f"terminal size must be 1..65535, got {height}x{width}")
    return join_query(path, [("h", str(height)), ("w", str(width))])


async def exec_resize(engine: Engine, exec_id: str, height: int, width: int) -> None:
    """Resize a TTY exec's terminal (rows ``height``, columns ``width``)."""
    path = engine._path(_size_query(f"/exec/{exec_id}/resize", height, width))
    await engine._transport.request("POST", path, timeout=engine.deadlines.kill)


async def container_resize(engine: Engine, container_id: str, height: int, width: int) -> None:
    """Resize a TTY container's terminal (rows ``height``, columns ``width``)."""
    path = engine._path(_size_query(f"/containers/{container_id}/resize", height, width))
    await engine._transport.request("POST", path, timeout=engine.deadlines.kill)


async def archive_get(engine: Engine, container_id: str, path: str, *, max_bytes: int) -> bytes:
    """``GET /containers/{id}/archive?path=``: a tar of ``path``, refused above ``max_bytes``.

    Sees image layers, volumes and binds only (not tmpfs): see the module doc.
    """
    target = engine._path(join_query(f"/containers/{container_id}/archive", [("path", path)]))
    stream = await engine._transport.open_stream("GET", target, timeout=engine.deadlines.inspect)
    try:
        parts: list[bytes] = []
        size = 0
        while chunk := await stream.receive_some():
            size += len(chunk)
            if size > max_bytes:
                raise EngineProtocolError(f"GET {target}: archive over {max_bytes} bytes")
            parts.append(chunk)
        return b"".join(parts)
    finally:
        await stream.aclose()


async def archive_put(engine: Engine, container_id: str, path: str, tar: bytes) -> None:
    """``PUT /containers/{id}/archive?path=``: extract ``tar`` (built by the caller) at ``path``.

    Refused by the daemon on a read-only root filesystem unless ``path`` is in a volume.
    """
    target = engine._path(
        join_query(
            f"/containers/{container_id}/archive",
            [("path", path), ("noOverwriteDirNonDir", "true")],
        )
    )
    await engine._transport.request(
        "PUT",
        target,
        body=tar,
        headers=[("Content-Type", "application/x-tar")],
        timeout=engine.deadlines.create,
    )
