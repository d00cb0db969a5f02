"""A held pool's template: which shape a Claim asks for, and the body of one parked container.

Pure. A ``Claim`` carries the Register its caller would send for a parked container of its
shape, under a lease of the caller's making (the *template lease*). The supervisor creates
every parked container under a fresh lease of its own, so the template lease may appear in the
body in exactly the places policy puts a lease — the ``sbxkit.lease`` label and the
``SBXKIT_LEASE`` variable — and nowhere else (``template_problem``).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import msgspec

from sbxkit._kernel.scripts import IO_BIND_OPTIONS, IO_TARGET, io_bind
from sbxkit._model.call_checks import MAX_POOL_SECONDS, MAX_POOL_SIZE
from sbxkit._model.mounts import ExpectedMount
from sbxkit._model.network_terms import NetworkTerms
from sbxkit._model.rules import LEASE_LABEL
from sbxkit._model.spec import ROOT_USER
from sbxkit._model.uids import body_with_uid, own_range, uid_for_lease
from sbxkit._protocol import records as rec
from sbxkit._protocol.wire import Claim, PoolTerms
from sbxkit.engine.models import ContainerCreate

PLACEHOLDER_LEASE = "0" * 32
LEASE_VARIABLE = "SBXKIT_LEASE"


def body_for_lease(template: ContainerCreate, template_lease: str, lease: str) -> ContainerCreate:
    """``template`` with its lease label, ``SBXKIT_LEASE``, on the kernel path the FIFO
    directory it binds (``<root>/<lease>``, sbxkit/kernel), and a uid of the template lease's
    own (``sbxkit._model.uids``: its user and tmpfs owners) set to ``lease``'s."""
    uids = own_range(template.user, template_lease)
    if uids is not None:
        old, new = uid_for_lease(template_lease, uids), uid_for_lease(lease, uids)
        template = body_with_uid(template, old, new)
    labels = dict(template.labels or {})
    if LEASE_LABEL in labels:
        labels[LEASE_LABEL] = lease
    own = f"{LEASE_VARIABLE}={template_lease}"
    env = [f"{LEASE_VARIABLE}={lease}" if item == own else item for item in template.env or []]
    host = template.host_config
    if host is not None and host.binds:
        binds = [_io_bind_for(bind, template_lease, lease) for bind in host.binds]
        host = msgspec.structs.replace(host, binds=binds)
    return msgspec.structs.replace(
        template,
        labels=labels if template.labels is not None else None,
        env=env if template.env is not None else None,
        host_config=host,
    )


def _io_bind_for(bind: str, template_lease: str, lease: str) -> str:
    source, _, rest = bind.partition(":")
    if rest != f"{IO_TARGET}:{IO_BIND_OPTIONS}" or not source.endswith("/" + template_lease):
        return bind
    return io_bind(source[: -len(template_lease)] + lease)


def mounts_for_lease(
    mounts: list[ExpectedMount], template_lease: str, lease: str
) -> list[ExpectedMount]:
    """The template's expected mounts for a container of ``lease`` (its FIFO directory's)."""
    return [
        msgspec.structs.replace(m, source=m.source[: -len(template_lease)] + lease)
        if m.destination == IO_TARGET and m.source.endswith("/" + template_lease)
        else m
        for m in mounts
    ]


def template_problem(claim: Claim) -> str | None:
    """Why the supervisor cannot keep a pool of this template, or None."""
    template = claim.template
    if template.body.user == ROOT_USER:
        return "a workspace with root inside is not parked: its root is proven when it starts"
    if not rec.LEASE_ID.fullmatch(template.lease):
        return "the template's lease must be 32 lowercase hex digits"
    if template.name != f"sbxkit-{template.lease}":
        return f"the template's name must be sbxkit-{template.lease}"
    placed = body_for_lease(template.body, template.lease, PLACEHOLDER_LEASE)
    if template.lease in msgspec.json.encode(placed).decode():
        return (
            "the template's lease appears in its body beyond the lease label, SBXKIT_LEASE "
            "and its FIFO directory"
        )
    mounts = mounts_for_lease(claim.expected_mounts, template.lease, PLACEHOLDER_LEASE)
    if template.lease in msgspec.json.encode(mounts).decode():
        return "the template's lease appears in its expected mounts beyond its FIFO directory"
    lifetime = claim.run_lifetime_s
    if lifetime is not None and not 0 < lifetime <= template.lifetime_deadline_s:
        return "run_lifetime_s must be in (0, the template's lifetime_deadline_s]"
    return terms_problem(claim.terms)


def claimed_lifetime(claim: Claim) -> float:
    """How long a claimed container may live from its claim on: the run's own lifetime."""
    return claim.run_lifetime_s or claim.template.lifetime_deadline_s


def terms_problem(terms: PoolTerms) -> str | None:
    if not 1 <= terms.size <= MAX_POOL_SIZE:
        return f"pool size must be 1..{MAX_POOL_SIZE}"
    for name, value in (("idle_ttl_s", terms.idle_ttl_s), ("max_timeout_s", terms.max_timeout_s)):
        if not 0 < value <= MAX_POOL_SECONDS:  # also refuses NaN
            return f"{name} must be in (0, {MAX_POOL_SECONDS:g}] seconds"
    return None


_SHAPE_SALT = secrets.token_bytes(32)
"""This process's own: an inject rule's value enters a shape key only as an HMAC under it, so
a key (in logs and pool listings) is no offline guess-checker for the secret."""


def _keyed_network(network: NetworkTerms | None) -> NetworkTerms | None:
    if network is None or not network.inject:
        return network
    keyed = [
        msgspec.structs.replace(
            rule, value=hmac.new(_SHAPE_SALT, rule.value.encode(), "sha256").hexdigest()
        )
        for rule in network.inject
    ]
    return msgspec.structs.replace(network, inject=keyed)


def shape_key(claim: Claim) -> str:
    """Equal for two claims whose parked containers would be the same but for their lease."""
    template = claim.template
    placed = body_for_lease(template.body, template.lease, PLACEHOLDER_LEASE)
    facts = (
        placed,
        template.engine_socket,
        template.reservation,
        template.startup_deadline_s,
        template.lifetime_deadline_s,
        _keyed_network(template.network),  # the proxy's address is the same for every list
        sorted(
            mounts_for_lease(claim.expected_mounts, template.lease, PLACEHOLDER_LEASE),
            key=lambda m: (m.type, m.source, m.destination, m.rw),
        ),
    )
    return hashlib.sha256(msgspec.json.encode(facts, order="sorted")).hexdigest()[:32]
