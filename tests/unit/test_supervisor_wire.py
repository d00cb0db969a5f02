"""The supervisor wire protocol: framing, tagged unions, size caps, strict refusal.

Pure: no supervisor process, no daemon. Every message type round-trips through ``encode`` and
``FrameReader`` however the byte stream is split, and anything that is not a well-formed,
expected message is a ``WireError`` — never another exception — so the service can drop the
connection on exactly one error type.
"""

from __future__ import annotations

import itertools
import json
import struct
from typing import Any, get_args

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sbxkit._model.mounts import ExpectedMount
from sbxkit._model.network_audit import Denial
from sbxkit._model.network_terms import CallbackTerms, NetworkTerms, TlsBundle
from sbxkit._protocol.wire import (
    MAX_FRAME,
    PROTOCOL_VERSION,
    Adopt,
    Adopted,
    AskDenials,
    Claim,
    Claimed,
    ClientMessage,
    Close,
    Closed,
    Created,
    Denials,
    Detach,
    Detached,
    EndPools,
    Expiring,
    Failed,
    FrameReader,
    Govern,
    Governed,
    HeldPoolState,
    Hello,
    Launch,
    Launched,
    ListPools,
    Message,
    Orphaned,
    Pools,
    PoolTerms,
    Queued,
    Recover,
    RefusalCode,
    Refused,
    Register,
    Registered,
    Report,
    Reservation,
    Retire,
    Run,
    RunCancel,
    RunDeclined,
    RunEnded,
    RunError,
    RunInterrupted,
    RunReport,
    RunResume,
    RunStarted,
    ServerMessage,
    Started,
    Unadopted,
    Unclaimed,
    Welcome,
    WireError,
    decode_client,
    decode_server,
    encode,
)
from sbxkit.engine.models import ContainerCreate, HostConfig, Ulimit
from sbxkit.errors import SbxError

CLIENT_TYPES: tuple[type[Message], ...] = (
    Hello,
    Register,
    Claim,
    Started,
    Close,
    Govern,
    AskDenials,
    Recover,
    Retire,
    ListPools,
    EndPools,
    Run,
    RunEnded,
    RunCancel,
    Adopt,
    RunResume,
    Detach,
)
SERVER_TYPES: tuple[type[Message], ...] = (
    Welcome,
    Refused,
    Queued,
    Registered,
    Created,
    Claimed,
    Unclaimed,
    Governed,
    Denials,
    Expiring,
    Launched,
    Failed,
    Closed,
    Orphaned,
    Report,
    Pools,
    RunDeclined,
    RunStarted,
    RunReport,
    RunError,
    RunInterrupted,
    Adopted,
    Unadopted,
    Detached,
)
ALL_TAGS = (
    "hello",
    "register",
    "claim",
    "claimed",
    "unclaimed",
    "started",
    "close",
    "govern",
    "ask_denials",
    "governed",
    "denials",
    "recover",
    "retire",
    "welcome",
    "refused",
    "queued",
    "registered",
    "created",
    "expiring",
    "launched",
    "failed",
    "closed",
    "orphaned",
    "report",
    "list_pools",
    "end_pools",
    "pools",
    "run",
    "run_ended",
    "run_cancel",
    "run_declined",
    "run_started",
    "run_report",
    "run_error",
    "run_interrupted",
    "adopt",
    "adopted",
    "unadopted",
    "run_resume",
    "detach",
    "detached",
)

# --- strategies ---------------------------------------------------------------------------------

texts = st.text(max_size=40)
int64 = st.integers(-(2**63), 2**63 - 1)
finite = st.floats(allow_nan=False, allow_infinity=False)

host_configs = st.builds(
    HostConfig,
    nano_cpus=st.none() | int64,
    memory=st.none() | int64,
    memory_swap=st.none() | int64,
    pids_limit=st.none() | int64,
    ulimits=st.none() | st.lists(st.builds(Ulimit, name=texts, soft=int64, hard=int64), max_size=2),
    readonly_rootfs=st.none() | st.booleans(),
    cap_drop=st.none() | st.lists(texts, max_size=3),
    network_mode=st.none() | texts,
    tmpfs=st.none() | st.dictionaries(texts, texts, max_size=2),
)
bodies = st.builds(
    ContainerCreate,
    image=texts,
    cmd=st.none() | st.lists(texts, max_size=4),
    entrypoint=st.none() | st.lists(texts, max_size=2),
    env=st.none() | st.lists(texts, max_size=3),
    user=st.none() | texts,
    labels=st.none() | st.dictionaries(texts, texts, max_size=3),
    tty=st.none() | st.booleans(),
    host_config=st.none() | host_configs,
)

registers = st.builds(
    Register,
    lease=texts,
    name=texts,
    engine_socket=texts,
    body=bodies,
    reservation=st.builds(Reservation, memory_bytes=int64, nano_cpus=int64),
    startup_deadline_s=finite,
    lifetime_deadline_s=finite,
    network=st.none()
    | st.builds(
        NetworkTerms,
        mode=st.sampled_from(["none", "managed"]),
        allow=st.lists(texts, max_size=3),
        callback=st.none()
        | st.builds(
            CallbackTerms,
            scheme=st.sampled_from(["http", "https"]),
            host=texts,
            port=int64,
            is_ip=st.booleans(),
        ),
        tls=st.none()
        | st.builds(TlsBundle, ca=st.binary(max_size=40), key=st.none() | st.binary(max_size=9)),
        audit_log=st.none() | texts,
    ),
    secret_hash=st.none() | texts,
    launch=st.none()
    | st.builds(
        Launch,
        expected_mounts=st.lists(
            st.builds(ExpectedMount, type=texts, source=texts, destination=texts, rw=st.booleans()),
            max_size=3,
        ),
        image_id=texts,
    ),
)
run_ended = st.builds(
    RunEnded,
    status=st.sampled_from(["exited", "timed_out", "output_exceeded"]),
    stdout_bytes=int64,
    stderr_bytes=int64,
    overflowed=st.sampled_from([None, "stdout", "stderr"]),
)
client_messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Hello, protocol=int64, fingerprint=texts),
    registers,
    st.builds(
        Claim,
        template=registers,
        terms=st.builds(
            PoolTerms,
            size=int64,
            idle_ttl_s=finite,
            max_timeout_s=finite,
            refill=st.booleans(),
        ),
        expected_mounts=st.lists(
            st.builds(ExpectedMount, type=texts, source=texts, destination=texts, rw=st.booleans()),
            max_size=2,
        ),
        mode=st.sampled_from(["take", "warm", "end"]),
        run_lifetime_s=st.none() | finite,
    ),
    st.builds(Started, lease=texts),
    st.builds(Close, lease=texts),
    st.builds(Govern, lease=texts),
    st.builds(AskDenials, lease=texts),
    st.just(Recover()),
    st.builds(Retire, lease=texts),
    st.just(ListPools()),
    st.builds(EndPools, shape=st.none() | texts),
    st.builds(
        Run,
        argv=st.lists(texts, max_size=4),
        state_dir=texts,
        env=st.dictionaries(texts, texts, max_size=3),
        json=st.booleans(),
        stdin=st.none() | texts,
    ),
    run_ended,
    st.builds(RunCancel, signal=int64),
    st.builds(Adopt, lease=texts, secret=texts, next_secret_hash=texts),
    st.builds(Detach, lease=texts, keep_s=finite, secret_hash=texts),
    st.builds(
        RunResume,
        lease=texts,
        secret=texts,
        next_secret_hash=texts,
        ended=st.none() | run_ended,
        cancel=st.none() | int64,
        exit_code=st.none() | int64,
        json=st.booleans(),
        pooled=st.booleans(),
        queued_s=finite,
        run_s=finite,
    ),
)
server_messages: st.SearchStrategy[Message] = st.one_of(
    st.builds(Welcome, protocol=int64, fingerprint=texts),
    st.builds(
        Refused,
        code=st.sampled_from(list(get_args(RefusalCode))),
        reason=texts,
        field=st.none() | texts,
    ),
    st.builds(Queued, lease=texts, ahead=int64),
    st.builds(Registered, lease=texts),
    st.builds(Created, lease=texts, container_id=texts),
    st.builds(Claimed, lease=texts, name=texts, container_id=texts, secret=st.none() | texts),
    st.builds(Unclaimed, reason=texts, parked=int64, problem=st.none() | texts),
    st.builds(Governed, lease=texts, problem=st.none() | texts),
    st.builds(
        Denials,
        lease=texts,
        denials=st.lists(st.builds(Denial, destination=texts, reason=texts), max_size=3),
        dropped=int64,
    ),
    st.builds(Expiring, lease=texts, reason=texts),
    st.builds(Launched, lease=texts, status=st.none() | int64, path=texts, message=texts),
    st.builds(Failed, lease=texts, reason=texts),
    st.builds(Closed, lease=texts),
    st.builds(Orphaned, lease=texts, reason=texts),
    st.builds(Report, lines=st.lists(texts, max_size=4), remaining=int64),
    st.builds(
        Pools,
        pools=st.lists(
            st.builds(
                HeldPoolState,
                shape=texts,
                image=texts,
                size=int64,
                parked=int64,
                starting=int64,
                claimed=int64,
                idle_s=finite,
                idle_ttl_s=finite,
                problem=st.none() | texts,
            ),
            max_size=2,
        ),
        problem=st.none() | texts,
    ),
    st.builds(RunDeclined, reason=texts),
    st.builds(
        RunStarted,
        lease=texts,
        line=st.binary(max_size=40),
        output_bytes=int64,
        timeout_s=finite,
        drain_s=finite,
        fds=int64,
        lost_status=int64,
        lost_stderr=texts,
        lost_json=st.none() | texts,
        secret=st.none() | texts,
        engine_socket=texts,
        pooled=st.booleans(),
        queued_s=finite,
    ),
    st.builds(RunReport, exit_status=int64, json=st.none() | texts, notice=st.none() | texts),
    st.builds(RunError, exit_status=int64, stderr=texts, json=st.none() | texts),
    st.just(RunInterrupted()),
    st.builds(Adopted, lease=texts, container_id=texts),
    st.builds(Unadopted, lease=texts, reason=texts, record=st.booleans()),
    st.builds(Detached, lease=texts, until=finite, problem=st.none() | texts),
)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def reassemble(chunks: list[bytes], reader: FrameReader | None = None) -> list[bytes]:
    reader = reader or FrameReader()
    frames: list[bytes] = []
    for chunk in chunks:
        frames.extend(reader.feed(chunk))
    assert reader.pending == 0
    return frames


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


# --- round trips --------------------------------------------------------------------------------


@given(st.lists(client_messages, min_size=1, max_size=5), st.lists(st.integers(0, 10**6)))
def test_client_messages_round_trip_under_any_split(
    messages: list[Message], cuts: list[int]
) -> None:
    data = b"".join(encode(m) for m in messages)
    frames = reassemble(split(data, cuts))
    assert [decode_client(f) for f in frames] == messages


@given(st.lists(server_messages, min_size=1, max_size=5), st.lists(st.integers(0, 10**6)))
def test_server_messages_round_trip_under_any_split(
    messages: list[Message], cuts: list[int]
) -> None:
    data = b"".join(encode(m) for m in messages)
    frames = reassemble(split(data, cuts))
    assert [decode_server(f) for f in frames] == messages


@given(client_messages | server_messages)
def test_byte_at_a_time_feeding_yields_the_frame_only_at_its_last_byte(message: Message) -> None:
    data = encode(message)
    reader = FrameReader()
    for byte in data[:-1]:
        assert reader.feed(bytes([byte])) == []
    assert reader.pending == len(data) - 1
    (payload,) = reader.feed(data[-1:])
    assert payload == data[4:]
    assert reader.pending == 0


def test_every_message_type_is_covered() -> None:
    """The strategies above draw every member of both unions (guards against a new type)."""
    assert set(CLIENT_TYPES) == set(get_args(ClientMessage))
    assert set(SERVER_TYPES) == set(get_args(ServerMessage))
    tags = {t.__struct_config__.tag for t in (*CLIENT_TYPES, *SERVER_TYPES)}
    assert tags == set(ALL_TAGS)


@pytest.mark.parametrize("message", [Hello(protocol=PROTOCOL_VERSION, fingerprint="f"), Recover()])
def test_a_client_message_is_not_a_server_message_and_vice_versa(message: Message) -> None:
    payload = encode(message)[4:]
    with pytest.raises(WireError):
        decode_server(payload)
    reply = encode(Welcome(protocol=PROTOCOL_VERSION, fingerprint="f"))[4:]
    with pytest.raises(WireError):
        decode_client(reply)


def test_the_frame_is_a_big_endian_length_and_a_tagged_json_document() -> None:
    data = encode(Close(lease="abc"))
    (size,) = struct.unpack(">I", data[:4])
    assert size == len(data) - 4
    assert json.loads(data[4:]) == {"type": "close", "lease": "abc"}


# --- size caps ----------------------------------------------------------------------------------


def test_a_frame_header_over_the_cap_is_refused_before_its_payload_arrives() -> None:
    reader = FrameReader()
    with pytest.raises(WireError, match="exceeds"):
        reader.feed(struct.pack(">I", MAX_FRAME + 1))


def test_a_frame_exactly_at_the_cap_passes() -> None:
    reader = FrameReader(max_frame=16)
    assert reader.feed(frame(b"x" * 16)) == [b"x" * 16]
    with pytest.raises(WireError):
        FrameReader(max_frame=16).feed(frame(b"x" * 17))


def test_an_oversized_frame_after_good_ones_is_still_refused() -> None:
    reader = FrameReader(max_frame=64)
    good = encode(Close(lease="a"))
    with pytest.raises(WireError):
        reader.feed(good + struct.pack(">I", 65))


def test_encoding_a_message_over_the_cap_is_refused() -> None:
    with pytest.raises(WireError, match="exceeds"):
        encode(Report(lines=["x" * MAX_FRAME], remaining=0))


def test_the_largest_encodable_message_is_accepted_by_the_reader() -> None:
    overhead = len(encode(Report(lines=[""], remaining=0))) - 4
    message = Report(lines=["x" * (MAX_FRAME - overhead)], remaining=0)
    data = encode(message)
    assert len(data) - 4 == MAX_FRAME
    assert [decode_server(f) for f in FrameReader().feed(data)] == [message]


# --- malformed documents ------------------------------------------------------------------------

VALID_REGISTER: dict[str, Any] = {
    "type": "register",
    "lease": "0" * 32,
    "name": "sbxkit-" + "0" * 32,
    "engine_socket": "/var/run/docker.sock",
    "body": {"Image": "x", "HostConfig": {"Memory": 1, "NanoCpus": 1}},
    "reservation": {"memory_bytes": 1, "nano_cpus": 1},
    "startup_deadline_s": 1.0,
    "lifetime_deadline_s": 2.0,
}


def test_the_valid_register_document_decodes() -> None:
    message = decode_client(json.dumps(VALID_REGISTER).encode())
    assert isinstance(message, Register)
    assert message.reservation == Reservation(memory_bytes=1, nano_cpus=1)


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"not json",
        b"\xff\xfe",
        b"[]",
        b"null",
        b'"hello"',
        b"{}",
        b'{"type": "bogus"}',
        b'{"type": 1}',
        b'{"type": "hello"}',
        b'{"type": "hello", "protocol": 1}',
        b'{"type": "hello", "protocol": "1", "fingerprint": "f"}',
        b'{"type": "hello", "protocol": 1.5, "fingerprint": "f"}',
        b'{"type": "hello", "protocol": 1e400, "fingerprint": "f"}',
        b'{"type": "hello", "protocol": 1, "fingerprint": "f", "extra": true}',
        b'{"type": "recover", "lease": "x"}',
        b'{"type": "close", "lease": null}',
        b'{"type": "welcome", "protocol": 1, "fingerprint": "f"}',
        b'{"type": "hello", "protocol": 1, "fingerprint": "f"} trailing',
        b"[" * 100_000,
    ],
)
def test_malformed_client_documents_are_wire_errors(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_client(payload)


@pytest.mark.parametrize(
    "mutation",
    [
        {"extra": 1},
        {"reservation": {"memory_bytes": 1, "nano_cpus": 1, "gpus": 1}},
        {"reservation": {"memory_bytes": 1}},
        {"startup_deadline_s": None},
        {"lifetime_deadline_s": "2"},
        {"body": {"Cmd": ["true"]}},  # Image is required
        {"body": []},
        {"lease": 7},
    ],
)
def test_malformed_register_documents_are_wire_errors(mutation: dict[str, Any]) -> None:
    with pytest.raises(WireError):
        decode_client(json.dumps({**VALID_REGISTER, **mutation}).encode())


@pytest.mark.parametrize(
    "payload",
    [
        b'{"type": "refused", "code": "nope", "reason": "r"}',
        b'{"type": "closed"}',
        b'{"type": "closed", "lease": "a", "extra": 1}',
        b'{"type": "report", "lines": "a", "remaining": 0}',
        b'{"type": "hello", "protocol": 1, "fingerprint": "f"}',
    ],
)
def test_malformed_server_documents_are_wire_errors(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_server(payload)


def test_wire_error_is_an_sbx_error() -> None:
    assert issubclass(WireError, SbxError)


# --- fuzz: decode or WireError, never anything else ---------------------------------------------

json_leaves = st.none() | st.booleans() | st.integers() | finite | st.text(max_size=10)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
field_names = st.sampled_from(
    [
        "lease",
        "name",
        "engine_socket",
        "body",
        "reservation",
        "startup_deadline_s",
        "lifetime_deadline_s",
        "protocol",
        "fingerprint",
        "code",
        "reason",
        "container_id",
        "lines",
        "remaining",
        "memory_bytes",
        "nano_cpus",
    ]
) | st.text(max_size=8)


def decodes_or_wire_error(payload: bytes) -> None:
    for decode in (decode_client, decode_server):
        try:
            message = decode(payload)
        except WireError:
            continue
        assert isinstance(message, Message)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_raise_wire_error(payload: bytes) -> None:
    decodes_or_wire_error(payload)


@settings(max_examples=300)
@given(st.sampled_from(ALL_TAGS), st.dictionaries(field_names, json_values, max_size=8))
def test_arbitrary_tagged_documents_decode_or_raise_wire_error(
    tag: str, fields: dict[str, Any]
) -> None:
    decodes_or_wire_error(json.dumps({**fields, "type": tag}).encode())


@settings(max_examples=200)
@given(client_messages | server_messages, st.integers(0, 10**6), st.binary(min_size=1, max_size=4))
def test_corrupted_encodings_decode_or_raise_wire_error(
    message: Message, position: int, noise: bytes
) -> None:
    payload = bytearray(encode(message)[4:])
    at = position % len(payload)
    payload[at : at + len(noise)] = noise
    decodes_or_wire_error(bytes(payload))


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=64), max_size=8), st.integers(0, 64))
def test_the_frame_reader_returns_frames_or_raises_wire_error(
    chunks: list[bytes], max_frame: int
) -> None:
    reader = FrameReader(max_frame=max_frame)
    received = 0
    try:
        for chunk in chunks:
            for payload in reader.feed(chunk):
                assert len(payload) <= max_frame
                received += 4 + len(payload)
    except WireError:
        return
    assert received + reader.pending == sum(len(c) for c in chunks)


def test_msgspec_validation_is_never_leaked() -> None:
    """The two msgspec failure kinds both surface as WireError (with the cause chained)."""
    with pytest.raises(WireError) as decode_failure:
        decode_client(b"{")
    assert isinstance(decode_failure.value.__cause__, msgspec.DecodeError)
    with pytest.raises(WireError) as validation_failure:
        decode_client(b'{"type": "close"}')
    assert isinstance(validation_failure.value.__cause__, msgspec.ValidationError)


def test_a_register_of_the_largest_spec_fits_a_frame() -> None:
    # The spec's bounds (a 1 MiB command, 128 KiB of env) reach the supervisor whole, even when
    # every byte is one JSON escapes to six bytes (issue 27, finding 7: a 1.9 MB command was a
    # WireError at run time).
    from sbxkit._model.rules import ENV_SIZE_LIMIT
    from sbxkit._model.spec import MAX_ARG_BYTES, MAX_COMMAND_BYTES

    arg = "\x01" * MAX_ARG_BYTES
    command = [arg] * (MAX_COMMAND_BYTES // (MAX_ARG_BYTES + 1))
    env = ["K=" + "\x01" * (ENV_SIZE_LIMIT - 4)]
    body = ContainerCreate(image="busybox", cmd=command, env=env)
    register = Register(
        lease="a" * 32,
        name="sbxkit-" + "a" * 32,
        engine_socket="/var/run/docker.sock",
        body=body,
        reservation=Reservation(memory_bytes=1, nano_cpus=1),
        startup_deadline_s=1.0,
        lifetime_deadline_s=1.0,
    )
    assert len(encode(register)) > 6 * MAX_COMMAND_BYTES  # the worst case, not a small one
