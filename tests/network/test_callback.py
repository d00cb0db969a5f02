"""The callback endpoint (the reference driver's contract): a host endpoint reached from inside
through a loopback forwarder as ``SBXKIT_ENDPOINT``; an https endpoint with the client TLS
bundle mounted at a fixed path and named by ``SBXKIT_TLS_CA/CERT/KEY``."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

import sbxkit
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._model.network_terms import CallbackTls, Network
from sbxkit._model.settings import Settings
from sbxkit._model.uids import HOST_UIDS
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from tests.engine.helpers import create_plain_container, delete_image
from tests.network.conftest import supervisor_with_umask
from tests.network.payloads import command, output
from tests.network.servers import ALLOWED, CALLBACK, Servers
from tests.supervision import auto_launched_supervisors, private_state_dir, supervisor_pids
from tests.witness import BUSYBOX, PYTHON, Witness

CALL = r"""
import json, os, ssl, stat, urllib.request
endpoint = os.environ["SBXKIT_ENDPOINT"]
out = {"endpoint": endpoint, "files": {}, "uid": os.getuid()}
context = None
if "SBXKIT_TLS_CA" in os.environ:
    for key in ("SBXKIT_TLS_CA", "SBXKIT_TLS_CERT", "SBXKIT_TLS_KEY"):
        info = os.stat(os.environ[key])
        out["files"][key] = [os.environ[key], oct(stat.S_IMODE(info.st_mode)), info.st_uid]
    directory = os.path.dirname(os.environ["SBXKIT_TLS_KEY"])
    out["dir"] = [oct(stat.S_IMODE(os.stat(directory).st_mode)), os.stat(directory).st_uid]
    try:
        open(os.path.join(directory, "planted"), "w")
        out["writable"] = True
    except OSError:
        out["writable"] = False
    context = ssl.create_default_context(cafile=os.environ["SBXKIT_TLS_CA"])
    context.load_cert_chain(os.environ["SBXKIT_TLS_CERT"], os.environ["SBXKIT_TLS_KEY"])
with urllib.request.urlopen(endpoint + "/tool-call", timeout=15, context=context) as reply:
    out["reply"] = reply.read().decode()
print(json.dumps(out))
"""


def spec(network: Network, **fields: Any) -> sbxkit.SandboxSpec:
    return sbxkit.SandboxSpec(
        image=PYTHON,
        command=command(CALL),
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=128 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=60
        ),
        network=network,
        **fields,
    )


async def test_an_http_callback_is_reached_from_inside(
    backend: DockerBackend, servers: Servers
) -> None:
    result = await backend.run_once(spec(Network(callback=f"http://{CALLBACK}:8080")))
    assert result.exit_code == 0, result.stderr
    got = output(result.stdout)
    assert got["endpoint"] == f"http://{CALLBACK}:8080"
    assert got["reply"] == f"callback {CALLBACK}:8080 /tool-call"
    assert [path for _, path, _ in servers.seen["callback"].requests] == ["/tool-call"]


async def test_an_https_callback_gets_its_client_bundle_and_bypasses_the_proxy(
    backend: DockerBackend, servers: Servers
) -> None:
    bundle = servers.client_bundle
    network = Network(
        allow=[ALLOWED],  # with a proxy too: NO_PROXY names the callback
        callback=f"https://{CALLBACK}:9443",
        tls=CallbackTls(ca=str(bundle["ca"]), cert=str(bundle["cert"]), key=str(bundle["key"])),
    )
    result = await backend.run_once(spec(network))
    assert result.exit_code == 0, result.stderr
    got = output(result.stdout)
    assert got["endpoint"] == f"https://{CALLBACK}:9443"
    # the server required the client certificate: the bundle inside is what authenticated
    assert got["reply"] == f"callback-tls {CALLBACK}:9443 /tool-call"
    own = got["uid"]  # the sandbox's own uid: the bundle is its alone
    assert own in HOST_UIDS
    assert got["files"] == {
        "SBXKIT_TLS_CA": ["/run/sbxkit/tls/ca.pem", "0o444", own],
        "SBXKIT_TLS_CERT": ["/run/sbxkit/tls/cert.pem", "0o444", own],
        "SBXKIT_TLS_KEY": ["/run/sbxkit/tls/key.pem", "0o400", own],  # no one else reads it
    }
    assert got["dir"] == ["0o755", 0]  # root's: the sandbox user cannot change what is there
    assert got["writable"] is False
    assert result.denials == ()


@pytest.mark.parametrize(
    "owner",
    ["auto-launched", "supervisor 0022", "supervisor 0002", "in-process 0077", "in-process 0002"],
)
async def test_the_tls_bundle_is_readable_whatever_the_owners_umask(
    owner: str, engine: Engine, servers: Servers, witness: Witness
) -> None:
    """Issue 38, finding 7: the auto-launched supervisor (umask 077) made the bundle's
    directory 0700 and the payload could not read its CA. The owner that writes it: a
    supervisor launched as production launches one, one a user started by hand (0022,
    0002), or the caller itself (``InProcessOwner``) under either kind of umask."""
    bundle = servers.client_bundle
    network = Network(
        callback=f"https://{CALLBACK}:9443",
        tls=CallbackTls(ca=str(bundle["ca"]), cert=str(bundle["cert"]), key=str(bundle["key"])),
    )
    kind, _, mask = owner.partition(" ")
    state_dir = private_state_dir()
    settings = Settings(supervisor_state_dir=str(state_dir))
    with contextlib.ExitStack() as stack:
        if kind == "auto-launched":
            stack.enter_context(auto_launched_supervisors(state_dir))
            backend = DockerBackend(engine=engine, settings=settings, recover_at_open=False)
        elif kind == "supervisor":
            stack.enter_context(supervisor_with_umask(state_dir, int(mask, 8)))
            backend = DockerBackend(engine=engine, settings=settings, recover_at_open=False)
        else:
            backend = DockerBackend(engine=engine, owner=InProcessOwner(engine))
            previous = os.umask(int(mask, 8))
            stack.callback(os.umask, previous)
        result = await backend.run_once(spec(network))
        if kind == "auto-launched":  # the launcher's umask, as production's supervisor has it
            assert [umask_of(pid) for pid in supervisor_pids(state_dir)] == ["0077"]
        # the result came at the payload's exit: its removal ends before its supervisor does
        left = await trio.to_thread.run_sync(witness.wait_until_no_sbxkit_containers, 10.0)
        assert left == []
    assert result.exit_code == 0, result.stderr
    got = output(result.stdout)
    assert got["reply"] == f"callback-tls {CALLBACK}:9443 /tool-call"
    assert got["dir"] == ["0o755", 0]
    assert [mode for _, mode, _ in got["files"].values()] == ["0o444", "0o444", "0o400"]


def umask_of(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:"))


async def test_a_callback_by_address_is_reached_on_loopback(
    backend: DockerBackend, servers: Servers
) -> None:
    result = await backend.run_once(spec(Network(callback="http://127.0.0.1:8080")))
    got = output(result.stdout)
    assert got["endpoint"] == "http://127.0.0.1:8080"
    assert got["reply"] == "callback 127.0.0.1:8080 /tool-call"


IMAGE_ENV = {
    "SBXKIT_ENDPOINT": "http://198.51.100.10:1",
    "SBXKIT_TLS_CA": "/tmp/image-ca.pem",
    "SBXKIT_TLS_CERT": "/tmp/image-cert.pem",
    "SBXKIT_TLS_KEY": "/tmp/image-key.pem",
    "HTTPS_PROXY": "http://198.51.100.10:3128",
    "IMAGE_KEEPS": "this",
}


@pytest.fixture
def env_image(witness: Witness) -> Iterator[str]:
    """The busybox image with an ``ENV`` for every callback key (and a proxy and a key of its
    own), committed in the tier's daemon from a never-started helper container (no registry),
    removed after the test."""
    name = f"i38-env-{uuid.uuid4().hex[:8]}"
    helper = create_plain_container(witness, BUSYBOX, name)
    try:
        response = witness.session.post(
            f"{witness.base}/commit",
            params={
                "container": helper,
                "repo": "sbxkit-test/env-image",
                "tag": name,
                "changes": [f"ENV {key}={value}" for key, value in IMAGE_ENV.items()],
            },
            timeout=60,
        )
        response.raise_for_status()
    finally:
        witness.remove(helper)
    reference = f"sbxkit-test/env-image:{name}"
    info = witness.get(f"/images/{reference}/json")
    assert {f"{key}={value}" for key, value in IMAGE_ENV.items()} <= set(info["Config"]["Env"])
    yield reference
    witness.wait_until_no_sbxkit_containers(seconds=10)  # a run's removal may still be under way
    delete_image(witness, reference)


def env_spec(image: str, network: Network | None) -> sbxkit.SandboxSpec:
    return sbxkit.SandboxSpec(
        image=image,
        command=["env"],
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=64 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=30
        ),
        **({} if network is None else {"network": network}),
    )


def shown(stdout: bytes) -> dict[str, str]:
    return dict(line.partition("=")[::2] for line in stdout.decode().splitlines() if "=" in line)


async def test_an_images_env_for_an_owned_key_never_reaches_the_payload(
    backend: DockerBackend, servers: Servers, env_image: str
) -> None:
    """Issue 38, finding 7: the owned keys are absent unless sbxkit sets them, whatever the
    image's ``ENV`` says — without a network, governed, with a callback, and in a session's
    exec. The image's own key and (ungoverned) its proxy pass: its ENV did apply."""
    callback_keys = [key for key in IMAGE_ENV if key.startswith("SBXKIT_")]
    plain = await backend.run_once(env_spec(env_image, None))
    got = shown(plain.stdout)
    assert [key for key in callback_keys if key in got] == [], got
    assert got["IMAGE_KEEPS"] == "this"
    assert got["HTTPS_PROXY"] == IMAGE_ENV["HTTPS_PROXY"]  # not owned without a governed network
    governed = await backend.run_once(env_spec(env_image, Network(allow=[ALLOWED])))
    got = shown(governed.stdout)
    assert [key for key in callback_keys if key in got] == [], got
    assert got["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    called = await backend.run_once(
        env_spec(env_image, Network(callback=f"http://{CALLBACK}:8080"))
    )
    got = shown(called.stdout)
    assert got["SBXKIT_ENDPOINT"] == f"http://{CALLBACK}:8080"
    assert [key for key in callback_keys[1:] if key in got] == [], got
    spec = env_spec(env_image, Network(allow=[ALLOWED]))
    async with sbxkit.open_sandbox(spec, backend=backend) as sandbox:
        got = shown((await sandbox.exec(["env"])).stdout)
    assert [key for key in callback_keys if key in got] == [], got
    assert got["IMAGE_KEEPS"] == "this"
