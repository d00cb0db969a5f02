"""The supervisor's wire protocol: length-prefixed msgspec messages, tagged unions, capped.

Pure: bytes in, messages out. Each frame is a 4-byte big-endian length and a JSON document
whose ``type`` field names the message. A frame larger than ``MAX_FRAME`` or a document that is
not one of the expected messages is a ``WireError``; the connection is then dropped.

One connection carries one lease:

    client                                  supervisor
    Hello(protocol, fingerprint)     ─►
                                     ◄─     Welcome | Refused
    Register(lease, name, body, …)   ─►     (admission: waits in a FIFO until it fits)
                                     ◄─     Queued(ahead) …  (while waiting; nothing journaled)
                                     ◄─     Registered | Refused (journal fsync'd: intent recorded)
                                     ◄─     Created(container_id, inspected) | Failed(reason)
    Started                          ─►     (its launch slot goes to the next lease)
    Close                            ─►     (container removed, record deleted)
                                     ◄─     Closed | Orphaned

A lease with a governed network (docs/network.md) carries its terms in ``Register.network``;
once the caller started the container it asks the supervisor to put the listeners in place
before the payload runs, and asks for the denials before it closes:

    Govern                           ─►     (the governor enters the sandbox, binds, serves)
                                     ◄─     Governed(problem=None) | Governed(problem)
    AskDenials                       ─►
                                     ◄─     Denials(denials, dropped)

A connection may instead claim a parked container of a pool the supervisor holds (issue 13,
docs/pool.md):

    Hello                            ─►
    Claim(template, terms, mounts)   ─►     (the shape's pool is kept; one parked is taken)
                                     ◄─     Claimed(lease, name, container_id) | Unclaimed
    Close                            ─►     (from here as for any lease)
                                     ◄─     Closed | Orphaned

``sbxkit run`` may hand its whole run to the supervisor (sbxkit/handoff, docs/operations.md):
the supervisor parses its argv with the CLI's own parser, plans, claims or creates, starts
the sandbox on its FIFOs, and hands the command line the FIFO ends and the init's pidfd;
the command line feeds stdin and reads output itself, and asks for the verdict:

    Hello, Run(argv, state_dir, env, …) ─►
                                     ◄─     Queued …  (while it waits for capacity)
                                     ◄─     RunDeclined (nothing ran: the full path runs it)
                                          | RunError (an error to print as it is)
                                          | RunStarted(line, caps, …) + the ends (SCM_RIGHTS)
    RunEnded(status, byte counts)    ─►     (the verdict; removal, waited for when sbxkit
                                     ◄─      killed the payload)  RunReport | RunError
    RunCancel(signal)                ─►     (at any point: removal first)
                                     ◄─     RunInterrupted | RunError

Should the supervisor die while the command line holds the ends, the command line re-adopts
the run in the next one (launched if need be) with the lease's secret from ``RunStarted``:

    Hello, RunResume(lease, secret, next_hash, ended, exit_code, …) ─►
                                     ◄─     (adopted, judged, removed)  RunReport | RunError
    (interrupted: ended=None, cancel=signal) ◄─ (adopted, removed)  RunInterrupted | RunError

An operator's connection sends one request instead of Register: ``Recover`` or ``Retire``
(answered ``Report``), ``ListPools`` or ``EndPools`` (answered ``Pools``).

A caller whose supervisor died re-adopts its lease in the restarted one (issue 22,
docs/operations.md, "Re-adoption"), proving it with the lease's secret (proof.py):

    Hello                            ─►
    Adopt(lease, secret, next_hash)  ─►     (the record's hash checked; the next one journaled)
                                     ◄─     Adopted(lease, container_id) | Unadopted | Closed
    Close                            ─►     (from here as for any lease)
                                     ◄─     Closed | Orphaned

``Closed`` there: the container is already confirmed gone and the record released.

EOF from the client at any point means "remove". After ``Registered`` every lease ends in
exactly one of ``Closed`` (the container is confirmed gone and the record deleted) or
``Orphaned`` (cleanup could not be confirmed; the record is kept and recovery owns it). Only
``Closed`` means cleaned up. ``Failed`` only says the caller must not start anything. A request
that leaves the queue (Close or EOF while ``Queued``) gets ``Closed``: nothing was created.
"""

from __future__ import annotations

import struct
from typing import Literal

import msgspec

from sbxkit.engine.models import ContainerCreate, ContainerInspect
from sbxkit.errors import SbxError
from sbxkit.mounts import ExpectedMount
from sbxkit.network.audit import Denial
from sbxkit.network.terms import NetworkTerms
from sbxkit.supervisor.fingerprint import PROTOCOL_VERSION as PROTOCOL_VERSION

MAX_FRAME = 8 * 1024 * 1024
"""Room for a Register of the largest spec: a 1 MiB command and 128 KiB of env, each byte
JSON-escaped to six bytes at worst (spec.MAX_COMMAND_BYTES, rules.ENV_SIZE_LIMIT)."""
_HEADER = struct.Struct(">I")


class WireError(SbxError):
    """A peer broke the supervisor protocol (oversized, malformed or unexpected message)."""


class Message(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    """Base of every wire message; our own data, so unknown fields are refused."""


# -- client → supervisor -----------------------------------------------------------------------


class Hello(Message, tag="hello"):
    protocol: int
    fingerprint: str


class Reservation(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """What a lease asks the supervisor to admit; checked again on the created container."""

    memory_bytes: int
    nano_cpus: int


class Register(Message, tag="register"):
    lease: str
    name: str
    engine_socket: str
    body: ContainerCreate
    reservation: Reservation
    startup_deadline_s: float
    lifetime_deadline_s: float
    network: NetworkTerms | None = None
    """A governed network: what the supervisor's governor carries out once asked (Govern)."""
    secret_hash: str | None = None
    """sha256 (hex) of the caller's secret for this lease (proof.py), journaled: the secret
    re-adopts the lease if this supervisor dies. None: the lease cannot be re-adopted."""


class Started(Message, tag="started"):
    """The caller started the container: the daemon's launch work for this lease is done."""

    lease: str


class Close(Message, tag="close"):
    lease: str


class Govern(Message, tag="govern"):
    """The container started and its payload waits: put the lease's listeners in place."""

    lease: str


class AskDenials(Message, tag="ask_denials"):
    lease: str


class PoolTerms(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """How the supervisor keeps a shape's pool: ``size`` parked at once; a parked container
    idles at most ``idle_ttl_s`` (and the pool ends after that long without a claim); a claim
    may run at most ``max_timeout_s``."""

    size: int
    idle_ttl_s: float
    max_timeout_s: float
    refill: bool = True
    """False: park ``size`` once, replace nothing claimed or idled out."""


class Claim(Message, tag="claim"):
    """Take a parked container of ``template``'s shape (instead of Register).

    ``template`` is the Register the caller would send for a parked container of its shape
    (the parked shell's body under a lease of its own); the supervisor keeps a pool of that
    shape, creating each container under a fresh lease from it, re-checked, admitted,
    journaled and verified against ``expected_mounts`` like any sandbox."""

    template: Register
    terms: PoolTerms
    expected_mounts: list[ExpectedMount]
    mode: Literal["take", "warm", "end"] = "take"
    """``take`` one; ``warm``: only start the pool (answered ``Unclaimed`` with the count
    parked); ``end``: end the shape's pool now (answered once its parked are removed)."""
    run_lifetime_s: float | None = None
    """The claimed run's own lifetime (its time limit and the margin), counted from the claim,
    at most the template's; None: the template's. However long the container was parked, the
    claimed run keeps the lifetime its own claim implies."""


class Run(Message, tag="run"):
    """``sbxkit run`` handed to the supervisor (instead of Register; sbxkit/handoff).

    ``argv`` is the command line after ``sbxkit`` (it starts with ``run``), parsed here by the
    CLI's own parser. ``env`` holds the caller's variables the run is judged under (those the
    planning reads, those ``--env NAME`` names, those that find the daemon); ``state_dir`` is
    where the caller found this supervisor. ``json`` and ``stdin`` are what the caller's quick
    scan of argv found: the run is declined unless the parse agrees."""

    argv: list[str]
    state_dir: str
    env: dict[str, str]
    json: bool
    stdin: str | None = None


class RunEnded(Message, tag="run_ended"):
    """The handed-off run's payload ended, as the command line saw it on its FIFOs and the
    init's pidfd (or its time limit or an output cap ended it): judge it."""

    status: Literal["exited", "timed_out", "output_exceeded"]
    stdout_bytes: int
    stderr_bytes: int
    overflowed: Literal["stdout", "stderr"] | None = None


class RunCancel(Message, tag="run_cancel"):
    """The command line got ``signal`` (SIGINT, SIGTERM): remove the sandbox, then answer."""

    signal: int


class Adopt(Message, tag="adopt"):
    """Re-adopt a lease whose supervisor died (instead of Register): ``secret`` proves
    ownership once; ``next_secret_hash`` is the hash of the caller's next secret."""

    lease: str
    secret: str
    next_secret_hash: str


class Recover(Message, tag="recover"):
    """Operator: run one recovery pass now (instead of Register)."""


class Retire(Message, tag="retire"):
    """Operator: delete an uncertain tombstone whose container was never observed."""

    lease: str


class ListPools(Message, tag="list_pools"):
    """Operator: the pools this supervisor holds (instead of Register); answered ``Pools``."""


class EndPools(Message, tag="end_pools"):
    """Operator: end held pools now (instead of Register): the one whose shape key starts with
    ``shape``, or every one (``shape`` None). Answered ``Pools`` (the pools ended) once their
    parked containers are removed; a claimed container runs on for its caller."""

    shape: str | None = None


# -- supervisor → client -----------------------------------------------------------------------

RefusalCode = Literal[
    "version",
    "peer",
    "capacity",  # a hard bound (records, connections) is used up: fails explicitly
    "never_fits",  # larger than the whole budget; ``field`` names the spec field
    "admission_timeout",  # waited for capacity longer than the admission deadline
    "storage",
    "request",
    "policy",  # the create body breaks a hardened invariant (recheck.py); ``field`` names it
    "engine",  # the engine socket is not one this supervisor may talk to
    "shutdown",
]


class Welcome(Message, tag="welcome"):
    protocol: int
    fingerprint: str


class Refused(Message, tag="refused"):
    code: RefusalCode
    reason: str
    field: str | None = None


class Queued(Message, tag="queued"):
    """The request waits for capacity; sent when its place changes and every second."""

    lease: str
    ahead: int


class Registered(Message, tag="registered"):
    """Journaled: the supervisor owns the lease now. Sent with its next answer (mostly Created),
    alone if the create is slow. ``waited_s``: its wait for capacity and a launch slot."""

    lease: str
    waited_s: float = 0.0


class Created(Message, tag="created"):
    """The lease's container exists, stopped, with the admitted limits. ``inspected``: the
    supervisor's post-create inspection of it, the daemon's answer the caller verifies its
    plan against instead of asking again (one round trip fewer before the start)."""

    lease: str
    container_id: str
    inspected: ContainerInspect | None = None


class Claimed(Message, tag="claimed"):
    """A parked container, started and verified, is this connection's lease from now on.

    A container parked on the kernel path (sbxkit/kernel) comes with its host ends attached
    to this message (``SCM_RIGHTS``): ``fds`` of them, in the order stdin (the ``in`` FIFO,
    read-write), stdout, stderr, and — when ``evidence`` is ``kernel`` — its init's pidfd,
    verified when it was parked. The claimer runs on them directly: output and the exit never
    pass through the supervisor. ``fds`` 0: the claimer attaches (the daemon's path)."""

    lease: str
    name: str
    container_id: str
    fds: int = 0
    evidence: Literal["kernel", "daemon"] = "daemon"
    secret: str | None = None
    """The lease's secret (made when the container was parked, journaled as a hash): it
    re-adopts the lease if this supervisor dies (``Adopt``)."""


class Unclaimed(Message, tag="unclaimed"):
    """Nothing taken: for ``take``, nothing parked of that shape now (the pool fills in the
    background: run cold); ``parked`` is how many are parked after the request."""

    reason: str
    parked: int = 0
    problem: str | None = None
    """Why the shape's last park failed (a missing image, a full host ...), if it did."""


class Governed(Message, tag="governed"):
    """The answer to Govern: ``problem`` None once the listeners are in place; else why they
    are not (the payload must not run)."""

    lease: str
    problem: str | None = None


class Denials(Message, tag="denials"):
    """The answer to AskDenials: the first denials of the lease's governed network, and how
    many more were only counted."""

    lease: str
    denials: list[Denial]
    dropped: int = 0


class RunDeclined(Message, tag="run_declined"):
    """The handed-off run is not served here (an option the hand-off does not take, a refusal,
    the daemon's path ...): nothing of its payload ran; the command line runs it itself."""

    reason: str


class RunStarted(Message, tag="run_started"):
    """The sandbox waits for ``line`` on its stdin (the go line, or a pool's claim line):
    its ends ride with this message (``SCM_RIGHTS``: stdin, stdout, stderr, the init's pidfd).
    The command line writes ``line`` then its stdin, keeps ``output_bytes`` per stream, ends
    the run after ``timeout_s``, and drains output at most ``drain_s`` after the exit. Should
    this supervisor be gone before the verdict, it resumes the run in the next one
    (``RunResume``, with ``secret``); failing that it prints ``lost_stderr`` (and
    ``lost_json`` under ``--json``) and exits ``lost_status``."""

    lease: str
    line: bytes
    output_bytes: int
    timeout_s: float
    drain_s: float
    fds: int
    lost_status: int
    lost_stderr: str
    lost_json: str | None = None
    secret: str | None = None
    """The lease's secret (the record journals only its hash): should this supervisor die,
    the command line re-adopts the run in the next one with it (``RunResume``). None: the
    lease cannot be re-adopted (a governed network's listeners die with the supervisor)."""
    engine_socket: str = ""
    """The daemon the lease's container lives on (a supervisor launched to resume serves it)."""
    pooled: bool = False
    queued_s: float = 0.0
    """What the verdict's result says beside the command line's own figures."""


class RunResume(Message, tag="run_resume"):
    """A handed-off run whose supervisor died (instead of Register; sbxkit/handoff/resume.py):
    re-adopt its lease with ``secret`` (as ``Adopt`` does: ``next_secret_hash`` is journaled),
    judge the exit the command line saw — ``exit_code`` read from its pidfd of the init, the
    kernel's word — remove the container, and answer ``RunReport`` as the dead supervisor
    would have (else ``RunError``: the command line prints its ``lost`` line)."""

    lease: str
    secret: str
    next_secret_hash: str
    ended: RunEnded | None = None
    """None: the command line was interrupted (``cancel``): remove, answer RunInterrupted."""
    cancel: int | None = None
    exit_code: int | None = None
    json: bool = False
    pooled: bool = False
    queued_s: float = 0.0
    run_s: float = 0.0


class RunReport(Message, tag="run_report"):
    """The handed-off run's result: the exit status, the ``--json`` document (its ``stdout``
    and ``stderr`` empty: the command line puts its own output there), and the line said after
    the payload's stderr (``sbxkit: timed out``), if any."""

    exit_status: int
    json: str | None = None
    notice: str | None = None


class RunError(Message, tag="run_error"):
    """The handed-off run failed as ``sbxkit run`` reports failures: ``stderr`` to print,
    ``json`` (under ``--json``) to print on stdout, and the exit status."""

    exit_status: int
    stderr: str
    json: str | None = None


class RunInterrupted(Message, tag="run_interrupted"):
    """The answer to RunCancel: the sandbox is removed (or was never created)."""


class Expiring(Message, tag="expiring"):
    """The supervisor is removing the lease's container on its own decision (the lifetime
    deadline passed); sent before the removal, so the caller judges that exit as sbxkit's."""

    lease: str
    reason: str


class Adopted(Message, tag="adopted"):
    """The lease is this connection's now, with its original deadlines; ``container_id`` is
    its container (for a create the previous supervisor did not get to answer)."""

    lease: str
    container_id: str


class Unadopted(Message, tag="unadopted"):
    """The lease was not re-adopted, and why. ``record``: this supervisor holds its record
    (recovery owns it); False: it holds none — nothing was journaled, or the lease ended."""

    lease: str
    reason: str
    record: bool


class Failed(Message, tag="failed"):
    """No container the caller may start; ``Closed`` or ``Orphaned`` follows."""

    lease: str
    reason: str


class Closed(Message, tag="closed"):
    """The lease is released: its container is confirmed gone and its record deleted."""

    lease: str


class Orphaned(Message, tag="orphaned"):
    """Cleanup could not be confirmed; the record is kept and recovery will finish it."""

    lease: str
    reason: str


class Report(Message, tag="report"):
    """Answer to Recover or Retire: what was checked and what remains."""

    lines: list[str]
    remaining: int


class HeldPoolState(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """One held pool as an operator sees it."""

    shape: str
    """The shape key (32 hex digits): callers whose parked containers would be the same but
    for their lease share it (docs/pool.md)."""
    image: str
    size: int
    parked: int
    starting: int
    claimed: int
    """Claimed and still running for their callers (ending the pool leaves them be)."""
    idle_s: float
    """Seconds since the pool's last claim; it ends by itself after ``idle_ttl_s``."""
    idle_ttl_s: float
    problem: str | None = None


class Pools(Message, tag="pools"):
    """Answer to ListPools (the pools held) or EndPools (the pools ended), or why not."""

    pools: list[HeldPoolState]
    problem: str | None = None


ClientMessage = (
    Hello
    | Register
    | Claim
    | Started
    | Close
    | Govern
    | AskDenials
    | Recover
    | Retire
    | ListPools
    | EndPools
    | Run
    | RunEnded
    | RunCancel
    | Adopt
    | RunResume
)
ServerMessage = (
    Welcome
    | Refused
    | Queued
    | Registered
    | Created
    | Claimed
    | Unclaimed
    | Governed
    | Denials
    | Expiring
    | Failed
    | Closed
    | Orphaned
    | Report
    | Pools
    | RunDeclined
    | RunStarted
    | RunReport
    | RunError
    | RunInterrupted
    | Adopted
    | Unadopted
)

_encoder = msgspec.json.Encoder()
_client_decoder = msgspec.json.Decoder(ClientMessage)
_server_decoder = msgspec.json.Decoder(ServerMessage)


def encode(message: Message) -> bytes:
    payload = _encoder.encode(message)
    if len(payload) > MAX_FRAME:
        raise WireError(f"message of {len(payload)} bytes exceeds the {MAX_FRAME}-byte cap")
    return _HEADER.pack(len(payload)) + payload


class FrameReader:
    """Incremental frame splitter; ``feed`` returns complete payloads in order."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._max_frame = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        frames: list[bytes] = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > self._max_frame:
                raise WireError(f"frame of {size} bytes exceeds the {self._max_frame}-byte cap")
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            frames.append(bytes(self._buffer[_HEADER.size : end]))
            del self._buffer[:end]
        return frames

    @property
    def pending(self) -> int:
        return len(self._buffer)


def decode_client(payload: bytes) -> ClientMessage:
    try:
        return _client_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(f"malformed client message: {exc}") from exc


def decode_server(payload: bytes) -> ServerMessage:
    try:
        return _server_decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise WireError(f"malformed supervisor message: {exc}") from exc
