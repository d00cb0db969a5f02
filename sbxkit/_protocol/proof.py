"""Proof of a lease's ownership to a restarted supervisor (issue 22, docs/operations.md).

Pure. A caller registering a lease makes a random secret, keeps it in its memory only and sends
its sha256 (``Register.secret_hash``); a claimer gets the secret of the parked container it
claims (``Claimed.secret``: the supervisor made it when it parked the container). The journal
keeps the hash, never the secret. To re-adopt the lease after the supervisor died, the caller
sends the secret itself and the hash of a fresh one (``Adopt``): the supervisor checks the
secret against the record, journals the fresh hash and remembers the used one as spent, so
each secret proves ownership once.

An adoption whose answer was lost (the supervisor died between journaling the fresh hash and
answering) is retried with the very same pair: the spent secret *and* the fresh hash the
record now holds, which only the caller that sent the first attempt knows together. Anything
else offering a spent secret is a replay, refused and logged.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from typing import Literal

import msgspec

from sbxkit._protocol.records import LeaseRecord

SECRET_BYTES = 32
MAX_SPENT = 4
_HEX64 = re.compile(r"[0-9a-f]{64}")

Proof = Literal["accepted", "retried", "wrong", "replayed", "unadoptable", "malformed"]
"""``accepted``: the record's current secret; ``retried``: the retry of an adoption that was
journaled but not answered; ``wrong``: no secret this lease ever had; ``replayed``: a secret
already used for an adoption; ``unadoptable``: the record keeps no hash; ``malformed``: not a
secret and a hash of the expected form."""


def secret_hash(secret: str) -> str:
    """What the journal keeps of a secret: its sha256, hex."""
    return hashlib.sha256(secret.encode("ascii", "replace")).hexdigest()


def is_well_formed(text: str) -> bool:
    """64 lowercase hex digits: a secret (32 random bytes) or a hash, as sbxkit writes them."""
    return _HEX64.fullmatch(text) is not None


def check_proof(record: LeaseRecord, secret: str, next_hash: str) -> Proof:
    """How an ``Adopt``'s ``secret`` and ``next_hash`` stand against ``record``. Comparisons
    take the same time whatever they match."""
    if not (is_well_formed(secret) and is_well_formed(next_hash)):
        return "malformed"
    current = record.secret_hash
    if current is None:
        return "unadoptable"
    offered = secret_hash(secret)
    if hmac.compare_digest(offered, current):
        return "accepted" if not hmac.compare_digest(next_hash, current) else "malformed"
    spent = record.spent_hashes
    if (
        spent
        and hmac.compare_digest(offered, spent[-1])
        and hmac.compare_digest(next_hash, current)
    ):
        return "retried"
    if any(hmac.compare_digest(offered, used) for used in spent):
        return "replayed"
    return "wrong"


def rotated(record: LeaseRecord, secret: str, next_hash: str) -> LeaseRecord:
    """``record`` once ``secret`` proved it: the next hash is current, the used one spent; a
    detached lease is attached again (its new caller holds it)."""
    spent = (*record.spent_hashes, secret_hash(secret))[-MAX_SPENT:]
    return msgspec.structs.replace(
        record, secret_hash=next_hash, spent_hashes=spent, detached_until=None
    )


def detach_problem(record: LeaseRecord, next_hash: str, keep_s: float, now: float) -> str | None:
    """Why a ``Detach`` cannot hand ``record`` over (pure), or None."""
    if record.state != "created" or record.container_id is None:
        return "the lease has no container yet"
    if not is_well_formed(next_hash):
        return "the secret hash must be 64 hex digits"
    if record.secret_hash is not None and hmac.compare_digest(next_hash, record.secret_hash):
        return "the handle's secret must be a fresh one"
    if not (0 < keep_s < float("inf")):
        return f"keep_s must be a positive number of seconds, not {keep_s!r}"
    if record.lifetime_deadline <= now:
        return "its lifetime deadline passed"
    return None


def handed_over(record: LeaseRecord, next_hash: str, until: float) -> LeaseRecord:
    """``record`` detached until ``until`` (unix seconds, at most its lifetime deadline) for
    the holder of the secret hashed ``next_hash``: the caller's own secret is spent."""
    spent = record.spent_hashes
    if record.secret_hash is not None:
        spent = (*spent, record.secret_hash)[-MAX_SPENT:]
    return msgspec.structs.replace(
        record,
        secret_hash=next_hash,
        spent_hashes=spent,
        detached_until=min(until, record.lifetime_deadline),
    )


def refusal_reason(proof: Proof) -> str:
    """What the supervisor logs and answers for a proof that does not hold."""
    return {
        "accepted": "accepted",
        "retried": "accepted (a retry)",
        "wrong": "wrong secret",
        "replayed": "replayed secret (already used for an adoption)",  # or a reattach
        "unadoptable": "the lease keeps no secret: it cannot be re-adopted",
        "malformed": "the secret and the next hash must be 64 hex digits, and differ",
    }[proof]
