"""The callback endpoint (the reference driver's contract): a host endpoint reached from inside
through a loopback forwarder as ``SBXKIT_ENDPOINT``; an https endpoint with the client TLS
bundle mounted at a fixed path and named by ``SBXKIT_TLS_CA/CERT/KEY``."""

from __future__ import annotations

from typing import Any

import sbxkit
from sbxkit.backends.docker import DockerBackend
from sbxkit.network.terms import CallbackTls, Network
from tests.network.payloads import command, output
from tests.network.servers import ALLOWED, CALLBACK, Servers
from tests.witness import PYTHON

CALL = r"""
import json, os, ssl, stat, urllib.request
endpoint = os.environ["SBXKIT_ENDPOINT"]
out = {"endpoint": endpoint, "files": {}}
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
    assert got["files"] == {
        "SBXKIT_TLS_CA": ["/run/sbxkit/tls/ca.pem", "0o444", 65534],
        "SBXKIT_TLS_CERT": ["/run/sbxkit/tls/cert.pem", "0o444", 65534],
        "SBXKIT_TLS_KEY": ["/run/sbxkit/tls/key.pem", "0o400", 65534],  # no one else reads it
    }
    assert got["dir"] == ["0o755", 0]  # root's: the sandbox user cannot change what is there
    assert got["writable"] is False
    assert result.denials == ()


async def test_a_callback_by_address_is_reached_on_loopback(
    backend: DockerBackend, servers: Servers
) -> None:
    result = await backend.run_once(spec(Network(callback="http://127.0.0.1:8080")))
    got = output(result.stdout)
    assert got["endpoint"] == "http://127.0.0.1:8080"
    assert got["reply"] == "callback 127.0.0.1:8080 /tool-call"
