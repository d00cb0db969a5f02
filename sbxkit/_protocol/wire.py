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

A cold run on the kernel path (sbxkit/kernel) registers with ``launch``: its payload waits
for a go line only the caller writes, so the supervisor starts the container itself once it
has verified it against the caller's plan (the admitted limits, and ``launch``'s mounts and
image), one round trip earlier than the caller could. The caller verifies it on ``Created``
too, holds the init, and lets the payload go once the shell says it runs; it sends no
``Started`` (the launch slot goes on at the daemon's answer):

    Register(…, launch)              ─►
                                     ◄─     Registered, Created  (the start is on its way)
                                     ◄─     Launched(status=None) | Launched(status, message)

A lease with a governed network (docs/network.md) carries its terms in ``Register.network``;
once the caller started the container it asks the supervisor to put the listeners in place
before the payload runs, and asks for the denials before it closes:

    Govern                           ─►     (the governor enters the sandbox, binds, serves)
                                     ◄─     Governed(problem=None) | Governed(problem)
    AskDenials                       ─►
                                     ◄─     Denials(denials, dropped, ports)

A connection may instead claim a parked container of a pool the supervisor holds (issue 13,
docs/pool.md):

    Hello                            ─►
    Claim(template, terms, mounts)   ─►     (the shape's pool is kept; one parked is taken)
                                     ◄─     Claimed(lease, name, container_id) | Unclaimed
    Close                            ─►     (from here as for any lease)
                                     ◄─     Closed | Orphaned

``sbxkit run`` may hand its whole run to the supervisor instead (``Run``, ``RunResume``: their
messages and exchange are handoff_wire.py's).

An operator's connection sends one request instead of Register: ``Recover`` or ``Retire``
(answered ``Report``), ``ListPools`` or ``EndPools`` (answered ``Pools``).

A caller whose supervisor died re-adopts its lease in the restarted one (issue 22,
docs/operations.md, "Re-adoption"), proving it with the lease's secret (proof.py):

    Hello                            ─►
    Adopt(lease, secret, next_hash,  ─►     (the record's hash checked; the next one journaled;
          network)                          a governed lease's listeners bound again)
                                     ◄─     Adopted(lease, container_id) | Unadopted | Closed
    Close                            ─►     (from here as for any lease)
                                     ◄─     Closed | Orphaned

``Closed`` there: the container is already confirmed gone and the record released.

A session may be handed to another process of the same account (issue 40, docs/interactive.md,
"Detach and reattach"). On its lease's connection the caller hands the lease to the supervisor
to keep without a caller for a while, under a fresh secret only the handle carries:

    Detach(lease, keep_s, secret_hash) ─►    (the fresh hash and the keep deadline journaled)
                                     ◄─     Detached(lease, until) | Detached(lease, problem)

After ``Detached`` without a problem the connection closes without ending the lease. The
reattaching process sends ``Adopt`` with the handle's secret, as a re-adoption does; a lease
nobody reattached by ``until`` is removed (by a restarted supervisor too: its record says so).

EOF from the client at any point means "remove". After ``Registered`` every lease ends in
exactly one of ``Closed`` (the container is confirmed gone and the record deleted) or
``Orphaned`` (cleanup could not be confirmed; the record is kept and recovery owns it). Only
``Closed`` means cleaned up. ``Failed`` only says the caller must not start anything. A request
that leaves the queue (Close or EOF while ``Queued``) gets ``Closed``: nothing was created.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from sbxkit._model.mounts import ExpectedMount
from sbxkit._model.network_audit import Denial
from sbxkit._model.network_ports import PortForward
from sbxkit._model.network_terms import NetworkTerms
from sbxkit._protocol.fingerprint import PROTOCOL_VERSION as PROTOCOL_VERSION
from sbxkit._protocol.framing import MAX_FRAME as MAX_FRAME
from sbxkit._protocol.framing import FrameReader as FrameReader
from sbxkit._protocol.framing import LeaseMessage
from sbxkit._protocol.framing import Message as Message
from sbxkit._protocol.framing import encode as encode
from sbxkit._protocol.handoff_wire import Run as Run
from sbxkit._protocol.handoff_wire import RunCancel as RunCancel
from sbxkit._protocol.handoff_wire import RunDeclined as RunDeclined
from sbxkit._protocol.handoff_wire import RunEnded as RunEnded
from sbxkit._protocol.handoff_wire import RunError as RunError
from sbxkit._protocol.handoff_wire import RunInterrupted as RunInterrupted
from sbxkit._protocol.handoff_wire import RunReport as RunReport
from sbxkit._protocol.handoff_wire import RunResume as RunResume
from sbxkit._protocol.handoff_wire import RunStarted as RunStarted
from sbxkit.engine.models import ContainerCreate, ContainerInspect
from sbxkit.errors import WireError as WireError

# -- client → supervisor -----------------------------------------------------------------------


class Hello(Message, tag="hello"):
    protocol: int
    fingerprint: str


class Reservation(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """What a lease asks the supervisor to admit; checked again on the created container."""

    memory_bytes: int
    nano_cpus: int


class Launch(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Start the container as soon as it is verified against the caller's plan: the admitted
    limits, then everything ``verify.check_created`` checks — ``expected_mounts`` exactly, and
    ``image_id`` (the image the run was planned on, when known). Only for a body whose payload
    waits for its go line (the kernel path's FIFOs): what starts is the shell that waits."""

    expected_mounts: list[ExpectedMount]
    image_id: str = ""


class Register(LeaseMessage, tag="register"):
    name: str
    engine_socket: str
    body: ContainerCreate
    reservation: Reservation
    startup_deadline_s: float
    """Seconds from admission by which the container must have started, else the lease is
    ended (capped by the supervisor's own ``--max-startup-deadline``)."""
    lifetime_deadline_s: float
    """Seconds from admission after which the supervisor removes the container, whatever the
    caller says (the owner's ``lifetime_s``)."""
    network: NetworkTerms | None = None
    """A governed network: what the supervisor's governor carries out once asked (Govern)."""
    secret_hash: str | None = None
    """sha256 (hex) of the caller's secret for this lease (proof.py), journaled: the secret
    re-adopts the lease if this supervisor dies. None: the lease cannot be re-adopted."""
    launch: Launch | None = None
    """Start the container once verified (``Launch``): answered ``Launched``."""


class Started(LeaseMessage, tag="started"):
    """The caller started the container: the daemon's launch work for this lease is done."""


class Close(LeaseMessage, tag="close"):
    """The caller is done: stop the lease (its container is removed)."""


class Govern(LeaseMessage, tag="govern"):
    """The container started and its payload waits: put the lease's listeners in place."""


class AskDenials(LeaseMessage, tag="ask_denials"):
    """What the lease's governed network refused so far: answered ``Denials``."""


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


class Adopt(LeaseMessage, tag="adopt"):
    """Re-adopt a lease whose supervisor died (instead of Register): ``secret`` proves
    ownership once; ``next_secret_hash`` is the hash of the caller's next secret."""

    secret: str
    next_secret_hash: str
    network: NetworkTerms | None = None
    """A governed lease's terms, as registered (or claimed): the supervisor puts its listeners
    back in the sandbox before ``Adopted``. Without them a governed lease is re-adopted with
    its egress closed (nothing listens), as for a handed-off run resumed once it ended."""


class Detach(LeaseMessage, tag="detach"):
    """Keep the lease without a connected caller for at most ``keep_s`` seconds (never past
    its lifetime deadline), for whoever proves the secret whose hash is ``secret_hash``
    (``Adopt``); the caller's secret so far is spent. Answered ``Detached``."""

    keep_s: float
    secret_hash: str


class Recover(Message, tag="recover"):
    """Operator: run one recovery pass now (instead of Register)."""


class Retire(LeaseMessage, tag="retire"):
    """Operator: delete an uncertain tombstone whose container was never observed."""


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
    "uid_taken",  # the lease's own uid is a host account's or held: plan under a new lease
]


class Welcome(Message, tag="welcome"):
    protocol: int
    fingerprint: str


class Refused(Message, tag="refused"):
    code: RefusalCode
    reason: str
    field: str | None = None


class Queued(LeaseMessage, tag="queued"):
    """The request waits for capacity; sent when its place changes and every second."""

    ahead: int


class Registered(LeaseMessage, tag="registered"):
    """Journaled: the supervisor owns the lease now. Sent with its next answer (mostly Created),
    alone if the create is slow. ``waited_s``: its wait for capacity and a launch slot."""

    waited_s: float = 0.0


class Created(LeaseMessage, tag="created"):
    """The lease's container exists, stopped, with the admitted limits. ``inspected``: the
    supervisor's post-create inspection of it, the daemon's answer the caller verifies its
    plan against instead of asking again (one round trip fewer before the start)."""

    container_id: str
    inspected: ContainerInspect | None = None


class Claimed(LeaseMessage, tag="claimed"):
    """A parked container, started and verified, is this connection's lease from now on.

    A container parked on the kernel path (sbxkit/kernel) comes with its host ends attached
    to this message (``SCM_RIGHTS``): ``fds`` of them, in the order stdin (the ``in`` FIFO,
    read-write), stdout, stderr, and — when ``evidence`` is ``kernel`` — its init's pidfd,
    verified when it was parked. The claimer runs on them directly: output and the exit never
    pass through the supervisor. ``fds`` 0: the claimer attaches (the daemon's path)."""

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


class Governed(LeaseMessage, tag="governed"):
    """The answer to Govern: ``problem`` None once the listeners are in place; else why they
    are not (the payload must not run)."""

    problem: str | None = None


class Denials(LeaseMessage, tag="denials"):
    """The answer to AskDenials: the first denials of the lease's governed network, and how
    many more were only counted."""

    denials: list[Denial]
    dropped: int = 0
    ports: list[PortForward] = msgspec.field(default_factory=list)
    """The lease's inbound ports as its governor bound them (their host ports)."""


class Launched(LeaseMessage, tag="launched"):
    """The daemon's answer to the start of a lease registered with ``launch``: ``status``
    None when it started the container, else the error it answered (``path`` the request's,
    ``message`` the daemon's; a ``status`` of 0 is an error no HTTP status came with). A
    container the supervisor found not to be the plan's is never started: it answers nothing
    and leaves the refusal to the caller's own verification."""

    status: int | None = None
    path: str = ""
    message: str = ""


class Expiring(LeaseMessage, tag="expiring"):
    """The supervisor is removing the lease's container on its own decision (the lifetime
    deadline passed, or a writable root filesystem wrote past its bound); sent before the
    removal, so the caller judges that exit as sbxkit's, with ``status``."""

    reason: str
    status: Literal["timed_out", "disk_exceeded"] = "timed_out"


class Adopted(LeaseMessage, tag="adopted"):
    """The lease is this connection's now, with its original deadlines; ``container_id`` is
    its container (for a create the previous supervisor did not get to answer)."""

    container_id: str


class Unadopted(LeaseMessage, tag="unadopted"):
    """The lease was not re-adopted, and why. ``record``: this supervisor holds its record
    (recovery owns it); False: it holds none — nothing was journaled, or the lease ended."""

    reason: str
    record: bool
    ended: bool = False
    """The lease is over (no record of it, or its keep deadline passed and its container is
    being removed), not refused for cause (a wrong or spent secret, another owner)."""


class Detached(LeaseMessage, tag="detached"):
    """The answer to Detach: ``problem`` None once the keep deadline ``until`` (unix seconds)
    and the fresh hash are journaled (the connection then ends, the lease lives on); else why
    not (the lease goes on, attached as before)."""

    until: float = 0.0
    problem: str | None = None


class Failed(LeaseMessage, tag="failed"):
    """No container the caller may start; ``Closed`` or ``Orphaned`` follows."""

    reason: str


class Closed(LeaseMessage, tag="closed"):
    """The lease is released: its container is confirmed gone and its record deleted."""


class Orphaned(LeaseMessage, tag="orphaned"):
    """Cleanup could not be confirmed; the record is kept and recovery will finish it."""

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
    | Detach
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
    | Launched
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
    | Detached
)

_client_decoder = msgspec.json.Decoder(ClientMessage)
_server_decoder = msgspec.json.Decoder(ServerMessage)


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
