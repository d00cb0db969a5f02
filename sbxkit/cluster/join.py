"""Which nodes may run the batch's sandboxes (pure): a node is refused by name when it joins.

Each node's agent reports what it found (``NodeReport``): its Docker engine, its supervisor,
the content of every image the batch names, and the sbxkit it runs. A node is refused when:

- its own configuration is unusable (``SBXKIT_NODE_PROFILE``, its environment);
- its engine does not answer, or its supervisor cannot be reached or started;
- it runs a different sbxkit than the driver (the wire between them would not match);
- an image the batch names differs there from the reference.

A node that lacks an image is not refused: the jobs naming it are placed on the nodes that have
it, and a job whose image no accepted node has ends with the error line a local batch gives it
(``ImageError``), while the batch goes on.

Images are compared by content (``images.content_fingerprint``: the layers and the run
configuration), not by image ID: the same image imported on each host separately gets a
different ID. The reference for an image is the fingerprint a strict majority of the nodes that
have it hold (fixed at the batch's first join; later nodes are judged against it). Without a
majority, no node is accepted for that image: nothing says which is right.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import msgspec

from sbxkit._util.public import publish
from sbxkit.cluster.wire import NodeReport


class NodeRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """A node the batch does not use, and why (each reason names what to fix)."""

    node_id: str
    name: str
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        return f"node {self.name} ({self.node_id[:12]}) refused: " + "; ".join(self.reasons)


def image_reference(reports: Iterable[NodeReport]) -> dict[str, str | None]:
    """Each image's reference fingerprint: the one a strict majority of the nodes that have
    it hold, else None (no majority). An image no node has is left out."""
    reports = list(reports)
    names = {name for report in reports for name in report.images}
    reference: dict[str, str | None] = {}
    for name in sorted(names):
        held = Counter(r.images[name] for r in reports if r.images.get(name) is not None)
        if not held:
            continue
        winner = held.most_common(1)
        total = sum(held.values())
        reference[name] = winner[0][0] if winner and winner[0][1] * 2 > total else None
    return reference


def refusal_reasons(
    report: NodeReport, *, implementation: str, reference: Mapping[str, str | None]
) -> tuple[str, ...]:
    """Why ``report``'s node cannot run the batch (empty: accepted)."""
    reasons: list[str] = []
    if report.implementation != implementation:
        reasons.append(
            f"it runs a different sbxkit (fingerprint {report.implementation[:12]}, the "
            f"driver's {implementation[:12]}): install the same sbxkit on every node"
        )
    if report.config_error is not None:
        reasons.append(f"its own configuration: {report.config_error}")
        return tuple(reasons)  # nothing else was checked
    if report.engine_error is not None:
        reasons.append(f"no Docker engine: {report.engine_error}")
        return tuple(reasons)  # images cannot be judged without an engine
    if report.supervisor_error is not None:
        reasons.append(f"its supervisor: {report.supervisor_error}")
    for name, fingerprint in sorted(report.images.items()):
        expected = reference.get(name)
        if fingerprint is None or name not in reference:
            continue  # its jobs go to the nodes that have it; none had it to compare with
        if expected is None:
            reasons.append(
                f"image {name!r} differs between the nodes and no majority holds one content "
                f"({fingerprint[:19]} there): give every node the same image"
            )
        elif fingerprint != expected:
            reasons.append(
                f"image {name!r} differs from the other nodes' ({fingerprint[:19]} there, "
                f"{expected[:19]} on most): load the same image"
            )
    return tuple(reasons)


def judge(
    reports: Iterable[NodeReport], *, implementation: str, reference: Mapping[str, str | None]
) -> tuple[list[NodeReport], list[NodeRefusal]]:
    """Split the reports into accepted nodes and refusals."""
    accepted: list[NodeReport] = []
    refused: list[NodeRefusal] = []
    for report in reports:
        reasons = refusal_reasons(report, implementation=implementation, reference=reference)
        if reasons:
            refused.append(NodeRefusal(node_id=report.node_id, name=report.name, reasons=reasons))
        else:
            accepted.append(report)
    return accepted, refused


publish(__name__, globals())  # public names show as sbxkit.NAME
