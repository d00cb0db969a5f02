"""The Docker engines the suite runs against, and what a test may expect of each.

``./dev test`` runs the suite on Docker 20.10 (API 1.41) and a cell of it on Docker 26.1 (API
1.45, ``scripts/engine26-up``). Every expectation that differs by engine lives here, as the
runtimes' differences live in tests/engine/runtimes.py, so the list of differences is one table
(docs/backends.md names each with the test that shows it). The engine is told by the API
version the daemon reports to the independent witness; an engine the table does not know fails
the test that asks: its expectations must be written down before its results mean anything.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.witness import Witness

CELL_FILES = frozenset(
    {"test_pool.py", "test_held_pool.py", "test_shape_pools.py", "test_session.py"}
)
"""Besides the conformance subset, these files run in the Docker 26.1 cell (marker
``engine_cell``), as does every test marked ``engine_cell`` by hand: those that show a difference
between the engines."""


@dataclass(frozen=True)
class EngineFacts:
    name: str
    api_version: str
    """What the server reports and sbxkit must speak to it (below sbxkit's newest, 1.56)."""
    server_version_prefix: str
    named_volume_events: tuple[str, ...]
    """The events of a named volume the witness creates and a run mounts: 20.10 logs a second
    ``create`` when a container create resolves the mount; 26.1 does not."""
    volume_subpath: bool
    """``VolumeOptions.Subpath`` exists (API 1.45); below it sbxkit refuses a subpath."""
    looked_up_references: frozenset[str]
    """Image references sbxkit's grammar refuses that this daemon does not refuse but looks up
    (404 "No such image") — its create parses more leniently than the reference grammar."""
    cdi_spec_dirs: list[str] | None
    """``/info`` ``CDISpecDirs``: absent before API 1.44; 26.1 sends ``[]`` with CDI off."""
    runc_aliases: frozenset[str]
    """Other names ``/info`` ``Runtimes`` lists for the default runc (26.1: its shim's name)."""


DOCKER_20_10 = EngineFacts(
    name="Docker 20.10",
    api_version="1.41",
    server_version_prefix="20.10.",
    named_volume_events=("create", "create", "mount", "unmount"),
    volume_subpath=False,
    looked_up_references=frozenset(),
    cdi_spec_dirs=None,
    runc_aliases=frozenset(),
)

DOCKER_26_1 = EngineFacts(
    name="Docker 26.1",
    api_version="1.45",
    server_version_prefix="26.1.",
    named_volume_events=("create", "mount", "unmount"),
    volume_subpath=True,
    # Upper case in the repository, and names over 255 characters: refused by `docker pull`,
    # `docker tag` and 20.10's create alike ("repository name must be lowercase", "... must
    # not be more than 255 characters"); 26.1's create looks them up instead.
    looked_up_references=frozenset(
        {
            "HIDDEN/busybox:1",
            "Sbxkit-test/busybox:latest",
            "LOCALHOST/x",
            "x" * 238,
            "a/" + "x" * 244,
        }
    ),
    cdi_spec_dirs=[],
    runc_aliases=frozenset({"io.containerd.runc.v2"}),
)

ENGINES = {facts.api_version: facts for facts in (DOCKER_20_10, DOCKER_26_1)}
"""By the API version the server reports (both are below sbxkit's newest, so it is also the
version sbxkit must speak)."""


def engine_facts(witness: Witness) -> EngineFacts:
    """What to expect of the engine on the test socket, as the witness reads its version."""
    version = witness.get("/version")
    facts = ENGINES.get(version["ApiVersion"])
    if facts is None or not version["Version"].startswith(facts.server_version_prefix):
        pytest.fail(
            f"no expectations for the engine {version['Version']} (API {version['ApiVersion']}): "
            "add its row to tests/engine/engines.py and docs/backends.md",
            pytrace=False,
        )
    return facts
