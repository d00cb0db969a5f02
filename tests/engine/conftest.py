"""Real-engine tier: a missing engine or test image FAILS the run; nothing skips.

Every test here ends with zero sbxkit containers on the daemon, checked by the independent
witness after the test body (a leak turns the test into an error).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sbxkit.engine.client import Engine, open_engine
from tests.engine import engines
from tests.engine.cli_paths import (  # noqa: F401 - fixtures: the paths of `sbxkit run`
    cli_handoff,
    cli_path,
)
from tests.engine.engines import CELL_FILES, EngineFacts
from tests.engine.oneshot_paths import (  # noqa: F401 - a fixture: the one-shot paths
    oneshot,
    oneshot_paths,
)
from tests.engine.runtimes import runtime_cells, spec_runtime
from tests.speed import bound
from tests.supervision import private_state_dir
from tests.witness import BUSYBOX, PYDATA, PYTHON, SOCKET, Witness


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``runtime`` runs once per runtime cell (the conformance subset); one
    that takes ``oneshot`` once per one-shot path that runtime has (``oneshot_paths``)."""
    cells = runtime_cells() if "runtime" in metafunc.fixturenames else [None]
    chosen = any(
        "oneshot" in str(marker.args[0])
        for marker in metafunc.definition.iter_markers("parametrize")
    )  # a test that names its own paths (e.g. only those an in-process owner can witness)
    takes_oneshot = "oneshot" in metafunc.fixturenames and not chosen
    if "runtime" not in metafunc.fixturenames and not takes_oneshot:
        return
    combos, ids = [], []
    for cell in cells:
        runtime = None if cell is None else spec_runtime(cell)
        for path in oneshot_paths(runtime) if takes_oneshot else [None]:
            combos.append((runtime, path))
            ids.append("-".join(part for part in (path, cell) if part))
    if "runtime" in metafunc.fixturenames and takes_oneshot:
        metafunc.parametrize(("runtime", "oneshot"), combos, ids=ids, indirect=["oneshot"])
    elif takes_oneshot:
        metafunc.parametrize("oneshot", [p for _, p in combos], ids=ids, indirect=True)
    else:
        metafunc.parametrize("runtime", [r for r, _ in combos], ids=ids)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/engine/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.engine)
            if "runtime" in getattr(item, "fixturenames", ()):
                item.add_marker(pytest.mark.conformance)
            if item.path.name in CELL_FILES:
                item.add_marker(pytest.mark.engine_cell)


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A fresh private supervisor state dir path (not yet created); removed with its parent
    afterwards (tests/supervision.py starts a supervisor on it)."""
    path = private_state_dir()
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def witness() -> Witness:
    w = Witness()
    if not w.ping():
        pytest.fail(
            f"no Docker engine answers on {SOCKET}: run scripts/engine-up (the README's "
            "test command does); real-engine tests never skip",
            pytrace=False,
        )
    for image in (BUSYBOX, PYTHON):
        if not w.image_exists(image):
            pytest.fail(f"test image {image} is missing: run scripts/engine-up", pytrace=False)
    return w


@pytest.fixture(autouse=True)
def no_leftovers(witness: Witness) -> Iterator[None]:
    before = witness.sbxkit_containers()
    if before:
        pytest.fail(f"sbxkit containers exist before the test: {[c['Id'][:12] for c in before]}")
    yield
    # A supervisor removes a held container after the test returns: seconds here, more on a
    # slower machine; a leak never goes, so the scaled wait still fails it.
    left = witness.wait_until_no_sbxkit_containers(seconds=bound(5.0, ceiling=60.0))
    if left:
        for c in left:
            witness.remove(c["Id"])  # keep the next test's slate clean, but still fail this one
        pytest.fail(f"leaked containers: {[(c['Id'][:12], c.get('Names')) for c in left]}")


@pytest.fixture
async def engine(witness: Witness) -> AsyncIterator[Engine]:
    async with open_engine(witness.socket_path) as eng:
        yield eng


@pytest.fixture(scope="session")
def engine_facts(witness: Witness) -> EngineFacts:
    """What to expect of this engine where Docker versions differ (tests/engine/engines.py)."""
    return engines.engine_facts(witness)


@pytest.fixture(scope="session")
def busybox(witness: Witness) -> str:
    return BUSYBOX


@pytest.fixture(scope="session")
def python_image(witness: Witness) -> str:
    return PYTHON


@pytest.fixture(scope="session")
def pydata_image(witness: Witness) -> str:
    """The python image with numpy, pandas and matplotlib; only the tests that need it ask for
    it (the engine cells that never run them do not build it)."""
    if not witness.image_exists(PYDATA):
        pytest.fail(f"test image {PYDATA} is missing: run scripts/engine-up", pytrace=False)
    return PYDATA
