"""What a governed sandbox's loopback serves, whichever way a client goes (issue 43, item 5).

Clients differ on the proxy variables: busybox ``wget`` honours ``http_proxy`` but not
``no_proxy``, so it sends even the callback (``$SBXKIT_ENDPOINT``) to the allow-list proxy;
Python's urllib and curl honour ``NO_PROXY`` (``localhost,127.0.0.1,::1``), so they dial a
loopback address directly, on the sandbox's own loopback. Either way a destination reaches the
same thing: the callback endpoint, a loopback allow entry's host service — and nothing else.
"""

from __future__ import annotations

import pytest

import sbxkit
from sbxkit._model.network_terms import Network
from sbxkit.backends.docker import DockerBackend
from tests.network.payloads import FETCH, command, output
from tests.network.servers import ALLOWED, CALLBACK, Servers
from tests.witness import BUSYBOX, PYTHON

UNSERVED = 8079  # nothing sbxkit serves, on the sandbox's loopback nor through the proxy

WGET = r"""
wget -qO- "$SBXKIT_ENDPOINT/cb"; echo " rc=$?"
wget -qO- "http://localhost:$1/by-name"; echo " rc=$?"
wget -qO- "http://127.0.0.1:$0/other"; echo " rc=$?"
"""


def limits() -> sbxkit.Limits:
    return sbxkit.Limits(
        cpus=1, memory_bytes=128 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=60
    )


@pytest.mark.parametrize("host", [CALLBACK, "127.0.0.1"])
async def test_busybox_wget_reaches_the_callback_through_the_proxy(
    host: str, backend: DockerBackend, servers: Servers
) -> None:
    """busybox wget ignores ``no_proxy``: the callback request goes to the proxy, which
    forwards it to the callback endpoint as the direct forwarder would (on the old code: 403,
    ``127.0.0.1:8080 not on the allow-list``) — by ``$SBXKIT_ENDPOINT``'s host or
    ``localhost``; a loopback port that is not the callback's is still refused there."""
    spec = sbxkit.SandboxSpec(
        image=BUSYBOX,
        command=["sh", "-c", WGET, str(UNSERVED), "8080"],
        limits=limits(),
        network=Network(allow=[ALLOWED], callback=f"http://{host}:8080"),
    )
    result = await backend.run_once(spec)
    assert result.exit_code == 0, result.stderr
    first, second, third = result.stdout.decode().splitlines()[:3]
    assert first == f"callback {host}:8080 /cb rc=0", result.stderr
    assert second == "callback localhost:8080 /by-name rc=0"  # the forwarder's other name
    assert third.endswith("rc=1")
    assert [path for _, path, _ in servers.seen["callback"].requests] == ["/cb", "/by-name"]
    assert [(d.destination, d.reason) for d in result.denials] == [
        (f"127.0.0.1:{UNSERVED}", "not on the allow-list")
    ]


async def test_an_https_callback_is_reached_through_a_connect_tunnel(
    backend: DockerBackend, servers: Servers
) -> None:
    """The https callback through the proxy: CONNECT to the callback's name is spliced to the
    endpoint, so TLS (and the client certificate the endpoint asks for) stays end to end —
    here a raw CONNECT from Python, as a client that ignores ``NO_PROXY`` sends it."""
    bundle = servers.client_bundle
    network = Network(
        allow=[ALLOWED],
        callback=f"https://{CALLBACK}:9443",
        tls=sbxkit.CallbackTls(
            ca=str(bundle["ca"]), cert=str(bundle["cert"]), key=str(bundle["key"])
        ),
    )
    program = r"""
import json, os, socket, ssl
connection = socket.create_connection(("127.0.0.1", 3128), timeout=15)
target = os.environ["SBXKIT_ENDPOINT"].removeprefix("https://")
connection.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += connection.recv(1)
context = ssl.create_default_context(cafile=os.environ["SBXKIT_TLS_CA"])
context.load_cert_chain(os.environ["SBXKIT_TLS_CERT"], os.environ["SBXKIT_TLS_KEY"])
tls = context.wrap_socket(connection, server_hostname=target.partition(":")[0])
tls.sendall(f"GET /tunnelled HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
reply = b""
while chunk := tls.recv(65536):
    reply += chunk
print(json.dumps([head.decode().splitlines()[0], reply.decode().rpartition("\r\n\r\n")[2]]))
"""
    spec = sbxkit.SandboxSpec(
        image=PYTHON, command=command(program), limits=limits(), network=network
    )
    result = await backend.run_once(spec)
    assert result.exit_code == 0, result.stderr
    assert output(result.stdout) == [
        "HTTP/1.1 200 Connection established",
        f"callback-tls {CALLBACK}:9443 /tunnelled",
    ]
    assert result.denials == ()


async def test_a_loopback_allow_entry_answers_clients_that_honour_no_proxy(
    backend: DockerBackend, servers: Servers
) -> None:
    """``allow = ["127.0.0.1:8080"]``: urllib honours ``NO_PROXY`` (127.0.0.1 is in it) and
    dials the sandbox's own 127.0.0.1:8080 — where sbxkit now forwards to the host's
    127.0.0.1:8080, the service the entry names (on the old code: connection refused, nothing
    listened there). busybox wget, through the proxy, reaches the same service; another loopback
    port is refused both ways."""
    spec = sbxkit.SandboxSpec(
        image=PYTHON,
        command=command(
            FETCH,
            "http://127.0.0.1:8080/direct",
            f"http://127.0.0.1:{UNSERVED}/unserved",
        ),
        limits=limits(),
        network=Network(allow=[ALLOWED, "127.0.0.1:8080", "[::1]:8080"]),
    )
    result = await backend.run_once(spec)
    assert result.exit_code == 0, result.stderr
    got = output(result.stdout)
    assert got["http://127.0.0.1:8080/direct"] == [200, "callback 127.0.0.1:8080 /direct"]
    assert got[f"http://127.0.0.1:{UNSERVED}/unserved"][0] == "error"  # refused, nothing there
    assert result.denials == ()  # the unserved port was refused by the sandbox's own kernel
    proxied = sbxkit.SandboxSpec(
        image=BUSYBOX,
        command=["sh", "-c", 'wget -qO- http://127.0.0.1:8080/proxied; echo " rc=$?"'],
        limits=limits(),
        network=Network(allow=[ALLOWED, "127.0.0.1:8080"]),
    )
    result = await backend.run_once(proxied)
    assert result.stdout.decode().splitlines()[0] == "callback 127.0.0.1:8080 /proxied rc=0"
    paths = [path for _, path, _ in servers.seen["callback"].requests]
    assert paths == ["/direct", "/proxied"]


DIRECT = r"""
import json, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    connection = socket.create_connection((host, port), timeout=15)
    head = f"GET /v6 HTTP/1.1\r\nHost: [{host}]:{port}\r\nConnection: close\r\n\r\n"
    connection.sendall(head.encode())
    reply = b""
    while chunk := connection.recv(65536):
        reply += chunk
    print(json.dumps(reply.decode().rpartition("\r\n\r\n")[2]))
except OSError as error:
    print(json.dumps(repr(error)))
"""
"""``python3 -c DIRECT HOST PORT``: one GET dialled straight at HOST:PORT, no proxy — as curl
does for ``::1``, which ``NO_PROXY`` lists, or Go for any loopback address."""


async def test_an_ipv6_loopback_entry_is_served_at_its_own_address(
    backend: DockerBackend, servers: Servers
) -> None:
    """``allow = ["[::1]:8080"]``: a client dialling ``[::1]:8080`` directly reaches the host's
    ``[::1]:8080`` (on the old code: connection refused inside); ``[::1]`` at another port is
    still refused."""
    spec = sbxkit.SandboxSpec(
        image=PYTHON,
        command=["sh", "-c", 'python3 -c "$0" ::1 8080; python3 -c "$0" ::1 8079', DIRECT],
        limits=limits(),
        network=Network(allow=["[::1]:8080"]),
    )
    result = await backend.run_once(spec)
    assert result.exit_code == 0, result.stderr
    first, second = result.stdout.decode().splitlines()
    assert first == '"loopback-v6 [::1]:8080 /v6"'
    assert "ConnectionRefusedError" in second
    assert [path for _, path, _ in servers.seen["v6"].requests] == ["/v6"]
    assert result.denials == ()
