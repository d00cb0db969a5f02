"""Lease records: what the journal keeps about each lease, and how a record may change.

Pure. A record holds what recovery needs to find and remove the lease's container — the lease
id, the container name and id, the daemon socket, deadlines and the admitted reservation — and
nothing else: no argv, no environment values (they can hold secrets).

States:
    creating  intent recorded, create request about to be sent (or in flight)
    created   the daemon returned the container id
    uncertain a create failed or was interrupted in a way that does not prove nothing was
              created; resolved only by observing and removing the owned container. It stays
              as a tombstone until then, or until an operator retires it.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

from sbxkit.errors import StorageError

RECORD_VERSION = 1
MAX_RECORD_BYTES = 16 * 1024
RECORD_SUFFIX = ".lease"
LEASE_ID = re.compile(r"[0-9a-f]{32}")

LeaseState = Literal["creating", "created", "uncertain"]


class LeaseRecord(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    version: int = RECORD_VERSION
    lease: str
    name: str
    state: LeaseState
    container_id: str | None = None
    engine_socket: str
    registered_at: float  # unix seconds
    lifetime_deadline: float  # unix seconds; recovery removes after it regardless
    memory_bytes: int
    nano_cpus: int
    reason: str | None = None  # why it became uncertain
    secret_hash: str | None = None
    """sha256 (hex) of the secret that proves ownership of the lease to a restarted
    supervisor (``Adopt``, proof.py); the secret itself lives only in its caller's memory.
    None: the lease cannot be re-adopted."""
    spent_hashes: tuple[str, ...] = ()
    """The hashes of secrets already used for an adoption (the newest last, a few kept): one
    offered again is refused as replayed."""
    governed: bool = False
    """The lease has a governed network: its listeners die with the supervisor, so it is
    never re-adopted (docs/operations.md)."""
    detached_until: float | None = None
    """Unix seconds: its caller detached it (``Detach``) and the supervisor keeps it without
    one until then, for a reattach with the handle's secret; None: it is not detached."""
    uid: int | None = None
    """The sandbox's own uid (``sbxkit._model.uids``), held while its container may exist; None when
    its spec named a user."""


_decoder = msgspec.json.Decoder(LeaseRecord)
_encoder = msgspec.json.Encoder()


def record_filename(lease: str) -> str:
    if not LEASE_ID.fullmatch(lease):
        raise ValueError(f"lease id {lease!r} is not 32 lowercase hex digits")
    return lease + RECORD_SUFFIX


def encode_record(record: LeaseRecord) -> bytes:
    return _encoder.encode(record) + b"\n"


def decode_record(path: str, data: bytes) -> LeaseRecord:
    """Parse a record file's bytes; anything unexpected is a StorageError naming the file."""
    if len(data) > MAX_RECORD_BYTES:
        raise StorageError(path, f"record is {len(data)} bytes, over {MAX_RECORD_BYTES}")
    try:
        record = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StorageError(path, f"malformed record: {exc}") from None
    if record.version != RECORD_VERSION:
        raise StorageError(path, f"record version {record.version}, expected {RECORD_VERSION}")
    if not LEASE_ID.fullmatch(record.lease):
        raise StorageError(path, f"lease id {record.lease!r} is malformed")
    if record.state == "created" and not record.container_id:
        raise StorageError(path, "state 'created' without a container id")
    return record


def created(record: LeaseRecord, container_id: str) -> LeaseRecord:
    if record.state != "creating":
        raise ValueError(f"lease {record.lease}: created from state {record.state}")
    return msgspec.structs.replace(record, state="created", container_id=container_id)


def uncertain(record: LeaseRecord, reason: str, *, adoptable: bool = True) -> LeaseRecord:
    """``adoptable`` False: its caller was told the create failed and will not come back for
    it (its secret hash is dropped)."""
    if record.state == "created":
        raise ValueError(f"lease {record.lease}: a created lease is never uncertain")
    secret_hash = record.secret_hash if adoptable else None
    return msgspec.structs.replace(
        record, state="uncertain", reason=reason, secret_hash=secret_hash
    )


def adopted_create(record: LeaseRecord, container_id: str) -> LeaseRecord:
    """A create interrupted by the supervisor's death whose container was found, still never
    started, when its caller re-adopted the lease: the lease is ``created`` after all."""
    if record.state == "created":
        raise ValueError(f"lease {record.lease}: already created")
    return msgspec.structs.replace(record, state="created", container_id=container_id, reason=None)
