"""Credential injection (issue 45): the proxy adds a header on the way out, and the payload
never holds the secret.

The upstream that demands the bearer token is this module's own: HTTPS on
``OTHER_NAME:8443`` (192.0.2.10) with a certificate from a CA made here, which the rule names
as its ``ca_file``. ``DENIED:8443`` serves a certificate from another CA: a wrong certificate.
The token is made per test session with a marker prefix the payload searches for everywhere
it can read — its environment, every process's environ and cmdline, every readable file under
``/`` — without ever being told the token (the marker is assembled at run time, so no command
line holds it either).
"""

from __future__ import annotations

import http.server
import json
import os
import secrets
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio
import trustme

import sbxkit
from sbxkit._lifecycle.owner import InProcessOwner
from sbxkit._model.network_inject import InjectRule
from sbxkit._model.network_terms import Network
from sbxkit._model.settings import Settings
from sbxkit.backends.docker import DockerBackend
from sbxkit.engine.client import Engine
from sbxkit.errors import SbxError
from tests.network.conftest import LAUNCHER_UMASK, supervised, supervisor_with_umask
from tests.network.payloads import SBXKIT_RUN, TUNNEL, command, output
from tests.network.servers import ALLOWED, DENIED, LITERAL, OTHER_NAME, Servers
from tests.network.test_readoption import (
    KILL_AFTER_S,
    assert_egress,
    kill_supervisors,
    running_sandbox,
    settled,
    supervisor_log,
)
from tests.supervision import SupervisorProcess, auto_launched_supervisors, private_state_dir
from tests.witness import PYTHON, Witness

TOKEN_ENV = "SBXKIT_TEST_BROKER_TOKEN"
MARKER = "sbxtok-"
"""Every token starts with it; the payload looks for it (built from two halves at run time)."""
PORT = 8443
PLAIN_PORT = 8080
API = f"https://{OTHER_NAME}:{PORT}"
PLAIN = f"http://{LITERAL}:{PLAIN_PORT}"
LIMIT_S = 14
WRONG = f"https://{DENIED}:{PORT}"

PROBE = r"""
import json, os, stat, sys, time, urllib.error, urllib.request
marker = "sbx" + "tok-"
out = {"env": {k: os.environ.get(k) for k in
       ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")}}
own = sys.argv[2] if len(sys.argv) > 2 else ""
request = urllib.request.Request(sys.argv[1])
if own:
    request.add_header("Authorization", own)
began = time.monotonic()
try:
    with urllib.request.urlopen(request, timeout=20) as reply:  # SSL_CERT_FILE's trust
        out["reply"] = [reply.status, reply.read().decode()]
except urllib.error.HTTPError as error:
    out["reply"] = [error.code, error.read().decode()]
except Exception as error:
    out["reply"] = ["error", repr(error)]
out["seconds"] = time.monotonic() - began
print(json.dumps(out["reply"]), flush=True)
found = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as handle:
                    if marker.encode() in handle.read():
                        found.append(f"/proc/{pid}/{name}")
            except OSError:
                pass
if any(marker in value for value in os.environ.values()):
    found.append("os.environ")
keys = []
for top, dirs, files in os.walk("/"):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for name in files:
        path = os.path.join(top, name)
        try:
            info = os.lstat(path)  # regular files only: a FIFO (the run's own I/O) would block
            if not stat.S_ISREG(info.st_mode) or info.st_size > 1 << 20:
                continue
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        if marker.encode() in data:
            found.append(path)
        if not path.startswith("/usr/") and b"PRIVATE KEY" in data:  # the image's: binaries
            keys.append(path)
out["found"] = found
out["scan_seconds"] = time.monotonic() - began
out["keys"] = keys
try:
    out["broker"] = sorted(os.listdir("/run/sbxkit/broker"))
except OSError as error:
    out["broker"] = repr(error)
print(json.dumps(out))
"""
"""``python3 -c PROBE URL [OWN_AUTHORIZATION]``: the request through the proxy variables, then
where the token's marker can be found and whether a private key is in any file outside the
image's ``/usr`` (where only ``openssl`` and an engine library hold the words); prints one
JSON document."""


@dataclass
class Api:
    """The upstream that wants the token, and what reached it."""

    token: str
    ca_file: Path
    authorizations: list[list[str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    hold_released: threading.Event = field(default_factory=threading.Event)

    def seen(self) -> list[list[str]]:
        with self.lock:
            return [list(item) for item in self.authorizations]

    def clear(self) -> None:
        with self.lock:
            self.authorizations.clear()


def _api_handler(api: Api) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            values = self.headers.get_all("Authorization") or []
            with api.lock:
                api.authorizations.append(values)
            if self.path == "/hold":  # a long answer: the connection stays open meanwhile
                api.hold_released.wait(30)
            good = values == [f"Bearer {api.token}"]
            body = f"api {self.path} {'granted' if good else 'refused'}".encode()
            self.send_response(200 if good else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def running_api() -> Iterator[Api]:
    """The upstreams (see the module doc) and the token in this process's environment."""
    token = MARKER + secrets.token_hex(16)
    ours, theirs = trustme.CA(), trustme.CA()
    with tempfile.TemporaryDirectory(prefix="sbxbroker-") as directory:
        ca_file = Path(directory) / "api-ca.pem"
        ours.cert_pem.write_to_path(str(ca_file))
        api = Api(token=token, ca_file=ca_file)
        started = []
        for address, name, ca in (
            ("192.0.2.10", OTHER_NAME, ours),
            ("198.51.100.10", DENIED, theirs),
        ):
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ca.issue_cert(name).configure_cert(context)
            server = _Server((address, PORT), _api_handler(api))
            server.socket = context.wrap_socket(server.socket, server_side=True)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            started.append(server)
        plain = _Server((LITERAL, PLAIN_PORT), _api_handler(api))  # plain HTTP, by address
        threading.Thread(target=plain.serve_forever, daemon=True).start()
        started.append(plain)
        previous = os.environ.get(TOKEN_ENV)
        os.environ[TOKEN_ENV] = f"Bearer {token}"  # the caller's environment: env: reads it
        try:
            yield api
        finally:
            api.hold_released.set()
            if previous is None:
                os.environ.pop(TOKEN_ENV, None)
            for server in started:
                server.shutdown()
                server.server_close()


@pytest.fixture(scope="module")
def api(tier: str) -> Iterator[Api]:
    with running_api() as running:
        yield running


@pytest.fixture(autouse=True)
def fresh(api: Api) -> None:
    api.clear()
    api.hold_released.clear()


def network(api: Api, value_from: str = f"env:{TOKEN_ENV}", **more: Any) -> Network:
    return Network(
        allow=[
            f"{OTHER_NAME}:{PORT}",
            f"{DENIED}:{PORT}",
            f"{ALLOWED}:443",
            f"{LITERAL}:{PLAIN_PORT}",
            f"{OTHER_NAME}:443",
        ],
        inject=[
            InjectRule(
                host=OTHER_NAME,
                header="Authorization",
                value_from=value_from,
                ca_file=str(api.ca_file),
            ),
            InjectRule(host=LITERAL, header="Authorization", value_from=value_from),
            InjectRule(  # a rule whose upstream shows another CA's certificate
                host=DENIED,
                header="Authorization",
                value_from=value_from,
                ca_file=str(api.ca_file),
            ),
        ],
        **more,
    )


def spec_for(api: Api, argv: list[str], servers: Servers | None = None, **kw: Any) -> Any:
    return sbxkit.SandboxSpec(
        image=PYTHON,
        command=argv,
        env={"TEST_CA": servers.ca_pem} if servers is not None else {},
        limits=sbxkit.Limits(
            cpus=1, memory_bytes=256 * sbxkit.MiB, pids=64, output_bytes=sbxkit.MiB, timeout_s=90
        ),
        network=network(api, **kw),
    )


@pytest.fixture(params=["supervised", "in_process"])
def owner(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def backend_for(
    owner: str, engine: Engine, supervisor: SupervisorProcess, audit: Path
) -> DockerBackend:
    if owner == "supervised":
        return supervised(supervisor, engine, network_audit_log=str(audit))
    return DockerBackend(
        engine=engine,
        owner=InProcessOwner(engine),
        settings=Settings(network_audit_log=str(audit)),
    )


def audit_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_clean(got: dict[str, Any]) -> None:
    """Nothing the payload can read holds the token or a private key; its CA is there."""
    assert got["found"] == [], got["found"]
    assert got["keys"] == [], got["keys"]
    assert got["broker"] == ["bundle.pem", "ca.pem"]
    assert got["env"] == {
        "SSL_CERT_FILE": "/run/sbxkit/broker/bundle.pem",
        "REQUESTS_CA_BUNDLE": "/run/sbxkit/broker/bundle.pem",
        "CURL_CA_BUNDLE": "/run/sbxkit/broker/bundle.pem",
        "NODE_EXTRA_CA_CERTS": "/run/sbxkit/broker/ca.pem",
    }


async def test_the_payload_calls_the_api_without_ever_holding_the_token(
    owner: str, engine: Engine, supervisor: SupervisorProcess, api: Api, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    backend = backend_for(owner, engine, supervisor, audit)
    result = await backend.run_once(spec_for(api, command(PROBE, f"{API}/v1/models")))
    assert result.exit_code == 0, result.stderr
    got = output(result.stdout)
    assert got["reply"] == [200, "api /v1/models granted"]
    assert api.seen() == [[f"Bearer {api.token}"]]
    assert_clean(got)
    lines = audit_lines(audit)
    applied = [line for line in lines if line.get("injected")]
    assert [(line["destination"], line["injected"]) for line in applied] == [
        (f"{OTHER_NAME}:{PORT}", f"{OTHER_NAME} Authorization")
    ]
    assert api.token not in audit.read_text()  # that a rule applied, never its value
    assert result.denials == ()


async def test_a_payloads_own_authorization_is_replaced_never_forwarded(
    owner: str, engine: Engine, supervisor: SupervisorProcess, api: Api, tmp_path: Path
) -> None:
    backend = backend_for(owner, engine, supervisor, tmp_path / "audit.jsonl")
    argv = command(PROBE, f"{API}/mine", "Bearer payload-own")
    result = await backend.run_once(spec_for(api, argv))
    got = output(result.stdout)
    assert got["reply"] == [200, "api /mine granted"]
    assert api.seen() == [[f"Bearer {api.token}"]]  # one value, the rule's; not the payload's


async def test_plain_http_gets_the_header_set_by_the_proxy(
    owner: str, engine: Engine, supervisor: SupervisorProcess, api: Api, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    backend = backend_for(owner, engine, supervisor, audit)
    argv = command(PROBE, f"{PLAIN}/plain", "Bearer payload-own")
    got = output((await backend.run_once(spec_for(api, argv))).stdout)
    assert got["reply"] == [200, "api /plain granted"]
    assert api.seen() == [[f"Bearer {api.token}"]]
    assert_clean(got)
    (line,) = [line for line in audit_lines(audit) if line.get("injected")]
    assert (line["kind"], line["injected"]) == ("http", f"{LITERAL} Authorization")
    # a rule's host at 443 is HTTPS: the secret is never sent there in clear
    clear = await backend.run_once(spec_for(api, command(PROBE, f"http://{OTHER_NAME}:443/x")))
    got = output(clear.stdout)
    assert got["reply"][0] == 403, got
    assert "which has an inject rule: use https://" in got["reply"][1]
    assert [d.destination for d in clear.denials] == [f"{OTHER_NAME}:443"]


async def test_an_upstream_with_a_wrong_certificate_is_refused(
    owner: str, engine: Engine, supervisor: SupervisorProcess, api: Api, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.jsonl"
    backend = backend_for(owner, engine, supervisor, audit)
    result = await backend.run_once(spec_for(api, command(PROBE, f"{WRONG}/v1")))
    got = output(result.stdout)
    status, body = got["reply"]
    assert status == 502, got
    assert "the upstream's TLS was refused" in body
    assert "CERTIFICATE_VERIFY_FAILED" in body
    assert api.seen() == []  # no request, so no token, reached it
    (denial,) = result.denials
    assert denial.destination == f"{DENIED}:{PORT}"
    assert "CERTIFICATE_VERIFY_FAILED" in denial.reason
    (line,) = [line for line in audit_lines(audit) if line["verdict"] == "denied"]
    assert "the upstream's TLS was refused" in line["reason"]
    assert_clean(got)


async def test_a_destination_without_a_rule_is_still_an_opaque_tunnel(
    engine: Engine, supervisor: SupervisorProcess, api: Api, servers: Servers, tmp_path: Path
) -> None:
    """``ALLOWED:443`` has no rule: its TLS is end to end (the payload verifies the tier's own
    CA, which only the real upstream's certificate chains to) and the SNI rule still holds."""
    backend = backend_for("in_process", engine, supervisor, tmp_path / "audit.jsonl")
    same = await backend.run_once(
        spec_for(api, command(TUNNEL, ALLOWED, "443", ALLOWED), servers=servers)
    )
    verdict, detail = output(same.stdout)
    assert verdict == "ok", detail
    assert f"A {ALLOWED} /" in detail
    fronted = await backend.run_once(
        spec_for(api, command(TUNNEL, ALLOWED, "443", OTHER_NAME), servers=servers)
    )
    verdict, detail = output(fronted.stdout)
    assert verdict == "failed", detail
    assert fronted.denials[-1].reason == (
        f"the TLS server name {OTHER_NAME!r} is not the CONNECT host {ALLOWED!r}"
    )
    assert api.seen() == []


async def test_a_pooled_and_a_session_sandbox_with_a_file_secret(
    owner: str,
    engine: Engine,
    supervisor: SupervisorProcess,
    api: Api,
    witness: Witness,
    tmp_path: Path,
) -> None:
    secret = tmp_path / "token"
    secret.write_text(f"Bearer {api.token}\n")
    secret.chmod(0o600)
    backend = backend_for(owner, engine, supervisor, tmp_path / "audit.jsonl")
    spec = spec_for(api, command(PROBE, f"{API}/pooled"), value_from=f"file:{secret}")
    async with sbxkit.open_pool(spec, size=1, backend=backend, refill=False) as pool:
        await pool.wait_ready(1)
        (parked,) = witness.sbxkit_containers()
        inspected = json.dumps(witness.get(f"/containers/{parked['Id']}/json"))
        assert api.token not in inspected  # not in its config, env, labels or mounts
        result = await pool.run(spec)
    assert result.pooled
    got = output(result.stdout)
    assert got["reply"] == [200, "api /pooled granted"]
    assert_clean(got)
    session = sbxkit.SandboxSpec(
        image=PYTHON,
        command=["sleep", "60"],
        limits=spec.limits,
        network=spec.network,
    )
    async with sbxkit.open_sandbox(session, backend=backend) as sandbox:
        inspected = json.dumps(witness.get(f"/containers/{sandbox.container_id}/json"))
        assert api.token not in inspected
        ran = await sandbox.exec(command(PROBE, f"{API}/session"))
        got = output(ran.stdout)
        assert got["reply"] == [200, "api /session granted"]
        assert_clean(got)
        # an exec's env cannot point the trust variables elsewhere
        hostile = {"SSL_CERT_FILE": "/tmp/mine.pem", "NODE_EXTRA_CA_CERTS": "/tmp/mine.pem"}
        shown = await sandbox.exec(
            ["sh", "-c", 'echo "$SSL_CERT_FILE $NODE_EXTRA_CA_CERTS"'], env=hostile
        )
        assert shown.stdout == b"/run/sbxkit/broker/bundle.pem /run/sbxkit/broker/ca.pem\n"
    assert api.seen() == [[f"Bearer {api.token}"]] * 2


async def test_an_interpreter_session_calls_the_api_through_its_rule(
    engine: Engine, supervisor: SupervisorProcess, api: Api, tmp_path: Path
) -> None:
    """Injection reaches an interpreter session too (issue 45: "and an interpreter session"):
    code run in it calls the API with urllib, through the variables sbxkit set, and gets in;
    the token is in none of its environment."""
    backend = backend_for("supervised", engine, supervisor, tmp_path / "audit.jsonl")
    async with sbxkit.open_interpreter(spec_for(api, ["sleep", "60"]), backend=backend) as interp:
        got = await interp.run_code(
            "import os, urllib.request\n"
            f"reply = urllib.request.urlopen({API + '/interp'!r}, timeout=20)\n"
            "marker = 'sbx' + 'tok-'\n"
            "(reply.status, reply.read().decode(), any(marker in v for v in os.environ.values()))"
        )
        assert got.error is None, got.error
        assert got.text == "(200, 'api /interp granted', False)"
    assert api.seen() == [[f"Bearer {api.token}"]]
    lines = audit_lines(tmp_path / "audit.jsonl")
    assert [line["injected"] for line in lines if line.get("injected")] == [
        f"{OTHER_NAME} Authorization"
    ]


def test_a_batch_takes_the_rules_from_its_profile(api: Api, tmp_path: Path) -> None:
    """A profile's rules (so batch, Inspect and MCP get them), the value read from the
    environment of the command that plans the sandboxes."""
    audit = tmp_path / "audit.jsonl"
    profile = tmp_path / "profile.toml"
    rule_line = (
        f'inject = [{{host = "{OTHER_NAME}", header = "Authorization", '
        f'value_from = "env:{TOKEN_ENV}", ca_file = "{api.ca_file}"}}]'
    )
    profile.write_text(
        f"""
[sandbox.docker]
image = "{PYTHON}"
network_audit_log = "{audit}"

[sandbox.docker.limits]
cpus = 1
memory = "256m"
pids = 64
max_output = "1m"
timeout = 90

[sandbox.docker.network]
allow = ["{OTHER_NAME}:{PORT}"]
{rule_line}
"""
    )
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"id": "agent", "command": command(PROBE, f"{API}/batch")}) + "\n")
    out = tmp_path / "results.jsonl"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "sbxkit", "batch", str(jobs)),
            *("--profile", str(profile), "--out", str(out)),
        ],
        capture_output=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = output(json.loads(out.read_text())["stdout"].encode())
    assert got["reply"] == [200, "api /batch granted"]
    assert_clean(got)
    assert api.seen() == [[f"Bearer {api.token}"]]
    assert api.token not in audit.read_text()


def test_the_command_line_refuses_a_bad_secret_file_before_anything_exists(
    api: Api, witness: Witness, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text(f"Bearer {api.token}\n")
    secret.chmod(0o644)
    began = time.time()
    proc = subprocess.run(
        [
            *(*SBXKIT_RUN, "--allow", f"{OTHER_NAME}:{PORT}"),
            *("--inject", f"{OTHER_NAME}:Authorization=file:{secret}", PYTHON, "--", "true"),
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["field"].endswith("inject[0].value_from"), error
    assert "has mode 0644; a secret file must be 0600" in error["message"]
    assert api.token not in proc.stdout.decode() + proc.stderr.decode()
    assert witness.events(began, time.time() + 1, type=["container"], event=["create"]) == []


HOLD = r"""
import threading, time, urllib.request
def hold():
    began = time.monotonic()
    try:
        urllib.request.urlopen("https://other-name.sbxkit.test:8443/hold", timeout=60).read()
        print("hold answered", flush=True)
    except Exception as error:
        print("hold ended", repr(error)[:120], flush=True)
threading.Thread(target=hold).start()
for attempt in range(600):
    try:
        urllib.request.urlopen("https://other-name.sbxkit.test:8443/tick", timeout=5).read()
        print("ok", flush=True)
    except Exception as error:
        print("refused", repr(error)[:120], flush=True)
    time.sleep(0.1)
"""


async def test_a_killed_supervisor_closes_the_injected_connections(
    engine: Engine, api: Api, witness: Witness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A held injected connection ends with its proxy (the supervisor, SIGKILLed, its caller
    unable to launch another): no listener, no connection, no CA key is left anywhere."""
    monkeypatch.setenv("SBXKIT_SUPERVISOR", "/bin/false")
    state_dir = private_state_dir()
    spec = spec_for(api, ["python3", "-c", HOLD])
    lines: list[str] = []
    first_ok = trio.Event()
    ended = trio.Event()
    ended_at: list[float] = []

    def on_output(stream: str, chunk: bytes) -> None:
        lines.extend(chunk.decode().splitlines())
        if "ok" in lines:
            first_ok.set()
        if any(line.startswith("hold ") for line in lines) and not ended.is_set():
            ended_at.append(time.monotonic())
            ended.set()

    with supervisor_with_umask(state_dir, LAUNCHER_UMASK) as first:
        backend = DockerBackend(
            engine=engine,
            settings=Settings(supervisor_state_dir=str(state_dir)),
            recover_at_open=False,
        )
        failure: list[BaseException] = []

        async def run() -> None:
            try:
                await backend.run_once(spec, on_output=on_output)
            except SbxError as exc:
                failure.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            with trio.fail_after(60):
                await first_ok.wait()
            assert [f"Bearer {api.token}"] in api.seen()  # /hold is being held
            killed_at = time.monotonic()
            first.kill()  # SIGKILL: no cleanup code of its runs
            with trio.fail_after(30):
                await ended.wait()
        api.hold_released.set()  # the upstream's handler lets go of the dead connection
        assert failure, "the run cannot report success once its owner is gone"
    assert ended_at[0] - killed_at < 10, ended_at[0] - killed_at
    held = [line for line in lines if line.startswith("hold ")]
    assert held, lines[-5:]
    assert held[0].startswith("hold ended"), held
    refusals = [line for line in lines if line.startswith("refused")]
    assert refusals, lines[-5:]
    with supervisor_with_umask(state_dir, LAUNCHER_UMASK):
        assert witness.wait_until_no_sbxkit_containers(seconds=30) == []


TICK = r"""
import hashlib, time, urllib.request
def ca():
    with open("/run/sbxkit/broker/ca.pem", "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()[:12]
while True:
    before = ca()
    try:
        urllib.request.urlopen("https://other-name.sbxkit.test:8443/tick", timeout=2).read()
        verdict, why = "ok", ""
    except Exception as error:
        verdict, why = "refused", type(error).__name__
    after = ca()
    # A probe the rewrite of the broker files fell within says nothing of either CA.
    print(verdict if before == after else "moved", time.time(), after, why, flush=True)
    time.sleep(0.05)
"""


async def test_a_re_adopting_supervisor_brings_a_new_ca_and_injection_back(
    engine: Engine, witness: Witness, api: Api
) -> None:
    """The CA key dies with the supervisor; the next one (launched by the live caller) makes
    a new CA, rewrites the sandbox's ``broker/`` files and injects again."""
    state_dir = private_state_dir()
    backend = DockerBackend(
        engine=engine,
        settings=Settings(supervisor_state_dir=str(state_dir)),
        recover_at_open=False,
    )
    spec = spec_for(api, ["python3", "-c", TICK])
    spec = msgspec.structs.replace(
        spec, limits=msgspec.structs.replace(spec.limits, timeout_s=LIMIT_S)
    )
    outcome: list[Any] = []
    killed: list[float] = []
    with auto_launched_supervisors(state_dir):
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                try:
                    outcome.append(await backend.run_once(spec))
                except SbxError as exc:
                    outcome.append(exc)

            nursery.start_soon(run)
            lease = await running_sandbox(witness)
            await trio.sleep(KILL_AFTER_S + 2)
            killed.append(await trio.to_thread.run_sync(kill_supervisors, state_dir))
        (result,) = outcome
        assert isinstance(result, sbxkit.RunResult), repr(result)
        await settled(witness)
    log = supervisor_log(state_dir)
    assert f"lease {lease}: re-adopted by its caller" in log, log
    stdout = result.stdout.decode()
    assert_egress(stdout, killed[0], back=True)
    cas = [
        (fields[0], fields[2])
        for fields in (line.split() for line in stdout.splitlines())
        if len(fields) >= 3 and fields[0] in ("ok", "refused")
    ]
    first_refused = [verdict for verdict, _ in cas].index("refused")
    before = {ca for _, ca in cas[:first_refused]}
    after = {ca for verdict, ca in cas[first_refused:] if verdict == "ok"}
    assert len(before) == 1, cas
    assert len(after) == 1, cas
    assert after != before  # a new CA, trusted once written
    assert all(seen == [f"Bearer {api.token}"] for seen in api.seen())
