"""Governed egress for a workspace's root inside (issue 40, item 5), on the tier's second
daemon: ``dockerd --userns-remap=default`` inside the tier's namespace (scripts/network-tier,
``SBXKIT_TEST_USERNS_SOCKET``). There runc's sandboxes have network namespaces of the host
kernel, which the owner enters as for any governed sandbox; root inside is a subordinate host
id. The client TLS bundle is written as the sandbox user's *host* ids (its init's maps): for
root inside, host uid 165536 (dockremap's first), which is uid 0 inside.

Both owners, as everywhere in the tier. Every test ends with no container on that daemon
(its own witness) besides the tier's own checks."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest

import sbxkit
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._model.network_terms import CallbackTls, Network
from sbxkit._model.settings import Settings
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine, open_engine
from sbxkit.errors import SpecError
from tests.network.conftest import (
    LAUNCHER_UMASK,
    _settled,
    foreign_sockets,
    supervisor_with_umask,
)
from tests.network.payloads import FETCH, command, output
from tests.network.servers import ALLOWED, CALLBACK, DENIED, Servers
from tests.network.test_callback import CALL
from tests.supervision import SupervisorProcess, private_state_dir
from tests.witness import PYTHON, Witness

SOCKET = os.environ.get("SBXKIT_TEST_USERNS_SOCKET", "")


@pytest.fixture(scope="module")
def userns_witness() -> Witness:
    if not SOCKET:
        pytest.fail("SBXKIT_TEST_USERNS_SOCKET is unset: scripts/network-tier starts that daemon")
    witness = Witness(SOCKET)
    if not witness.ping() or "name=userns" not in str(witness.get("/info")["SecurityOptions"]):
        pytest.fail(f"no userns-remap daemon answers on {SOCKET}", pytrace=False)
    return witness


@pytest.fixture
async def userns_engine(userns_witness: Witness) -> AsyncIterator[Engine]:
    async with open_engine(SOCKET) as engine:
        yield engine
    assert userns_witness.wait_until_no_sbxkit_containers(seconds=10.0) == []


@pytest.fixture(scope="module")
def userns_supervisor(userns_witness: Witness) -> Iterator[SupervisorProcess]:
    """A supervisor of that daemon's (one serves the daemons it was started for), with the
    umask the launcher gives an auto-launched one."""
    extra = ("--idle-exit", "600", "--engine-socket", SOCKET)
    with supervisor_with_umask(private_state_dir(), LAUNCHER_UMASK, *extra) as process:
        yield process


@pytest.fixture(params=["supervised", "in_process"])
def owner_backend(
    request: pytest.FixtureRequest, userns_engine: Engine, userns_supervisor: SupervisorProcess
) -> Iterator[DockerBackend]:
    """The lease's owner: that supervisor, or this process; neither keeps a socket of the
    sandbox's namespace once it is gone."""
    if request.param == "supervised":
        settings = Settings(supervisor_state_dir=str(userns_supervisor.state_dir))
        yield DockerBackend(engine=userns_engine, settings=settings, recover_at_open=False)
    else:
        yield DockerBackend(engine=userns_engine, owner=InProcessOwner(userns_engine))
    for pid in (os.getpid(), userns_supervisor.proc.pid):
        assert _settled(lambda pid=pid: foreign_sockets(pid)) == set(), pid


def root_spec(argv: list[str], network: Network, **fields: object) -> sbxkit.SandboxSpec:
    return sbxkit.SandboxSpec(
        image=PYTHON,
        command=argv,
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=128 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=60
        ),
        network=network,
        workspace=sbxkit.Workspace(),
        **fields,  # type: ignore[arg-type]
    )


async def test_root_insides_egress_is_governed_by_the_allow_list(
    owner_backend: DockerBackend, servers: Servers
) -> None:
    allowed, denied = f"https://{ALLOWED}/tool", f"https://{DENIED}/secret"
    spec = root_spec(
        command(FETCH, allowed, denied), Network(allow=[ALLOWED]), env={"TEST_CA": servers.ca_pem}
    )
    result = await owner_backend.run_once(spec)
    assert result.status == "exited", result
    assert result.exit_code == 0, result.stderr
    got = output(result.stdout)
    assert got[allowed] == [200, f"A {ALLOWED} /tool"]
    assert got[denied][0] == "error"
    assert "403" in got[denied][1]
    assert [(d.destination, d.reason) for d in result.denials] == [
        (f"{DENIED}:443", "not on the allow-list")
    ]
    assert servers.seen["b"].requests == []


async def test_root_inside_reads_its_tls_bundle_as_its_own(
    owner_backend: DockerBackend, servers: Servers
) -> None:
    """The bundle's files belong to uid 0 *inside* (the host's 165536), so root's key is
    readable by it. Host root is no one in the sandbox's tmpfs (its namespace's): the owner
    creates the directory as the sandbox's root, which may then write there — the bundle is
    its own credential, and the listeners are bound before it runs."""
    bundle = servers.client_bundle
    network = Network(
        callback=f"https://{CALLBACK}:9443",
        tls=CallbackTls(ca=str(bundle["ca"]), cert=str(bundle["cert"]), key=str(bundle["key"])),
    )
    result = await owner_backend.run_once(root_spec(command(CALL), network))
    assert result.exit_code == 0, result.stderr
    got = output(result.stdout)
    assert got["uid"] == 0
    assert got["reply"] == f"callback-tls {CALLBACK}:9443 /tool-call"
    assert got["files"]["SBXKIT_TLS_KEY"] == ["/run/sbxkit/tls/key.pem", "0o400", 0]
    assert got["dir"] == ["0o755", 0]
    assert got["writable"] is True


async def test_a_governed_network_for_root_is_still_refused_under_gvisor(
    userns_engine: Engine, servers: Servers
) -> None:
    """gVisor's own network stack does not use the namespace the listeners are bound in."""
    spec = root_spec(["true"], Network(allow=[ALLOWED]), runtime="gvisor")
    with pytest.raises(SpecError) as caught:
        await DockerBackend(engine=userns_engine, owner=InProcessOwner(userns_engine)).run_once(
            spec
        )
    assert caught.value.field == "network"
