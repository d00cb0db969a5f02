"""The docs run as written (issue 25): every python, sh and console block of README.md and
docs/*.md runs against the real engine, with the test images, and the witness proves it left
no container behind (tests/doc_blocks.py states the convention; data blocks and signatures are
checked in tests/unit/test_doc_blocks.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.doc_blocks import ROOT, Block, all_blocks
from tests.doc_runs import DocState, block_fixtures, run_python, run_shell
from tests.witness import Witness

RUNNABLE = [
    b
    for b in all_blocks(errors=[])  # tests/unit/test_doc_blocks.py reports those
    if b.lang in ("python", "sh", "console") and b.skip is None and not b.fixture("signature")
]


@pytest.fixture(scope="module")
def state() -> Iterator[DocState]:
    shared = DocState()
    yield shared
    shared.close()


def test_the_docs_have_blocks_to_run() -> None:
    assert len(RUNNABLE) >= 20
    assert {b.lang for b in RUNNABLE} >= {"python", "sh"}


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.id)
def test_a_doc_block_runs_as_written(
    block: Block, state: DocState, witness: Witness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The blocks' sbxkit (in this process and in their shells) talks to the witness's daemon.
    monkeypatch.setenv("DOCKER_HOST", f"unix://{witness.socket_path}")
    with block_fixtures(block, state, witness, ROOT):
        if block.lang == "python":
            run_python(block, state, ROOT)
        else:
            run_shell(block, state)
