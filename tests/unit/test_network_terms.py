"""A governed network as a spec asks for it: validated before any container exists, the body
policy builds for it, the owned variables no spec can override, the supervisor's re-check of
such bodies, and where the governed path cannot work (refusals by name)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
import trio

from sbxkit._model.network_allow import parse_allow_list
from sbxkit._model.network_audit import Decision, Denial, Denials, encode_decision
from sbxkit._model.network_names import Destination
from sbxkit._model.network_terms import (
    PROXY_KEYS,
    TLS_TMPFS,
    CallbackTerms,
    CallbackTls,
    Network,
    NetworkTerms,
    TlsBundle,
    check_network_spec,
    is_callback_destination,
    loopback_forwards,
    network_env,
    parse_callback,
    unset_env,
)
from sbxkit._model.rules import check_network
from sbxkit._model.runtimes import check_runtime_fit
from sbxkit._model.spec import Limits, MiB, SandboxSpec, spec_from_dict, validate_spec
from sbxkit._plan.policy import hardened_body
from sbxkit._protocol.wire import Claim, PoolTerms, Register, Reservation
from sbxkit.engine.models import ContainerCreate
from sbxkit.errors import SpecError
from sbxkit.network.gate import GATE_LINE, Prefixed, gate_command
from sbxkit.network.netns import can_enter_namespaces, process_problem
from sbxkit.network.refusals import desktop_kind, governed_refusal
from sbxkit.supervisor.adopting import terms_problem
from sbxkit.supervisor.recheck import recheck_body
from sbxkit.supervisor.templates import shape_key

LEASE = "0123456789abcdef0123456789abcdef"
CA = "/etc/sbxkit/ca.pem"


def spec(**fields: Any) -> SandboxSpec:
    values: dict[str, Any] = {
        "image": "sbxkit-test/busybox:latest",
        "command": ["true"],
        "limits": Limits(cpus=1, memory_bytes=64 * MiB, pids=16, output_bytes=1024, timeout_s=5),
    }
    values.update(fields)
    return SandboxSpec(**values)


def refused(network: Network) -> SpecError:
    with pytest.raises(SpecError) as info:
        check_network_spec(network)
    return info.value


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("network", "field", "rule"),
    [
        (Network(callback="http://h.example:80", tls=CallbackTls(ca=CA)), "network.tls", "http"),
        (Network(callback="https://h.example:443"), "network.tls", "needs the client TLS"),
        (
            Network(callback="https://h.example:443", tls=CallbackTls(ca=CA, cert=CA)),
            "network.tls",
            "cert and key go together",
        ),
        (Network(tls=CallbackTls(ca=CA)), "network.tls", "without an https callback"),
        (
            Network(callback="https://h.example:443", tls=CallbackTls(ca="ca.pem")),
            "network.tls.ca",
            "absolute",
        ),
        (Network(callback="http://h.example:3128"), "network.callback", "proxy's"),
        (Network(callback="http://h.example"), "network.callback", "name the port"),
        (Network(callback="http://h.example:80/api"), "network.callback", "a path"),
        (Network(callback="http://u@h.example:80"), "network.callback", "userinfo"),
        (Network(callback="ftp://h.example:21"), "network.callback", "http or https"),
        (Network(callback="http://h_x:80"), "network.callback", "neither a DNS name"),
        (Network(mode="managed", allow=["a.example"]), "network.allow", "would not be enforced"),
        (Network(allow=["*"]), "network.allow[0]", "every destination"),
        (Network(allow=["a.example", "localhost:8081"]), "network.allow[1]", "own loopback"),
        (Network(allow=["app.localhost"]), "network.allow[0]", "allow its address"),
        (Network(allow=["127.0.0.1:3128"]), "network.allow[0]", "allow-list proxy's"),
        (
            Network(allow=["127.0.0.1:8080"], callback="http://h.example:8080"),
            "network.allow[0]",
            "forwards to the callback h.example:8080; use another port",
        ),
        (
            Network(allow=["127.0.0.1"], callback="http://127.0.0.2:443"),
            "network.allow[0]",
            "forwards to the callback 127.0.0.2:443",
        ),
        (Network(allow=["a.example"], max_connections=0), "network.max_connections", "1 to"),
        (Network(max_connection_bytes=True), "network.max_connection_bytes", "integer"),
        (Network(max_connection_bytes="4x"), "network.max_connection_bytes", "unknown unit"),
    ],
)
def test_bad_networks_are_refused_naming_the_field(network: Network, field: str, rule: str) -> None:
    error = refused(network)
    assert error.field == field
    assert rule in error.rule


def test_loopback_entries_that_can_work_are_accepted() -> None:
    """Issue 43, item 5: a loopback entry is served at its own address inside the sandbox, so
    only one that would collide there is refused; the callback's own target is no collision."""
    for network in (
        Network(allow=["127.0.0.1:8080"], callback="http://127.0.0.1:8080"),
        Network(allow=["127.0.0.2:3128", "[::1]:8080"], callback="http://h.example:8080"),
        Network(allow=["127.0.0.1:8081"], callback="http://h.example:8080"),
        Network(allow=["localhost.example:443"]),  # a name under another domain
    ):
        check_network_spec(network)


def test_loopback_entries_are_forwarded_at_their_own_address_once() -> None:
    entries = parse_allow_list(
        ["pypi.org:443", "127.0.0.1:8081", "[::1]:9000", "127.0.0.2", "127.0.0.1:8081", "10.0.0.1"]
    )
    assert loopback_forwards(entries) == [
        (1, "127.0.0.1", 8081),
        (2, "::1", 9000),
        (3, "127.0.0.2", 80),
        (3, "127.0.0.2", 443),
    ]
    same = parse_callback("http://127.0.0.1:8081")  # its forwarder already serves that port
    assert loopback_forwards(entries, same)[0] == (2, "::1", 9000)
    assert loopback_forwards(parse_allow_list(["pypi.org", "203.0.113.7:80"])) == []


@pytest.mark.parametrize(
    ("callback", "destination", "expected"),
    [
        ("http://harness.example:8080", Destination("harness.example", 8080), True),
        ("http://harness.example:8080", Destination("127.0.0.1", 8080, True), True),
        ("http://harness.example:8080", Destination("localhost", 8080), True),
        ("http://harness.example:8080", Destination("harness.example", 8081), False),
        ("http://harness.example:8080", Destination("other.example", 8080), False),
        ("http://harness.example:8080", Destination("127.0.0.2", 8080, True), False),
        ("http://harness.example:8080", Destination("::1", 8080, True), False),  # not bound
        ("http://10.1.2.3:8080", Destination("127.0.0.1", 8080, True), True),
        ("http://10.1.2.3:8080", Destination("10.1.2.3", 8080, True), False),  # not inside
        (None, Destination("127.0.0.1", 8080, True), False),
    ],
)
def test_a_proxy_request_means_the_callback_where_the_forwarder_answers(
    callback: str | None, destination: Destination, expected: bool
) -> None:
    """What ``$SBXKIT_ENDPOINT``'s host (or the sandbox's own loopback) dialled directly reaches,
    the proxy serves as the callback too: a client ignoring ``NO_PROXY`` gets the same."""
    terms = None if callback is None else parse_callback(callback)
    assert is_callback_destination(terms, destination) is expected


def test_the_byte_bound_takes_a_size() -> None:
    assert check_network_spec(Network(max_connection_bytes="1.5m")).max_connection_bytes == (
        3 * 512 * 1024
    )


def test_a_callback_keeps_its_name_and_port() -> None:
    assert parse_callback("https://Harness.Example:8443/") == CallbackTerms(
        scheme="https", host="harness.example", port=8443
    )
    assert parse_callback("http://[2001:db8::5]:80") == CallbackTerms(
        scheme="http", host="2001:db8::5", port=80, is_ip=True
    )


def test_production_refuses_routed_networks_but_not_a_governed_one() -> None:
    for network in ("bridge", "managed", Network(mode="managed")):
        with pytest.raises(SpecError, match="refused in production"):
            check_network(network, b"production")
        check_network(network, b"staging")
    check_network(Network(allow=["pypi.org:443"]), b"production")
    check_network("none", b"\xff")  # SBXKIT_ENV decides nothing here


def test_gvisor_refuses_a_governed_or_managed_network() -> None:
    with pytest.raises(SpecError, match="gVisor's own network stack"):
        check_runtime_fit("gvisor", Network(allow=["pypi.org"]), 256)
    with pytest.raises(SpecError, match="managed is refused under gVisor"):
        check_runtime_fit("runsc", "managed", 256)
    check_runtime_fit("gvisor", Network(), 256)  # nothing to govern: plain none


def test_a_spec_and_a_job_line_take_the_table() -> None:
    decoded = spec_from_dict(
        {
            "image": "sbxkit-test/busybox:latest",
            "command": ["true"],
            "limits": {
                "cpus": 1,
                "memory_bytes": 64 * MiB,
                "pids": 8,
                "output_bytes": 9,
                "timeout_s": 1,
            },
            "network": {"allow": ["pypi.org:443"], "callback": "http://localhost:8080"},
        }
    )
    assert decoded.network == Network(allow=["pypi.org:443"], callback="http://localhost:8080")
    with pytest.raises(SpecError) as info:
        spec_from_dict({**msgspec.to_builtins(decoded), "network": {"alow": []}})
    assert info.value.field == "network.alow"
    with pytest.raises(SpecError) as info:
        validate_spec(spec(network=Network(allow=["https://pypi.org"])))
    assert info.value.field == "network.allow[0]"


# --- the body and its owned variables ----------------------------------------------------------

ALLOW = NetworkTerms(mode="none", allow=["pypi.org:443"])
CALLBACK = NetworkTerms(
    mode="none",
    allow=["pypi.org:443"],
    callback=CallbackTerms(scheme="https", host="harness.example", port=8443),
    tls=TlsBundle(ca=b"-----BEGIN CA", cert=b"-----BEGIN C", key=b"-----BEGIN K"),
)
MANAGED = NetworkTerms(
    mode="managed",
    allow=[],
    callback=CallbackTerms(scheme="http", host="127.0.0.1", port=8080, is_ip=True),
    gateway="172.17.0.1",
    network_name="sbxkit-managed",
)


def env_of(body: ContainerCreate) -> dict[str, str]:
    """The variables a body sets (``K=V``); ``unset_of`` has the ones it unsets (``K``)."""
    return dict(item.partition("=")[::2] for item in body.env or [] if "=" in item)


def unset_of(body: ContainerCreate) -> list[str]:
    return [item for item in body.env or [] if "=" not in item]


def test_the_proxy_variables_point_at_the_sandboxes_own_loopback() -> None:
    env = network_env(ALLOW)
    for key in PROXY_KEYS[:-2]:
        assert env[key] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert "SBXKIT_ENDPOINT" not in env


def test_the_callback_keeps_its_name_and_bypasses_the_proxy() -> None:
    env = network_env(CALLBACK)
    assert env["SBXKIT_ENDPOINT"] == "https://harness.example:8443"
    assert env["NO_PROXY"].endswith(",harness.example")
    assert env["SBXKIT_TLS_CA"] == "/run/sbxkit/tls/ca.pem"
    assert env["SBXKIT_TLS_KEY"] == "/run/sbxkit/tls/key.pem"
    ip = msgspec.structs.replace(CALLBACK, callback=MANAGED.callback, tls=None)
    assert network_env(ip)["SBXKIT_ENDPOINT"] == "http://127.0.0.1:8080"
    assert network_env(MANAGED) == {"SBXKIT_ENDPOINT": "http://host.sbxkit.internal:8080"}


def test_owned_variables_are_sbxkits_whatever_the_spec_says() -> None:
    hostile = {
        "HTTPS_PROXY": "http://evil.example:3128",
        "no_proxy": "*",
        "SBXKIT_ENDPOINT": "http://evil.example:1",
        "SBXKIT_TLS_KEY": "/tmp/mine.pem",
        "KEEP": "1",
    }
    body = hardened_body(
        spec(env=hostile, network=Network(allow=["pypi.org:443"])), LEASE, network=ALLOW
    )
    env = env_of(body)
    assert env["HTTPS_PROXY"] == "http://127.0.0.1:3128"
    assert env["no_proxy"] == "localhost,127.0.0.1,::1"
    assert "SBXKIT_ENDPOINT" not in env
    assert "SBXKIT_TLS_KEY" not in env
    assert env["KEEP"] == "1"
    # without a governed network the proxy variables are the user's; the callback's never
    plain = env_of(hardened_body(spec(env=hostile), LEASE))
    assert plain["HTTPS_PROXY"] == "http://evil.example:3128"
    assert "SBXKIT_ENDPOINT" not in plain
    assert "SBXKIT_TLS_KEY" not in plain


CALLBACK_KEYS = ["SBXKIT_ENDPOINT", "SBXKIT_TLS_CA", "SBXKIT_TLS_CERT", "SBXKIT_TLS_KEY"]


def test_an_owned_key_sbxkit_does_not_set_is_unset_over_the_image() -> None:
    """Issue 38, finding 7: an image's ``ENV SBXKIT_ENDPOINT`` reached the payload. Each owned
    key sbxkit does not set is listed bare after the rest (Docker drops the image's value),
    or empty for Podman (which would look a bare key up in its own environment)."""
    plain = hardened_body(spec(), LEASE)
    assert unset_of(plain) == CALLBACK_KEYS
    assert (plain.env or [])[-4:] == CALLBACK_KEYS  # after every value: nothing sets them again
    podman = hardened_body(spec(), LEASE, podman=True)
    assert [item for item in podman.env or [] if item.endswith("=")] == [
        f"{key}=" for key in CALLBACK_KEYS
    ]
    assert unset_of(podman) == []
    governed = hardened_body(spec(network=Network(allow=["a"])), LEASE, network=ALLOW)
    assert unset_of(governed) == CALLBACK_KEYS  # the proxy's are set, the callback's unset
    with_callback = hardened_body(spec(network=Network(allow=["a"])), LEASE, network=CALLBACK)
    assert unset_of(with_callback) == []  # every owned key has sbxkit's value
    assert unset_env(MANAGED) == sorted([*PROXY_KEYS, *CALLBACK_KEYS[1:]])
    assert unset_env(None) == CALLBACK_KEYS


def test_the_recheck_wants_each_owned_key_once_and_unset_if_not_sbxkits() -> None:
    body = hardened_body(spec(), LEASE)
    assert recheck(body, None) is None
    assert recheck(hardened_body(spec(), LEASE, podman=True), None) is None
    for tampered in (
        [e for e in body.env or [] if e != "SBXKIT_ENDPOINT"],  # the image's value would pass
        [*(body.env or []), "SBXKIT_ENDPOINT"],  # twice
        ["SBXKIT_ENDPOINT=http://x:1", *(body.env or [])],  # first of two: Docker keeps both
    ):
        refusal = recheck(msgspec.structs.replace(body, env=tampered), None)
        assert refusal.field == "Config.Env", tampered
    governed = hardened_body(spec(network=Network(allow=["a"])), LEASE, network=ALLOW)
    doubled = ["HTTPS_PROXY=http://evil:1", *(governed.env or [])]
    assert recheck(msgspec.structs.replace(governed, env=doubled), ALLOW).field == "Config.Env"


def test_a_governed_body_stays_none_and_a_managed_one_joins_the_network() -> None:
    governed = hardened_body(spec(network=Network(allow=["pypi.org"])), LEASE, network=CALLBACK)
    assert governed.host_config is not None
    assert governed.host_config.network_mode == "none"
    # a named callback needs Docker's own /etc/hosts (the governor maps the name there)
    assert governed.network_disabled is False
    plain = hardened_body(spec(network=Network(allow=["pypi.org"])), LEASE, network=ALLOW)
    assert plain.network_disabled is True
    assert governed.host_config.extra_hosts is None
    assert governed.host_config.tmpfs is not None
    assert governed.host_config.tmpfs["/run/sbxkit"] == TLS_TMPFS["/run/sbxkit"]
    managed = hardened_body(spec(network="managed"), LEASE, network=MANAGED)
    assert managed.host_config is not None
    assert managed.host_config.network_mode == "sbxkit-managed"
    assert managed.network_disabled is False
    assert managed.host_config.extra_hosts == [
        "host.docker.internal:172.17.0.1",
        "host.sbxkit.internal:172.17.0.1",
    ]
    desktop = msgspec.structs.replace(MANAGED, gateway=None)
    body = hardened_body(spec(network="managed"), LEASE, network=desktop)
    assert body.host_config is not None
    assert body.host_config.extra_hosts == [
        "host.docker.internal:host-gateway",
        "host.sbxkit.internal:host-gateway",
    ]
    with pytest.raises(SpecError, match="resolved before the body"):
        hardened_body(spec(network="managed"), LEASE)


# --- the supervisor's re-check -----------------------------------------------------------------


def recheck(body: ContainerCreate, network: NetworkTerms | None, env: bytes | None = None) -> Any:
    return recheck_body(body, lease=LEASE, state_dir="/var/lib/x", environment=env, network=network)


def test_governed_and_managed_bodies_pass_the_recheck() -> None:
    for terms, network in ((ALLOW, Network(allow=["a"])), (CALLBACK, Network(allow=["a"]))):
        assert recheck(hardened_body(spec(network=network), LEASE, network=terms), terms) is None
    managed = hardened_body(spec(network="managed"), LEASE, network=MANAGED)
    assert recheck(managed, MANAGED) is None
    refusal = recheck(managed, MANAGED, b"production")
    assert refusal.field == "HostConfig.NetworkMode"
    assert "production" in refusal.reason


def test_a_body_pointing_the_proxy_elsewhere_is_refused() -> None:
    body = hardened_body(spec(network=Network(allow=["a"])), LEASE, network=ALLOW)
    env = [
        e if not e.startswith("HTTPS_PROXY=") else "HTTPS_PROXY=http://evil:1"
        for e in body.env or []
    ]
    assert recheck(msgspec.structs.replace(body, env=env), ALLOW).field == "Config.Env"
    without = [e for e in body.env or [] if not e.startswith("no_proxy=")]
    assert recheck(msgspec.structs.replace(body, env=without), ALLOW).field == "Config.Env"
    # the same body registered without its terms: the variables are then no one's
    assert recheck(hardened_body(spec(), LEASE), None) is None
    endpoint = [*(hardened_body(spec(), LEASE).env or []), "SBXKIT_ENDPOINT=http://x:1"]
    assert (
        recheck(msgspec.structs.replace(hardened_body(spec(), LEASE), env=endpoint), None).field
        == "Config.Env"
    )


def test_network_fields_must_match_the_registered_terms() -> None:
    managed = hardened_body(spec(network="managed"), LEASE, network=MANAGED)
    assert recheck(managed, None).field == "HostConfig.NetworkMode"
    body = hardened_body(spec(network=Network(allow=["a"])), LEASE, network=ALLOW)
    assert body.host_config is not None
    assert body.host_config.tmpfs is not None
    host = msgspec.structs.replace(body.host_config, tmpfs={**body.host_config.tmpfs, **TLS_TMPFS})
    assert recheck(msgspec.structs.replace(body, host_config=host), ALLOW).field.startswith(
        "HostConfig.Tmpfs"
    )
    bad = msgspec.structs.replace(ALLOW, gateway="0.0.0.0")
    assert recheck(body, bad).field == "network.gateway"
    bad = msgspec.structs.replace(ALLOW, allow=["*"])
    assert recheck(body, bad).field == "network.allow[0]"
    bad = msgspec.structs.replace(ALLOW, audit_log="relative.log")
    assert recheck(body, bad).field == "network.audit_log"


def test_a_pools_shape_includes_its_allow_list() -> None:
    def claim(allow: list[str]) -> Claim:
        terms = msgspec.structs.replace(ALLOW, allow=allow)
        body = hardened_body(spec(network=Network(allow=allow)), LEASE, network=terms)
        register = Register(
            lease=LEASE,
            name=f"sbxkit-{LEASE}",
            engine_socket="/run/docker.sock",
            body=body,
            reservation=Reservation(memory_bytes=64 * MiB, nano_cpus=10**9),
            startup_deadline_s=30,
            lifetime_deadline_s=60,
            network=terms,
        )
        return Claim(
            template=register,
            terms=PoolTerms(size=1, idle_ttl_s=9, max_timeout_s=9),
            expected_mounts=[],
        )

    assert shape_key(claim(["a.example:443"])) != shape_key(claim(["b.example:443"]))
    assert shape_key(claim(["a.example:443"])) == shape_key(claim(["a.example:443"]))


# --- refusals by name ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("operating_system", "name", "product"),
    [
        ("Docker Desktop", "docker-desktop", "Docker Desktop"),
        ("Rancher Desktop WSL Distribution", "x", "Rancher Desktop"),
        ("OrbStack", "orbstack", "OrbStack"),
        ("Ubuntu 24.04", "colima", "Colima"),
        ("Ubuntu 24.04", "colima-work", "Colima"),
        ("Ubuntu 24.04", "lima-default", "Lima"),
        ("Debian GNU/Linux 12 (bookworm)", "ci-host", None),
    ],
)
def test_desktop_daemons_are_recognised_from_info(
    operating_system: str, name: str, product: str | None
) -> None:
    assert desktop_kind(operating_system, name) == product


BASE: dict[str, Any] = {
    "operating_system": "Debian GNU/Linux 12",
    "name": "host",
    "kernel_version": "6.1.0",
    "security_options": ["name=seccomp,profile=default"],
    "local_kernel": "6.1.0",
    "podman": False,
    "can_enter": True,
}


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        ({"operating_system": "Docker Desktop"}, "refused on Docker Desktop"),
        ({"kernel_version": "5.15.0-linuxkit"}, "a remote or VM-backed daemon"),
        ({"security_options": ["name=rootless"]}, "rootless daemon"),
        ({"podman": True}, "refused on Podman"),
        ({"can_enter": False}, "needs CAP_SYS_ADMIN"),
    ],
)
def test_where_the_governed_path_cannot_work_it_is_refused_by_name(
    change: dict[str, Any], rule: str
) -> None:
    assert governed_refusal(**BASE) is None
    refusal = governed_refusal(**{**BASE, **change})
    assert refusal is not None
    assert refusal.field == "network"
    assert rule in refusal.rule


def test_capabilities_and_the_sandboxes_process_are_judged_from_proc() -> None:
    assert can_enter_namespaces("Name:\tx\nCapEff:\t000001ffffffffff\n")
    assert not can_enter_namespaces("CapEff:\t0000000000000000\n")
    assert not can_enter_namespaces("Name: x\n")
    assert process_problem("abc", "0::/docker/abc\n", 2, 1) is None
    assert "remote or VM-backed" in (process_problem("abc", "0::/init.scope\n", 2, 1) or "")
    assert "shares this host's network" in (process_problem("abc", "/docker/abc", 1, 1) or "")


# --- the gate and the decisions ----------------------------------------------------------------


def test_the_gate_execs_the_command_as_argv_after_one_line() -> None:
    assert gate_command(["python3", "-c", "x"]) == [
        "sh",
        "-c",
        'IFS= read -r _ && exec "$0" "$@"',
        "python3",
        "-c",
        "x",
    ]
    with pytest.raises(SpecError) as info:
        gate_command(["-weird"])
    assert info.value.field == "command[0]"


async def test_the_gate_line_comes_before_the_runs_stdin() -> None:
    send, receive = trio.testing.memory_stream_pair()
    await send.send_all(b"payload")
    await send.aclose()
    stream = Prefixed(GATE_LINE, receive)
    got = b""
    while chunk := await stream.receive_some(3):
        got += chunk
    assert got == b"\npayload"
    bytes_first = Prefixed(GATE_LINE, b"abc")
    assert await bytes_first.receive_some() == b"\nabc"
    assert await bytes_first.receive_some() == b""


def test_denials_are_capped_and_decisions_are_one_line_each() -> None:
    denials = Denials(limit=2)
    for index in range(5):
        denials.add(Denial(destination=f"d{index}:443", reason="no"))
    assert [d.destination for d in denials.kept] == ["d0:443", "d1:443"]
    assert denials.dropped == 3
    line = encode_decision(
        Decision(
            time=1.0, sandbox=LEASE, destination="a:1", verdict="denied", kind="http", reason="no"
        )
    )
    assert line.endswith(b"\n")
    assert line.count(b"\n") == 1
    assert msgspec.json.decode(line)["verdict"] == "denied"


# --- a governed lease re-adopted after its supervisor died -------------------------------------


def test_an_adopts_terms_must_be_a_governed_leases_and_parse() -> None:
    assert terms_problem(ALLOW, governed=True) is None
    assert terms_problem(CALLBACK, governed=True) is None
    assert terms_problem(None, governed=True) is None  # re-adopted closed (a resumed run)
    assert terms_problem(None, governed=False) is None
    assert "registered no governed network" in (terms_problem(ALLOW, governed=False) or "")
    bad = msgspec.structs.replace(ALLOW, allow=["*"])
    assert "network.allow[0]" in (terms_problem(bad, governed=True) or "")
    bad = msgspec.structs.replace(ALLOW, audit_log="relative.log")
    assert "absolute path" in (terms_problem(bad, governed=True) or "")
    bad = msgspec.structs.replace(ALLOW, gateway="172.17.0.1")
    assert "gateway" in (terms_problem(bad, governed=True) or "")
