"""What the daemon refuses, checked against the real daemon (issue 12, item 4): sbxkit's image
grammar gives the daemon's verdict on every reference here (Docker 26.1 looks up a few that the
grammar refuses: tests/engine/engines.py names them); runc's uid range is the one
``parse_user`` enforces; a create the daemon answers with a 4xx is exit 2; and the daemon's
data-root never reaches a message. Raw creates carry a lease label, so the witness sees a leak.
"""

from __future__ import annotations

import msgspec
import pytest
import trio

from sbxkit._model.image_ref import image_reference_problem
from sbxkit._model.spec import MAX_ID, Limits, MiB, SandboxSpec
from sbxkit._plan.plan import new_lease_id
from sbxkit._plan.policy import build_create_body, container_name
from sbxkit.cli import EXIT_REFUSED, exit_code_for_error
from sbxkit.engine.client import Engine
from sbxkit.errors import EngineError, NotFound
from tests.engine.engines import EngineFacts
from tests.witness import Witness

REFERENCES = [
    "HIDDEN/busybox:1",
    "Sbxkit-test/busybox:latest",
    "LOCALHOST/x",
    "busybox:",
    "a@b@c",
    "hidden//busybox:1",
    "a._b",
    "a-",
    "x:" + "t" * 129,
    "x" * 238,
    "x" * 237,
    "a/" + "x" * 244,
    "a/" + "x" * 243,
    "busybox@sha256:abc",
    "busybox@sha256:" + "A" * 64,
    "nosuch-image:1",
    "MyReg.io/x:1",
    "localhost:5000/x:1",
    "a__b/c---d",
    "x:" + "t" * 128,
    "sha256:abc",
    "busybox@sha256:" + "0" * 64,
    "busybox:1@sha256:" + "0" * 64,
    "0" * 64,
]


async def daemon_accepts(engine: Engine, busybox: str, reference: str) -> bool:
    """The daemon parses ``reference`` as a create's image (absent is fine: 404), or refuses
    it (400). A create, not ``/images/{name}/json``: the daemon's router rewrites a path with
    ``//`` in it, and answers that endpoint with a redirect instead of its verdict."""
    try:
        _, container_id = await create_raw(engine, busybox, image=reference)
    except NotFound:
        return True
    except EngineError as error:
        refused = error
    else:
        with trio.CancelScope(shield=True):
            await engine.container_remove(container_id)
        return True
    assert refused.status == 400, refused
    return False


@pytest.mark.engine_cell
async def test_the_image_grammar_gives_the_daemons_verdict(
    engine: Engine, busybox: str, engine_facts: EngineFacts
) -> None:
    """sbxkit's grammar is the reference grammar (`docker pull`, `docker tag`), stricter by
    design than a daemon that looks a malformed name up: what sbxkit accepts the daemon always
    accepts; where they differ, it is exactly the references the engine's facts name."""
    verdicts = {ref: await daemon_accepts(engine, busybox, ref) for ref in [busybox, *REFERENCES]}
    ours = {ref: image_reference_problem(ref) is None for ref in verdicts}
    differing = {ref for ref in verdicts if ours[ref] != verdicts[ref]}
    assert differing == engine_facts.looked_up_references
    assert not any(ours[ref] for ref in differing)  # only ever stricter than the daemon
    assert not all(verdicts.values())  # the list holds refused references, not only accepted


def spec(image: str) -> SandboxSpec:
    limits = Limits(cpus=0.5, memory_bytes=32 * MiB, pids=32, output_bytes=MiB, timeout_s=20)
    return SandboxSpec(image=image, command=["true"], limits=limits)


async def create_raw(engine: Engine, base_image: str, **changes: object) -> tuple[str, str]:
    """A hardened body with ``changes`` made on purpose; (lease, container id)."""
    lease = new_lease_id()
    body = msgspec.structs.replace(build_create_body(spec(base_image), lease), **changes)
    return lease, await engine.container_create(body, name=container_name(lease))


async def start_status(engine: Engine, image: str, user: str) -> str | None:
    """None when a container with ``user`` starts, else the daemon's refusal."""
    _, container_id = await create_raw(engine, image, user=user)
    try:
        await engine.container_start(container_id)
    except EngineError as error:
        return error.message
    finally:
        with trio.CancelScope(shield=True):
            await engine.container_remove(container_id)
    return None


async def test_runc_refuses_ids_above_the_range_parse_user_allows(
    engine: Engine, busybox: str
) -> None:
    assert await start_status(engine, busybox, f"{MAX_ID}:{MAX_ID}") is None
    refused = await start_status(engine, busybox, f"{MAX_ID + 1}:1")
    assert refused is not None
    assert "0-2147483647" in refused


async def test_a_4xx_on_create_is_exit_2_and_no_container_exists(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    with pytest.raises(EngineError) as caught:
        await create_raw(engine, busybox, working_dir="relative/dir")
    assert 400 <= caught.value.status < 500
    assert exit_code_for_error(caught.value) == EXIT_REFUSED
    assert witness.sbxkit_containers() == []


async def test_the_daemons_data_root_never_reaches_a_message(
    engine: Engine, witness: Witness, busybox: str
) -> None:
    info = witness.get("/info")
    data_root = info["DockerRootDir"]
    with pytest.raises(EngineError) as caught:
        await create_raw(engine, busybox, working_dir="/" + "a" * 300)
    assert "file name too long" in str(caught.value)
    assert data_root not in str(caught.value)
    assert "overlay2" not in str(caught.value)
