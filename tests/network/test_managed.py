"""The reference's managed network, faithfully: a labelled attachable bridge created on demand,
``host.docker.internal`` and ``host.sbxkit.internal`` on its gateway, the callback forwarder
listening there. It routes: the sandbox reaches other addresses directly (not governed)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import sbxkit
from sbxkit._model.network_terms import Network
from sbxkit.backends.docker import DockerBackend
from tests.network.payloads import command, output
from tests.network.servers import CALLBACK, Servers
from tests.witness import PYTHON, Witness

PROBE = r"""
import json, os, socket, urllib.request
names = ("host.docker.internal", "host.sbxkit.internal")
out = {name: socket.gethostbyname(name) for name in names}
out["endpoint"] = os.environ["SBXKIT_ENDPOINT"]
out["reply"] = urllib.request.urlopen(out["endpoint"] + "/from-bridge", timeout=10).read().decode()
out["direct"] = urllib.request.urlopen("http://192.0.2.10/direct", timeout=10).read().decode()
print(json.dumps(out))
"""


@pytest.fixture
def managed_network(witness: Witness) -> Iterator[None]:
    yield
    witness.session.delete(f"{witness.base}/networks/sbxkit-managed", timeout=30)


async def test_the_managed_network_with_its_callback(
    backend: DockerBackend, servers: Servers, witness: Witness, managed_network: None
) -> None:
    spec = sbxkit.SandboxSpec(
        image=PYTHON,
        command=command(PROBE),
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=128 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=60
        ),
        network=Network(mode="managed", callback=f"http://{CALLBACK}:8080"),
    )
    result = await backend.run_once(spec)
    assert result.exit_code == 0, result.stderr
    got = output(result.stdout)
    network = witness.get("/networks/sbxkit-managed")
    assert network["Driver"] == "bridge"
    assert network["Attachable"] is True
    assert network["Labels"] == {"sbxkit.network": "managed"}
    gateway = network["IPAM"]["Config"][0]["Gateway"]
    assert got["host.docker.internal"] == got["host.sbxkit.internal"] == gateway
    assert got["endpoint"] == "http://host.sbxkit.internal:8080"
    assert got["reply"] == f"callback {'host.sbxkit.internal:8080'} /from-bridge"
    # routed: it reached an upstream directly, with no proxy deciding (why production refuses)
    assert got["direct"] == "A 192.0.2.10 /direct"
    # a second sandbox finds the network there (created once; a 409 would be tolerated)
    again = await backend.run_once(spec)
    assert again.exit_code == 0, again.stderr
