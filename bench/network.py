"""Benchmark ``network``: the allow-list proxy's cost — connect latency and throughput through
sbxkit's governed-network proxy against a direct connection, as ratios.

Contenders, interleaved round-robin in one trio program; the proxy (``sbxkit.network.proxy``,
the code that serves a governed sandbox's ``127.0.0.1:3128``) runs in that program's event loop
on a loopback listener, exactly as its owner runs it, with an allow-list entry that is the
upstream's literal address; the clients run in worker threads with the standard library, as a
sandbox's tool would:

``direct``
    TCP connect, TLS handshake and ``GET /`` (a 2-byte body) to a local HTTPS server.
``proxied``
    The same through the proxy: ``CONNECT 127.0.0.1:PORT``, the proxy's decision (allow-list,
    ClientHello read and SNI check), its upstream connect, then the same TLS handshake and GET
    spliced through.
``injected``
    The same through a proxy with an inject rule for the upstream (credential injection,
    issue 45): the proxy terminates the client's TLS with a leaf from the sandbox's broker CA,
    opens and verifies its own TLS to the upstream, and forwards the GET with the rule's header.

Then throughput: ``--megabytes`` (64) downloaded over one TLS connection each way, interleaved
``--bulk-rounds`` (3) times; MB/s and the ratio.

In a real sandbox the client's leg is the sandbox's own loopback (another namespace's, the same
kind of hop); nothing of the sandbox or the daemon is in these numbers: this is the proxy's
price alone. No target is set by the issue: the ratios are reported.
"""

from __future__ import annotations

import argparse
import http.server
import os
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import trio
import trustme

from bench import common
from bench.harness import Contender, ContenderFailed, run_interleaved, say
from sbxkit._model.network_allow import parse_allow_list
from sbxkit._model.network_audit import Decision
from sbxkit._model.network_inject import InjectTerms
from sbxkit.network.broker import Broker
from sbxkit.network.proxy import ProxyContext, proxy_connection, serve_listener

NAME = "network"
SUMMARY = "governed-network proxy: connect latency and throughput vs a direct connection"

DEFAULT_ROUNDS = 200
QUICK_ROUNDS = 20
DEFAULT_WARMUP = 10
QUICK_WARMUP = 3
ROUND_COUNTS = common.RoundCounts(DEFAULT_ROUNDS, DEFAULT_WARMUP, QUICK_ROUNDS, QUICK_WARMUP)
RATIOS = (("proxied", "direct"), ("injected", "proxied"), ("injected", "direct"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    common.add_round_arguments(parser, ROUND_COUNTS, default_order="direct,proxied,injected")
    parser.add_argument("--megabytes", type=int, default=64, help="bulk transfer size (MiB)")
    parser.add_argument("--bulk-rounds", type=int, default=3, help="interleaved bulk rounds")
    common.add_out_argument(parser, "network.json / .md")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    bulk = 0

    def do_GET(self) -> None:
        size = self.bulk if self.path == "/bulk" else 2
        self.send_response(200)
        self.send_header("Content-Length", str(size))
        self.end_headers()
        chunk = b"x" * 65536
        left = size
        while left:
            self.wfile.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))

    def log_message(self, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    def get_request(self) -> tuple[socket.socket, Any]:
        # As production servers do (nginx's tcp_nodelay): without it, a response written as
        # head then body waits for the delayed ACK of a client that has nothing to send (40 ms).
        connection, address = super().get_request()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, address


@contextmanager
def upstream(ca: trustme.CA, bulk: int) -> Iterator[int]:
    handler = type("Handler", (_Handler,), {"bulk": bulk})
    server = _Server(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def fetch(port: int, proxy: int | None, context: ssl.SSLContext, path: str) -> int:
    """One connection: (CONNECT through ``proxy``,) TLS, GET ``path``; the body's size."""
    sock = socket.create_connection(("127.0.0.1", proxy or port), timeout=30)
    # As curl, requests (urllib3), Go and Node do; Python's http.client does not, and through
    # the broker pays a delayed ACK for it (docs/network.md).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        if proxy is not None:
            target = f"127.0.0.1:{port}"
            sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(1)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"proxy refused: {head!r}")
        with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
            request = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
            tls.sendall(request.encode())
            size = 0
            while chunk := tls.recv(1 << 20):
                size += len(chunk)
            return size
    finally:
        sock.close()


async def measure(args: argparse.Namespace, rounds: int, warmup: int) -> dict[str, Any]:
    ca = trustme.CA()
    client = ssl.create_default_context()
    ca.configure_trust(client)
    bulk = args.megabytes * 1024 * 1024
    decisions: list[Decision] = []
    errors: list[str] = []
    with upstream(ca, bulk) as port:
        context = ProxyContext(
            lease="bench",
            entries=parse_allow_list([f"127.0.0.1:{port}"]),
            record=decisions.append,
            max_connections=64,
            max_connection_bytes=4 * bulk,
        )
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        proxy = listener.getsockname()[1]
        rule = InjectTerms(
            host="127.0.0.1",
            is_ip=True,
            header="Authorization",
            value="Bearer bench",
            ca=ca.cert_pem.bytes(),
        )
        broker = Broker("bench", [rule])
        brokered = ProxyContext(
            lease="bench-broker",
            entries=parse_allow_list([f"127.0.0.1:{port}"]),
            record=decisions.append,
            max_connections=64,
            max_connection_bytes=4 * bulk,
            broker=broker,
        )
        trusting = ssl.create_default_context(cadata=broker.ca_pem.decode())
        broker_listener = socket.create_server(("127.0.0.1", 0))
        broker_listener.setblocking(False)
        injecting = broker_listener.getsockname()[1]
        contenders = [
            Contender(
                "direct",
                "direct",
                "TCP connect, TLS handshake, GET / (2 bytes) to the upstream",
                lambda: _timed(fetch, port, None, client, "/"),
            ),
            Contender(
                "proxied",
                "through the proxy",
                "CONNECT through sbxkit's proxy (decision, ClientHello, SNI check, upstream "
                "connect), then the same TLS handshake and GET spliced",
                lambda: _timed(fetch, port, proxy, client, "/"),
            ),
            Contender(
                "injected",
                "through the broker",
                "CONNECT to a host with an inject rule: TLS terminated by the proxy (a leaf "
                "from the broker CA), its own verified TLS upstream, the GET with the header set",
                lambda: _timed(fetch, port, injecting, trusting, "/"),
            ),
        ]
        contenders = common.order_contenders(contenders, args.order, NAME, only=args.only)
        bulk_s: dict[str, list[float]] = {"direct": [], "proxied": []}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_listener, listener, partial(proxy_connection, context), errors)
            nursery.start_soon(
                serve_listener, broker_listener, partial(proxy_connection, brokered), errors
            )
            try:
                await run_interleaved(contenders, rounds=rounds, warmup=warmup, progress=say)
                for _ in range(args.bulk_rounds):
                    for key, via in (("direct", None), ("proxied", proxy)):
                        began = time.perf_counter()
                        got = await trio.to_thread.run_sync(fetch, port, via, client, "/bulk")
                        if got < bulk:
                            raise RuntimeError(f"{key}: {got} of {bulk} bytes")
                        bulk_s[key].append(time.perf_counter() - began)
            except ContenderFailed as exc:
                errors.append(str(exc))
            nursery.cancel_scope.cancel()
    mbps = {key: [args.megabytes / s for s in values] for key, values in bulk_s.items()}
    medians = {key: sorted(v)[len(v) // 2] if v else None for key, v in mbps.items()}
    direct, proxied = medians["direct"], medians["proxied"]
    ratios = common.interleaved_ratios(contenders, RATIOS, not errors)
    return {
        "config": {
            **common.interleaving_config(args, rounds, warmup, contenders),
            "megabytes": args.megabytes,
            "bulk_rounds": args.bulk_rounds,
        },
        "contenders": common.contender_report(contenders),
        "ratios": ratios,
        "throughput_mb_s": {"direct": mbps["direct"], "proxied": mbps["proxied"]},
        "throughput_ratio": proxied / direct if direct and proxied else None,
        "decisions": len(decisions),
        "errors": errors,
        "leaks": [],
        "ok": not errors,
        "machine": {"date": time.strftime("%Y-%m-%dT%H:%M:%S"), "nproc": os.cpu_count()},
    }


async def _timed(fn: Any, *args: Any) -> dict[str, float]:
    await trio.to_thread.run_sync(fn, *args)
    return {}


def render_text(report: dict[str, Any]) -> str:
    lines = [
        f"{NAME} — {report['config']['rounds']} rounds, interleaved",
        *common.ms_table_text(report["contenders"], 20),
        "(ms per connect + TLS + GET)",
        *common.ratio_lines_text(report["ratios"], 20),
    ]
    tp = report["throughput_mb_s"]
    if report["throughput_ratio"] is not None:
        lines.append(
            f"throughput MB/s median: direct {sorted(tp['direct'])[len(tp['direct']) // 2]:.0f}, "
            f"proxied {sorted(tp['proxied'])[len(tp['proxied']) // 2]:.0f}; "
            f"proxied/direct {report['throughput_ratio']:.3f}"
        )
    return "\n".join(lines + common.errors_text(report))


def render_markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    out = [
        f"# {NAME} — the governed network's proxy vs a direct connection",
        "",
        f"{report['machine']['date']} · {cfg['rounds']} measured rounds (+{cfg['warmup']} "
        f"warm-up), interleaved `{' → '.join(cfg['order'])}`; {cfg['megabytes']} MiB × "
        f"{cfg['bulk_rounds']} bulk rounds",
        "",
        *common.ms_table_md(report["contenders"]),
        *common.ratio_table_md(report["ratios"], "latency ratio (of medians)"),
    ]
    if report["throughput_ratio"] is not None:
        tp = report["throughput_mb_s"]
        out += [
            "",
            "| throughput | MB/s (each bulk round) |",
            "|---|---|",
            *(f"| {k} | {', '.join(f'{v:.0f}' for v in tp[k])} |" for k in ("direct", "proxied")),
            "",
            f"Throughput proxied/direct (medians): {report['throughput_ratio']:.3f}.",
        ]
    return common.md(out + common.errors_md(report))


def main(args: argparse.Namespace) -> int:
    rounds, warmup = common.rounds_and_warmup(args, NAME, ROUND_COUNTS)
    report = trio.run(measure, args, rounds, warmup)
    print(render_text(report))
    common.write_report(args.out, NAME, report, render_markdown)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    common.run_as_script(NAME, SUMMARY, add_arguments, main)
