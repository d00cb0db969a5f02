"""The cluster tier: a real Ray cluster (a head and two worker nodes) on this machine.

Each worker node is bound to its own private Docker daemon, named by
``SBXKIT_TEST_CLUSTER_SOCKETS`` (two socket paths, comma-separated: ``scripts/cluster-engines-up``
provisions them, the noxfile's ``tests`` session passes them). A missing daemon, image, Ray or
``ip`` FAILS the run; nothing skips. Every test ends with zero sbxkit containers of this run on
each node's daemon, checked by an independent witness per daemon.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.cluster import LocalCluster
from tests.witness import PYTHON, Witness

NODE_NAMES = ("raya", "rayb")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def node_witnesses() -> dict[str, Witness]:
    raw = os.environ.get("SBXKIT_TEST_CLUSTER_SOCKETS", "")
    sockets = [s for s in raw.split(",") if s.strip()]
    if len(sockets) != len(NODE_NAMES):
        pytest.fail(
            "SBXKIT_TEST_CLUSTER_SOCKETS must name the two worker nodes' Docker sockets "
            "(scripts/cluster-engines-up provisions them; ./dev test passes them)",
            pytrace=False,
        )
    witnesses = dict(zip(NODE_NAMES, (Witness(s.strip()) for s in sockets), strict=True))
    for name, witness in witnesses.items():
        if not witness.ping():
            pytest.fail(f"node {name}: no Docker engine on {witness.socket_path}", pytrace=False)
        if not witness.image_exists(PYTHON):
            pytest.fail(f"node {name}: image {PYTHON} missing on {witness.socket_path}")
    for tool in ("ip", "ss"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} (iproute2) is needed for the cluster's namespace", pytrace=False)
    try:
        import ray  # noqa: F401 - the extra must be installed
    except ImportError:
        pytest.fail("Ray is not installed: pip install -e '.[test,ray]'", pytrace=False)
    return witnesses


@pytest.fixture(scope="session")
def cluster(node_witnesses: dict[str, Witness]) -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="sbxr-", dir="/tmp"))  # Ray's socket paths stay short
    local = LocalCluster(root, {name: w.socket_path for name, w in node_witnesses.items()})
    try:
        local.start()
        yield local
    finally:
        local.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(autouse=True)
def both_nodes_up(cluster: LocalCluster) -> None:
    """Every test starts with both worker nodes running: one that failed midway through a
    node's loss does not take the node from the tests after it."""
    for name in NODE_NAMES:
        node = cluster.nodes.get(name)
        if node is not None and node.process.poll() is None:
            continue
        if node is not None:
            cluster.stop_node(name)
        cluster.start_node(name)


@pytest.fixture(autouse=True)
def no_stray_processes(cluster: LocalCluster) -> Iterator[None]:
    """Every test leaves the namespace with the cluster's own processes only: no driver, no
    extra node, no attacker, and so no listener of theirs (Ray's ports included)."""
    yield
    deadline = time.monotonic() + 30
    while (strays := cluster.strays()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if strays:
        listening = cluster.listeners_of(set(strays))
        for pid in strays:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"processes left in the cluster's namespace: {strays}; listening: {listening}")


@pytest.fixture(autouse=True)
def no_leftovers_on_nodes(node_witnesses: dict[str, Witness]) -> Iterator[None]:
    for name, witness in node_witnesses.items():
        before = witness.sbxkit_containers()
        if before:
            pytest.fail(f"node {name}: sbxkit containers exist before the test: {before}")
    yield
    leaked = {}
    for name, witness in node_witnesses.items():
        left = witness.wait_until_no_sbxkit_containers(seconds=10.0)
        for container in left:
            witness.remove(container["Id"])
        if left:
            leaked[name] = [c["Id"][:12] for c in left]
    if leaked:
        pytest.fail(f"leaked containers: {leaked}")
