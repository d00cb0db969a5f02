"""What the README and the help say, held against the code (issue 25, item 7): the ``--json``
keys, ``sbxkit batch``'s exit statuses, and help texts free of reStructuredText markup. The
code blocks themselves run in tests/unit/test_doc_blocks.py and tests/engine/test_docs.py."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from sbxkit._grammar.result_doc import ErrorResultDoc, ResultDoc
from sbxkit.cli import build_parser
from sbxkit.cli.batch import EPILOG, EXIT_CLEANUP_FAILED, EXIT_JOB_ERRORS, EXIT_OK
from tests.unit.test_flag_placement import every_parser

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
CLI_DOC = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
"""The command line's reference, moved out of the README (issue 43, item 12)."""


BATCH_ONLY = ("id", "node", "attempt")
"""The keys a batch line adds to ``sbxkit run --json``'s (``node`` and ``attempt``: a cluster's)."""


def test_the_cli_doc_lists_every_json_key() -> None:
    sentence = CLI_DOC[CLI_DOC.index("`--json` prints one object:") :].split("\nOn an error")[0]
    listed = re.findall(r"`([a-z_0-9]+)`", sentence)
    assert listed == [key for key in ResultDoc.__struct_fields__ if key not in BATCH_ONLY]


def test_the_cli_doc_tables_every_result_key_and_the_error_shape() -> None:
    """One shape for ``run --json`` and batch lines, documented once (issue 43, item 10)."""
    section = CLI_DOC[CLI_DOC.index("### Results as JSON") :]
    table = section[: section.index("An error (")]
    cells = re.findall(r"^\| (`[^|]+)\|", table, re.M)
    tabled = [key for cell in cells for key in re.findall(r"`([a-z_0-9]+)`", cell)]
    assert tabled == [key for key in ResultDoc.__struct_fields__ if key not in BATCH_ONLY]
    error = section[section.index("An error (") :].split("```json")[0]
    said = set(re.findall(r"`([a-z_]+)`", error))
    assert set(ErrorResultDoc.__struct_fields__) - set(BATCH_ONLY) <= said


def test_the_cli_doc_says_batchs_exit_statuses() -> None:
    said = CLI_DOC[CLI_DOC.index("`sbxkit batch` exits") :].split("\n\n")[0]
    assert f"exits {EXIT_OK} when every job ran" in said
    assert f"{EXIT_JOB_ERRORS} when some job could not run" in said
    assert f"{EXIT_CLEANUP_FAILED} when a sandbox's removal failed" in said
    assert f"{EXIT_JOB_ERRORS} some job could not run" in EPILOG  # and so does --help


@pytest.mark.parametrize("parser", list(every_parser(build_parser())), ids=lambda p: p.prog)
def test_help_is_terminal_text_not_rst(parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    assert "``" not in text
    assert ":func:" not in text
