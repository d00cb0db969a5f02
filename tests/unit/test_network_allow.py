"""The allow-list grammar and its one question, and the names every network rule shares.

Pure. Every refusal names ``network.allow[i]`` and says why; matching is on names, with a
wildcard never matching its apex, ports exact (80 and 443 without one), and an address entry
matching only that address.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sbxkit._model.network_allow import (
    DEFAULT_PORTS,
    MAX_ENTRIES,
    AllowEntry,
    entry_text,
    matching_entry,
    parse_allow,
    parse_allow_list,
)
from sbxkit._model.network_names import (
    Destination,
    destination_text,
    normalize_name,
    parse_host,
    parse_ip,
    split_host_port,
)
from sbxkit.errors import SpecError


@pytest.mark.parametrize(
    ("text", "entry"),
    [
        ("pypi.org:443", AllowEntry(kind="name", host="pypi.org", ports=(443,))),
        ("PyPI.org.", AllowEntry(kind="name", host="pypi.org", ports=DEFAULT_PORTS)),
        ("*.pythonhosted.org:443", AllowEntry("suffix", "pythonhosted.org", (443,))),
        ("203.0.113.7:8443", AllowEntry(kind="ip", host="203.0.113.7", ports=(8443,))),
        ("[2001:db8::7]:443", AllowEntry(kind="ip", host="2001:db8::7", ports=(443,))),
        ("2001:db8::7", AllowEntry(kind="ip", host="2001:db8::7", ports=DEFAULT_PORTS)),
        ("localhost", AllowEntry(kind="name", host="localhost", ports=DEFAULT_PORTS)),
        ("xn--bcher-kva.example:80", AllowEntry("name", "xn--bcher-kva.example", (80,))),
    ],
)
def test_entries_parse_to_their_canonical_meaning(text: str, entry: AllowEntry) -> None:
    assert parse_allow(text, "f") == entry


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("*", "would allow every destination"),
        ("*:443", "would allow every destination"),
        ("https://pypi.org", "has a scheme"),
        ("pypi.org/simple", "has a path"),
        ("user@pypi.org", "has userinfo"),
        ("pypi.org:0", "port must be a number from 1 to 65535"),
        ("pypi.org:65536", "port must be a number from 1 to 65535"),
        ("pypi.org:+443", "port must be a number"),
        ("pypi.org:0443", "port must be a number"),
        ("pypi.org:", "port must be a number"),
        ("a.*.example", "only be the whole first label"),
        ("*example.org", "only be the whole first label"),
        ("*.203.0.113.7", "applies to names"),
        ("bücher.example", "neither a DNS name"),
        ("127.1", "neither a DNS name"),
        ("2130706433", "neither a DNS name"),
        ("0x7f.0.0.1", "neither a DNS name"),
        ("-bad.example", "neither a DNS name"),
        ("bad_label.example", "neither a DNS name"),
        ("a..b", "neither a DNS name"),
        (" pypi.org", "without surrounding whitespace"),
        ("", "without surrounding whitespace"),
        ("[203.0.113.7]:443", "is not HOST[:PORT]"),
        ("2001:db8::7:443x", "is not HOST[:PORT]"),
        ("fe80::1%eth0", "is not HOST[:PORT]"),
    ],
)
def test_bad_entries_are_refused_naming_the_entry(text: str, rule: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_allow_list([text])
    assert info.value.field == "network.allow[0]"
    assert rule in info.value.rule


def test_the_list_itself_is_bounded_and_typed() -> None:
    with pytest.raises(SpecError, match="at most"):
        parse_allow_list(["a.example"] * (MAX_ENTRIES + 1))
    with pytest.raises(SpecError, match="list of strings"):
        parse_allow_list("pypi.org")
    with pytest.raises(SpecError) as info:
        parse_allow_list(["ok.example", 443])
    assert info.value.field == "network.allow[1]"


def entries(*texts: str) -> tuple[AllowEntry, ...]:
    return parse_allow_list(list(texts))


def name(host: str, port: int) -> Destination:
    return Destination(host, port, False)


def test_a_wildcard_matches_names_under_it_but_not_its_apex() -> None:
    rules = entries("*.pythonhosted.org:443")
    assert matching_entry(rules, name("files.pythonhosted.org", 443)) is not None
    assert matching_entry(rules, name("a.b.pythonhosted.org", 443)) is not None
    assert matching_entry(rules, name("pythonhosted.org", 443)) is None
    assert matching_entry(rules, name("evilpythonhosted.org", 443)) is None
    assert matching_entry(rules, name("pythonhosted.org.evil.example", 443)) is None


def test_ports_are_exact_and_default_to_the_webs_two() -> None:
    rules = entries("pypi.org", "api.example:8443")
    assert matching_entry(rules, name("pypi.org", 443)) is not None
    assert matching_entry(rules, name("pypi.org", 80)) is not None
    assert matching_entry(rules, name("pypi.org", 22)) is None
    assert matching_entry(rules, name("api.example", 8443)) is not None
    assert matching_entry(rules, name("api.example", 443)) is None


def test_an_address_entry_matches_that_address_only_and_never_a_name() -> None:
    rules = entries("203.0.113.7:443", "pypi.org:443")
    assert matching_entry(rules, Destination("203.0.113.7", 443, True)) is not None
    assert matching_entry(rules, Destination("203.0.113.8", 443, True)) is None
    # a name that happens to be spelled like a rule's address is no address
    assert matching_entry(rules, name("pypi.org", 443)) is not None
    assert matching_entry(entries("pypi.org:443"), Destination("151.101.0.223", 443, True)) is None


@given(st.lists(st.sampled_from(["pypi.org", "*.example.org:8080", "[2001:db8::1]:443"])))
def test_canonical_text_parses_back_to_the_same_entry(texts: list[str]) -> None:
    for entry in parse_allow_list(texts):
        assert parse_allow(entry_text(entry), "f") == entry


LABEL = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)


@given(st.lists(LABEL, min_size=1, max_size=4), LABEL, st.integers(1, 65535))
def test_a_suffix_entry_matches_exactly_the_names_that_end_in_dot_suffix(
    left: list[str], apex: str, port: int
) -> None:
    suffix = f"{apex}.example"
    candidate = ".".join([*left, suffix])
    rules = entries(f"*.{suffix}:{port}")
    assert (matching_entry(rules, name(candidate, port)) is not None) == candidate.endswith(
        "." + suffix
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Example.COM.", "example.com"),
        ("a" * 63 + ".example", "a" * 63 + ".example"),
        ("a" * 64 + ".example", None),
        (".".join(["a" * 50] * 5), None),  # over 253 bytes
        ("example.123", None),
        ("", None),
        (".", None),
        ("exa mple.com", None),
    ],
)
def test_names_are_normalised_or_refused(text: str, expected: str | None) -> None:
    assert normalize_name(text) == expected


def test_ip_literals_are_strict_and_split_host_port_knows_brackets() -> None:
    assert parse_ip("010.0.0.1") is None  # leading zeros are an old octal trick
    assert parse_ip("::ffff:127.0.0.1") is not None
    assert parse_host("[::1]") is None
    assert split_host_port("[::1]:80") == ("::1", "80")
    assert split_host_port("::1") == ("::1", None)
    assert split_host_port("[::1]x") is None
    assert destination_text(Destination("2001:db8::1", 443, True)) == "[2001:db8::1]:443"
