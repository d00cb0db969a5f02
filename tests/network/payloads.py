"""Python programs the tier's sandboxes run (the python test image: urllib, ssl, socket)."""

from __future__ import annotations

import json
import sys
from typing import Any

SBXKIT_RUN = [sys.executable, "-m", "sbxkit", "run", "--json"]
"""``sbxkit run --json`` as a process (the command line's own path, parser and exit status)."""

FETCH = r"""
import json, os, ssl, sys, urllib.error, urllib.request
context = ssl.create_default_context(cadata=os.environ.get("TEST_CA") or None)
out = {}
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=15, context=context) as reply:
            out[url] = [reply.status, reply.read().decode()]
    except urllib.error.HTTPError as error:
        out[url] = [error.code, error.read().decode()]
    except Exception as error:
        out[url] = ["error", repr(error)]
print(json.dumps(out))
"""
"""``python3 -c FETCH URL...``: each URL through the injected proxy variables, as an agent's
tool would; prints {url: [status, body]}."""

RAW = r"""
import json, socket, sys
request = sys.argv[1].encode().decode("unicode_escape").encode("latin-1")
connection = socket.create_connection(("127.0.0.1", 3128), timeout=15)
connection.sendall(request)
reply = b""
while chunk := connection.recv(65536):
    reply += chunk
print(json.dumps(reply.decode("latin-1")))
"""
"""``python3 -c RAW 'REQUEST'``: one raw request to the proxy, its whole reply printed."""

TUNNEL = r"""
import json, os, socket, ssl, sys
host, port, server_name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
connection = socket.create_connection(("127.0.0.1", 3128), timeout=15)
connection.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
head = b""
while b"\r\n\r\n" not in head:
    head += connection.recv(1)
context = ssl.create_default_context(cadata=os.environ["TEST_CA"])
try:
    tls = context.wrap_socket(connection, server_hostname=server_name)
    tls.sendall(f"GET / HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n".encode())
    reply = b""
    while chunk := tls.recv(65536):
        reply += chunk
    print(json.dumps(["ok", reply.decode(errors="replace")]))
except Exception as error:
    print(json.dumps(["failed", repr(error)]))
"""
"""``python3 -c TUNNEL HOST PORT SERVER_NAME``: CONNECT HOST:PORT, then TLS naming SERVER_NAME."""


def command(program: str, *args: str) -> list[str]:
    return ["python3", "-c", program, *args]


def output(stdout: bytes) -> Any:
    return json.loads(stdout.decode().strip().splitlines()[-1])
