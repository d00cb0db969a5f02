"""The egress allow-list: its grammar and the one question it answers.

Pure. An entry is ``HOST[:PORT]``:

- ``pypi.org:443`` — that name, that port;
- ``*.pythonhosted.org:443`` — any name *under* ``pythonhosted.org`` (at least one more
  label; the apex itself is not matched: list it too if it is wanted);
- ``203.0.113.7:8443`` or ``[2001:db8::7]:443`` — that literal address (the one way to reach
  a private, loopback or link-local address: sbxkit refuses those as the result of a name);
- without a port, the web's two ports: 80 and 443.

A bare ``*``, a wildcard anywhere but the first label, a scheme, a path, userinfo or a
non-ASCII name is refused naming the entry. Matching is on the name the client asked for,
before anything is resolved: a name no entry matches is never looked up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from sbxkit._model.network_names import Destination, parse_host, parse_port, split_host_port
from sbxkit.errors import SpecError

__all__ = [
    "DEFAULT_PORTS",
    "MAX_ENTRIES",
    "AllowEntry",
    "entry_text",
    "matching_entry",
    "parse_allow",
    "parse_allow_list",
]

DEFAULT_PORTS = (80, 443)
MAX_ENTRIES = 256
"""An allow-list is a short list of services; more than this is a mistake (or a bridge)."""

EntryKind = Literal["name", "suffix", "ip"]


class AllowEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One parsed entry: ``host`` is a normalised name, the suffix after ``*.``, or an IP."""

    kind: EntryKind
    host: str
    ports: tuple[int, ...]


_GRAMMAR = "HOST[:PORT], *.DOMAIN[:PORT], IPv4[:PORT] or [IPv6][:PORT]"


def parse_allow(text: object, field: str) -> AllowEntry:
    """One entry, or a SpecError naming ``field`` and the rule it breaks."""
    if not isinstance(text, str):
        raise SpecError(field, f"must be a string ({_GRAMMAR})")
    if not text or text != text.strip():
        raise SpecError(field, f"must be {_GRAMMAR} without surrounding whitespace")
    for bad, why in (
        ("://", "a scheme"),
        ("/", "a path"),
        ("@", "userinfo"),
        ("?", "a query"),
        ("#", "a fragment"),
    ):
        if bad in text:
            raise SpecError(field, f"{text!r} has {why}; write {_GRAMMAR}")
    if text == "*" or text.startswith("*:"):
        raise SpecError(
            field, "'*' would allow every destination: that is network = 'bridge', not a list"
        )
    split = split_host_port(text)
    if split is None:
        raise SpecError(field, f"{text!r} is not {_GRAMMAR}")
    host_text, port_text = split
    ports: tuple[int, ...] = DEFAULT_PORTS
    if port_text is not None:
        port = parse_port(port_text)
        if port is None:
            raise SpecError(field, f"{text!r}: the port must be a number from 1 to 65535")
        ports = (port,)
    kind: EntryKind = "name"
    if host_text.startswith("*."):
        kind, host_text = "suffix", host_text[2:]
    if "*" in host_text:
        raise SpecError(field, f"{text!r}: a wildcard may only be the whole first label ('*.')")
    parsed = parse_host(host_text)
    if parsed is None:
        raise SpecError(
            field,
            f"{text!r}: {host_text!r} is neither a DNS name (ASCII labels of a-z, 0-9 and '-'; "
            "the last not all digits; IDN names in their xn-- form) nor an IP literal",
        )
    host, is_ip = parsed
    if is_ip:
        if kind == "suffix":
            raise SpecError(field, f"{text!r}: a wildcard applies to names, not addresses")
        kind = "ip"
    return AllowEntry(kind=kind, host=host, ports=ports)


def parse_allow_list(items: object, field: str = "network.allow") -> tuple[AllowEntry, ...]:
    """Every entry of a list, each refusal naming ``field[i]``."""
    if not isinstance(items, list | tuple):
        raise SpecError(field, "must be a list of strings")
    if len(items) > MAX_ENTRIES:
        raise SpecError(field, f"at most {MAX_ENTRIES} entries")
    return tuple(parse_allow(item, f"{field}[{index}]") for index, item in enumerate(items))


def entry_text(entry: AllowEntry) -> str:
    """The entry as one canonical string (what a decision names as the rule that allowed it)."""
    host = entry.host
    if entry.kind == "suffix":
        host = "*." + host
    elif entry.kind == "ip" and ":" in host:
        host = f"[{host}]"
    if entry.ports == DEFAULT_PORTS:
        return host
    return f"{host}:{entry.ports[0]}"


def _host_matches(entry: AllowEntry, destination: Destination) -> bool:
    if entry.kind == "ip":
        return destination.is_ip and destination.host == entry.host
    if destination.is_ip:
        return False
    if entry.kind == "name":
        return destination.host == entry.host
    return destination.host.endswith("." + entry.host)


def matching_entry(entries: Sequence[AllowEntry], destination: Destination) -> AllowEntry | None:
    """The first entry that allows ``destination``, or None (the answer is then no)."""
    for entry in entries:
        if destination.port in entry.ports and _host_matches(entry, destination):
            return entry
    return None
