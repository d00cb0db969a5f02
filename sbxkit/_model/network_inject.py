"""Credential injection: the rules by which the proxy adds a header on the way out.

Pure. A rule in the network table (spec, profile, ``--inject``)::

    inject = [{host = "api.example.com", header = "Authorization", value_from = "env:API_TOKEN"}]

names one destination host (exactly; it must be on the allow-list), one header, and where the
header's value comes from on the *host*: ``env:NAME`` (a variable of the process that plans
the sandbox) or ``file:/abs/path`` (a file only its owner may read and write, 0600). A literal
value is refused: a profile is a file people share and commit. ``ca_file`` names the CA the
upstream's certificate must chain to (default: the host's trust store).

``check_inject`` validates the rules before any container exists; ``InjectTerms`` is what the
proxying owner carries (the value, read by the planner, never written into the sandbox, the
create body, the journal or the audit log — its ``repr`` hides it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from sbxkit._model.network_allow import AllowEntry, matching_entry, parse_allow_list
from sbxkit._model.network_names import Destination, parse_host
from sbxkit._model.predicates import has_control
from sbxkit.errors import SpecError

__all__ = [
    "BROKER_CA",
    "BROKER_DIR",
    "BROKER_KEYS",
    "InjectRule",
    "InjectTerms",
    "check_inject",
    "check_inject_value",
    "inject_env",
    "inject_terms_problem",
    "parse_inject_flag",
    "parse_value_from",
]

MAX_RULES = 64
MAX_VALUE_BYTES = 8 * 1024
BROKER_DIR = "/run/sbxkit/broker"
"""Beside the callback's TLS bundle, in the same root-owned tmpfs: the sandbox's broker CA
(certificate only) and the trust bundle that adds it to the host's."""
BROKER_CA = f"{BROKER_DIR}/ca.pem"
BROKER_BUNDLE = f"{BROKER_DIR}/bundle.pem"
BROKER_KEYS = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")
"""Owned when a sandbox has inject rules: the variables by which the usual clients trust the
sandbox's broker CA (OpenSSL, requests, curl, Node)."""

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFUSED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
        "expect",
    }
)
"""Headers that frame or route the message: setting one would change what the upstream reads,
not who is asking."""


class InjectRule(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """One rule as written (``network.inject[i]``)."""

    host: str
    header: str
    value_from: str | None = None
    """``env:NAME`` or ``file:/abs/path``, read on the host."""
    value: str | None = None
    """Never accepted: here only to refuse a literal by name."""
    ca_file: str | None = None
    """The CA (PEM, host path) the upstream's certificate must chain to; default: the host's
    trust store."""


class InjectTerms(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """A checked rule with its value, as the proxying owner carries it (kept in its memory)."""

    host: str
    is_ip: bool
    header: str
    value: str
    ca: bytes | None = None
    """The upstream CA's PEM, or None for the host's trust store."""

    def __repr__(self) -> str:  # the value never reaches a log line or a traceback
        return f"InjectTerms(host={self.host!r}, header={self.header!r}, value=<hidden>)"

    @property
    def label(self) -> str:
        """What the audit log records: the rule's host and header name, never the value."""
        return f"{self.host} {self.header}"


def parse_value_from(text: object, field: str) -> tuple[str, str]:
    """``("env", NAME)`` or ``("file", PATH)``, or a SpecError naming ``field``."""
    if not isinstance(text, str) or not text:
        raise SpecError(field, "must be env:NAME (a host variable) or file:/PATH (a 0600 file)")
    kind, sep, rest = text.partition(":")
    if sep and kind == "env":
        if not _ENV_NAME.fullmatch(rest):
            raise SpecError(field, f"{text!r}: env: takes a variable name ([A-Za-z_][A-Za-z0-9_]*)")
        return "env", rest
    if sep and kind == "file":
        if not rest.startswith("/") or has_control(rest) or ".." in rest.split("/"):
            raise SpecError(
                field, f"{text!r}: file: takes an absolute host path without '..' or controls"
            )
        return "file", rest
    raise SpecError(
        field,
        "must be env:NAME or file:/PATH; a literal value is refused (the value is read on the "
        "host when the sandbox is planned, never written in a spec or profile)",
    )


def _allowed(entries: Sequence[AllowEntry], host: str, is_ip: bool) -> bool:
    """Whether some entry allows ``host`` at one of the ports the entries name."""
    ports = {port for entry in entries for port in entry.ports}
    return any(
        matching_entry(entries, Destination(host, port, is_ip)) is not None for port in ports
    )


def check_inject(
    rules: Sequence[InjectRule], entries: Sequence[AllowEntry], managed: bool = False
) -> list[tuple[InjectRule, str, bool, tuple[str, str]]]:
    """Each rule checked: ``(rule, host, is_ip, (kind, source))``, or a SpecError naming
    ``network.inject[i]`` and the rule it breaks. Nothing is read here."""
    if rules and managed:
        raise SpecError(
            "network.inject", "a managed network routes around the proxy; use mode = 'none'"
        )
    if len(rules) > MAX_RULES:
        raise SpecError("network.inject", f"at most {MAX_RULES} rules")
    checked: list[tuple[InjectRule, str, bool, tuple[str, str]]] = []
    seen: set[tuple[str, str]] = set()
    for index, rule in enumerate(rules):
        field = f"network.inject[{index}]"
        if rule.value is not None:
            raise SpecError(
                f"{field}.value",
                "a literal value is refused: name where the host reads it (value_from = "
                "'env:NAME' or 'file:/PATH', a 0600 file)",
            )
        if rule.value_from is None:
            raise SpecError(f"{field}.value_from", "is required (env:NAME or file:/PATH)")
        parsed = parse_host(rule.host) if isinstance(rule.host, str) else None
        if parsed is None or rule.host.startswith("*"):
            raise SpecError(
                f"{field}.host",
                f"{rule.host!r}: one host exactly, a DNS name or an IP literal (no wildcard, "
                "port or scheme): a rule names the one service its secret is for",
            )
        host, is_ip = parsed
        if not _allowed(entries, host, is_ip):
            raise SpecError(
                f"{field}.host", f"{host!r} is not on the allow-list: add it to network.allow"
            )
        header = rule.header
        if not isinstance(header, str) or not _TOKEN.fullmatch(header):
            raise SpecError(f"{field}.header", f"{header!r} is not an HTTP header name")
        if header.lower() in _REFUSED_HEADERS:
            raise SpecError(
                f"{field}.header",
                f"{header!r} frames or routes the request; an inject rule sets a credential "
                "header (Authorization, X-Api-Key, ...)",
            )
        if (host, header.lower()) in seen:
            raise SpecError(field, f"a second rule for {host} {header}")
        seen.add((host, header.lower()))
        source = parse_value_from(rule.value_from, f"{field}.value_from")
        if rule.ca_file is not None and (
            not isinstance(rule.ca_file, str)
            or not rule.ca_file.startswith("/")
            or has_control(rule.ca_file)
            or ".." in rule.ca_file.split("/")
        ):
            raise SpecError(f"{field}.ca_file", "must be an absolute host path without '..'")
        checked.append((rule, host, is_ip, source))
    return checked


def check_inject_value(value: str, field: str, where: str) -> str:
    """A value read from ``where``, refused when it cannot be one header's value: empty, too
    long, or carrying a line break or a control character (it would split the request)."""
    value = value.removesuffix("\n").removesuffix("\r")
    if not value.strip():
        raise SpecError(field, f"{where} is empty")
    if len(value.encode("utf-8", "replace")) > MAX_VALUE_BYTES:
        raise SpecError(field, f"{where} holds more than {MAX_VALUE_BYTES} bytes")
    if has_control(value) or not value.isascii():
        raise SpecError(
            field, f"{where} holds a control or non-ASCII character: not one header value"
        )
    return value


def inject_terms_problem(
    inject: Sequence[InjectTerms], allow: Sequence[str], mode: str
) -> str | None:
    """Why registered inject terms cannot be carried out (the supervisor's re-check, pure)."""
    if inject and mode != "none":
        return ": inject rules need a governed network (mode none)"
    entries = parse_allow_list(list(allow), "network.allow")
    for index, rule in enumerate(inject):
        parsed = parse_host(rule.host)
        if parsed != (rule.host, rule.is_ip):
            return f"[{index}]: {rule.host!r} is not a canonical host"
        if not _allowed(entries, rule.host, rule.is_ip):
            return f"[{index}]: {rule.host!r} is not on the allow-list"
        if not _TOKEN.fullmatch(rule.header) or rule.header.lower() in _REFUSED_HEADERS:
            return f"[{index}]: {rule.header!r} is not a header an inject rule may set"
        try:
            check_inject_value(rule.value, "value", "the value")
        except SpecError:
            return f"[{index}]: the value is not one header value"
    return None


def parse_inject_flag(text: str) -> InjectRule:
    """``--inject HOST:HEADER=env:NAME`` (or ``=file:/PATH``)."""
    field = "--inject"
    head, sep, source = text.partition("=")
    host, colon, header = head.rpartition(":")
    if not sep or not colon or not host or not header:
        raise SpecError(field, f"{text!r}: write HOST:HEADER=env:NAME or HOST:HEADER=file:/PATH")
    parse_value_from(source, field)
    return InjectRule(host=host, header=header, value_from=source)


def inject_env(terms: Sequence[InjectTerms]) -> dict[str, str]:
    """The variables that make the usual clients trust the sandbox's broker CA."""
    if not terms:
        return {}
    return {
        "SSL_CERT_FILE": BROKER_BUNDLE,
        "REQUESTS_CA_BUNDLE": BROKER_BUNDLE,
        "CURL_CA_BUNDLE": BROKER_BUNDLE,
        "NODE_EXTRA_CA_CERTS": BROKER_CA,  # Node adds these to its own store
    }
