"""Image references checked by the grammar the Docker daemon parses them with.

Docker 20.10 resolves ``Config.Image`` (and ``/images/{name}/json``) with the distribution
reference package's ``ParseAnyReference``: a bare 64-hex image ID or an ``algorithm:hex``
digest is an ID; anything else goes through ``ParseNormalizedNamed``. That splits off a
registry domain only when the first ``/``-separated component contains ``.`` or ``:`` or is
``localhost``; the rest (the repository path) must be lowercase, and the whole
``domain/path[:tag][@digest]`` must match the reference grammar::

    name             := [domain '/'] path-component ('/' path-component)*
    domain           := domain-component ('.' domain-component)* [':' port]
    domain-component := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
    path-component   := [a-z0-9]+ (separator [a-z0-9]+)*
    separator        := [_.] | '__' | '-'+
    tag              := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
    digest           := algorithm ':' hex   (sha256: 64, sha384: 96, sha512: 128 lowercase hex)

and the name (with the default ``docker.io/`` domain and, for a one-component name, the
``library/`` prefix the daemon adds) is at most 255 characters. ``HIDDEN/busybox:1``,
``busybox:``, ``a@b@c`` and ``hidden//busybox:1`` all fail here, as they fail in the daemon.
Pure: a string in, the reason it is refused (or None) out.
"""

from __future__ import annotations

import re

__all__ = ["MAX_NAME_LENGTH", "image_reference_problem"]

MAX_NAME_LENGTH = 255
"""The daemon's ``NameTotalLengthMax``, counted on ``domain/path``."""

DEFAULT_DOMAIN = "docker.io"
OFFICIAL_PREFIX = "library/"

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

_REFERENCE = re.compile(
    rf"(?P<name>{_DOMAIN}/{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?",
    re.ASCII,
)
_IMAGE_ID = re.compile(r"[a-f0-9]{64}", re.ASCII)
_DIGEST_HEX_LENGTH = {"sha256": 64, "sha384": 96, "sha512": 128}
_LOWER_HEX = re.compile(r"[a-f0-9]+", re.ASCII)
_DIGEST_ONLY = re.compile(_DIGEST, re.ASCII)


def _digest_problem(digest: str) -> str | None:
    """What go-digest's Validate says of ``algorithm:hex`` (None when it is valid)."""
    algorithm, _, encoded = digest.partition(":")
    length = _DIGEST_HEX_LENGTH.get(algorithm)
    if length is None:
        return f"unsupported digest algorithm {algorithm!r} (sha256, sha384 or sha512)"
    if len(encoded) != length or not _LOWER_HEX.fullmatch(encoded):
        return f"a {algorithm} digest is {length} lowercase hex digits"
    return None


def _split_domain(reference: str) -> tuple[str, str]:
    """``(domain, remainder)`` as ``splitDockerDomain`` splits a familiar name."""
    first, slash, rest = reference.partition("/")
    if not slash or (not any(ch in first for ch in ".:") and first != "localhost"):
        if not slash:  # an official image: docker.io/library/NAME (counted in the length)
            return DEFAULT_DOMAIN, f"{OFFICIAL_PREFIX}{reference}"
        return DEFAULT_DOMAIN, reference
    return first, rest


def image_reference_problem(reference: str) -> str | None:
    """Why the daemon would refuse ``reference`` as an image, or None if it parses."""
    if _IMAGE_ID.fullmatch(reference):
        return None  # a full image ID
    if _DIGEST_ONLY.fullmatch(reference) and _digest_problem(reference) is None:
        return None  # an image ID written as a digest (else it may be NAME:TAG, as in Docker)
    domain, remainder = _split_domain(reference)
    repository = remainder.split("@", 1)[0].split(":", 1)[0]
    if repository.lower() != repository:
        return "the repository name must be lowercase"
    match = _REFERENCE.fullmatch(f"{domain}/{remainder}")
    if match is None:
        return (
            "not a valid reference: [REGISTRY/]PATH[:TAG][@DIGEST], lowercase path components "
            "of letters and digits joined by '.', '_', '__' or '-', a non-empty tag of at most "
            "128 characters"
        )
    if len(match["name"]) > MAX_NAME_LENGTH:
        return f"the repository name is longer than {MAX_NAME_LENGTH} characters"
    if match["digest"] is not None:
        return _digest_problem(match["digest"])
    return None
