"""Credential injection's rules (issue 45): parsed and refused before any container exists,
read on the host at plan time (a 0600 file, a variable), never a literal; the variables that
trust the broker's CA owned; the CA and its leaves as the proxy makes them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sbxkit._grammar.profile import profile_from_dict
from sbxkit._model.network_allow import parse_allow_list
from sbxkit._model.network_inject import (
    BROKER_KEYS,
    InjectRule,
    InjectTerms,
    check_inject,
    inject_terms_problem,
    parse_inject_flag,
)
from sbxkit._model.network_terms import (
    BROKER_TMPFS,
    Network,
    NetworkTerms,
    network_env,
    owned_keys,
    spec_owned_keys,
    unset_env,
)
from sbxkit._plan.network_planning import plan_inject
from sbxkit.errors import SpecError
from sbxkit.network.broker import Broker, inject_headers, trust_bundle

API = "api.example.com"


def rule(**fields: Any) -> InjectRule:
    base: dict[str, Any] = {"host": API, "header": "Authorization", "value_from": "env:API_TOKEN"}
    return InjectRule(**(base | fields))


def refusal(rules: list[InjectRule], allow: tuple[str, ...] = (API,), managed: bool = False) -> str:
    with pytest.raises(SpecError) as info:
        check_inject(rules, parse_allow_list(list(allow)), managed=managed)
    return f"{info.value.field}: {info.value.rule}"


def test_a_rule_names_one_allowed_host_a_header_and_where_the_host_reads_the_value() -> None:
    checked = check_inject(
        [rule(), rule(host="203.0.113.7", header="X-Api-Key", value_from="file:/etc/key")],
        parse_allow_list([API, "203.0.113.7:8443"]),
    )
    assert [(host, is_ip, source) for _, host, is_ip, source in checked] == [
        (API, False, ("env", "API_TOKEN")),
        ("203.0.113.7", True, ("file", "/etc/key")),
    ]


@pytest.mark.parametrize(
    ("fields", "allow", "expected"),
    [
        ({"value": "Bearer abc"}, (API,), "network.inject[0].value: a literal value is refused"),
        ({"value_from": "Bearer abc"}, (API,), "a literal value is refused"),
        ({"value_from": None}, (API,), "network.inject[0].value_from: is required"),
        ({"value_from": "env:1BAD"}, (API,), "env: takes a variable name"),
        ({"value_from": "file:relative"}, (API,), "file: takes an absolute host path"),
        ({"value_from": "file:/a/../b"}, (API,), "without '..'"),
        ({"host": "*.example.com"}, ("*.example.com",), "no wildcard"),
        ({"host": "api.example.com:443"}, (API,), "network.inject[0].host"),
        ({"host": "other.example.com"}, (API,), "'other.example.com' is not on the allow-list"),
        ({"header": "Host"}, (API,), "'Host' frames or routes the request"),
        ({"header": "content-length"}, (API,), "frames or routes"),
        ({"header": "Bad Header"}, (API,), "is not an HTTP header name"),
        ({"ca_file": "ca.pem"}, (API,), "network.inject[0].ca_file: must be an absolute"),
    ],
)
def test_a_bad_rule_is_refused_naming_the_field_and_the_rule(
    fields: dict[str, Any], allow: tuple[str, ...], expected: str
) -> None:
    assert expected in refusal([rule(**fields)], allow)


def test_two_rules_for_one_header_and_a_managed_network_are_refused() -> None:
    assert "network.inject[1]: a second rule" in refusal([rule(), rule(header="authorization")])
    assert "a managed network routes around the proxy" in refusal([rule()], (), managed=True)


def test_a_profile_with_a_literal_value_is_refused_before_anything_exists() -> None:
    profile = {
        "sandbox": {
            "docker": {
                "image": "busybox",
                "network": {
                    "allow": [API],
                    "inject": [{"host": API, "header": "Authorization", "value": "Bearer x"}],
                },
            }
        }
    }
    with pytest.raises(SpecError) as info:
        profile_from_dict(profile)
    assert info.value.field == "sandbox.docker.network.inject[0].value"
    assert info.value.rule.startswith("a literal value is refused")


def test_the_command_line_flag_reads_host_header_and_source() -> None:
    assert parse_inject_flag(f"{API}:X-Api-Key=file:/run/key") == InjectRule(
        host=API, header="X-Api-Key", value_from="file:/run/key"
    )
    for bad in (f"{API}=env:X", f"{API}:Authorization", f"{API}:Authorization=Bearer x"):
        with pytest.raises(SpecError) as info:
            parse_inject_flag(bad)
        assert info.value.field == "--inject"


def inject_network(value_from: str) -> Network:
    return Network(allow=[API], inject=[rule(value_from=value_from)])


def test_plan_reads_a_variable_of_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("API_TOKEN", "Bearer s3cret\n")
    (terms,) = plan_inject(inject_network("env:API_TOKEN"))
    assert (terms.host, terms.header, terms.value) == (API, "Authorization", "Bearer s3cret")
    assert "s3cret" not in repr(terms)
    monkeypatch.delenv("API_TOKEN")
    with pytest.raises(SpecError) as info:
        plan_inject(inject_network("env:API_TOKEN"))
    assert info.value.field == "network.inject[0].value_from"
    assert "env:API_TOKEN: no such variable" in info.value.rule


def test_plan_reads_only_a_0600_regular_file(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("Bearer s3cret\n")
    secret.chmod(0o600)
    (terms,) = plan_inject(inject_network(f"file:{secret}"))
    assert terms.value == "Bearer s3cret"
    for mode in (0o644, 0o640, 0o400):
        secret.chmod(mode)
        with pytest.raises(SpecError) as info:
            plan_inject(inject_network(f"file:{secret}"))
        assert f"has mode {mode:04o}; a secret file must be 0600" in info.value.rule
    secret.chmod(0o600)
    link = tmp_path / "link"
    link.symlink_to(secret)
    with pytest.raises(SpecError) as info:
        plan_inject(inject_network(f"file:{link}"))
    assert "cannot open it" in info.value.rule
    secret.write_text("Bearer a\r\nX-Evil: 1\n")
    with pytest.raises(SpecError) as info:
        plan_inject(inject_network(f"file:{secret}"))
    assert "not one header value" in info.value.rule


def test_without_cryptography_a_rule_is_refused_by_name() -> None:
    program = (
        "import sys; sys.modules['cryptography'] = None\n"
        "import os; os.environ['API_TOKEN'] = 'x'\n"
        "from sbxkit._model.network_terms import Network\n"
        "from sbxkit._model.network_inject import InjectRule\n"
        "from sbxkit._plan.network_planning import plan_inject\n"
        "from sbxkit.errors import SpecError\n"
        "rule = InjectRule(host='a.example', header='X-K', value_from='env:API_TOKEN')\n"
        "try:\n"
        "    plan_inject(Network(allow=['a.example'], inject=[rule]))\n"
        "except SpecError as error:\n"
        "    print(error.field, '|', error.rule)\n"
    )
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("network.inject | credential injection needs the 'cryptography'")
    assert "[broker]" in proc.stdout


def terms(inject: list[InjectTerms]) -> NetworkTerms:
    return NetworkTerms(mode="none", allow=[API], inject=inject)


SECRET = InjectTerms(host=API, is_ip=False, header="Authorization", value="Bearer s3cret")


def test_the_trust_variables_are_owned_only_with_rules() -> None:
    env = network_env(terms([SECRET]))
    assert env["SSL_CERT_FILE"] == "/run/sbxkit/broker/bundle.pem"
    assert env["NODE_EXTRA_CA_CERTS"] == "/run/sbxkit/broker/ca.pem"
    assert set(BROKER_KEYS) <= owned_keys(terms([SECRET]))
    assert not set(BROKER_KEYS) & owned_keys(terms([]))  # an image's SSL_CERT_FILE stays
    assert not set(BROKER_KEYS) & set(unset_env(terms([])))
    assert set(BROKER_KEYS) <= spec_owned_keys(Network(allow=[API], inject=[rule()]))
    assert terms([SECRET]).tmpfs == BROKER_TMPFS
    assert "s3cret" not in str(env)


def test_the_supervisor_rechecks_registered_rules() -> None:
    assert inject_terms_problem([SECRET], [API], "none") is None
    assert "not on the allow-list" in (inject_terms_problem([SECRET], ["b.example"], "none") or "")
    host = msgspec.structs.replace(SECRET, header="Host")
    assert "not a header" in (inject_terms_problem([host], [API], "none") or "")
    split = msgspec.structs.replace(SECRET, value="a\r\nX: 1")
    assert "not one header value" in (inject_terms_problem([split], [API], "none") or "")


def test_a_payloads_header_of_that_name_is_replaced_in_any_case() -> None:
    sent = [(b"Host", b"api"), (b"authorization", b"mine"), (b"AUTHORIZATION", b"again")]
    assert inject_headers(sent, SECRET) == [(b"Host", b"api"), (b"Authorization", b"Bearer s3cret")]


def test_the_broker_ca_is_limited_to_the_rules_hosts_and_only_its_certificate_leaves() -> None:
    from cryptography import x509

    broker = Broker("a" * 32, [SECRET])
    assert b"PRIVATE KEY" not in broker.ca_pem
    ca = x509.load_pem_x509_certificate(broker.ca_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    names = ca.extensions.get_extension_for_class(x509.NameConstraints)
    assert names.critical
    assert names.value.permitted_subtrees == [x509.DNSName(API)]
    bundle = trust_bundle(broker.ca_pem)
    assert bundle.endswith(broker.ca_pem)
    assert b"PRIVATE KEY" not in bundle
    assert broker.server_context(API) is broker.server_context(API)  # one leaf per host
    assert broker.rule_for("other.example") is None
