"""One definition of a control character (Unicode Cc: C0, DEL, C1), applied everywhere."""

from __future__ import annotations

import sys
import unicodedata

import pytest

from sbxkit._consumers import grants
from sbxkit._grammar import profile
from sbxkit._model.predicates import has_control
from sbxkit._model.spec import validate_workdir
from sbxkit.backends import sbx_commands
from sbxkit.errors import SpecError

CONTROLS = ["\x00", "\x1b", "\x7f", "\x85", "\x9b"]  # NUL, ESC, DEL, NEL (C1), CSI (C1)


@pytest.mark.parametrize("ch", CONTROLS)
def test_c0_del_and_c1_are_control_characters(ch: str) -> None:
    assert has_control(f"a{ch}b")


@pytest.mark.parametrize("text", ["plain", "ünïcödé", "tab\u00a0nbsp", "", "日本"])
def test_printable_text_is_not(text: str) -> None:
    assert not has_control(text)


def test_control_is_exactly_unicode_category_cc() -> None:
    """The regex behind ``has_control`` agrees with ``unicodedata`` on every code point."""
    for code in range(sys.maxunicode + 1):
        ch = chr(code)
        assert has_control(ch) == (unicodedata.category(ch) == "Cc"), hex(code)


@pytest.mark.parametrize("ch", CONTROLS)
def test_every_rule_refuses_the_same_characters(ch: str) -> None:
    """C1 used to pass in the supervisor binary, sbx arguments and grant names."""
    checks = [
        lambda: profile._check_absolute("supervisor.binary", f"/usr/bin/x{ch}"),
        lambda: sbx_commands.check_binary(f"/opt/sbx{ch}"),
        lambda: sbx_commands.check_create_args(["--memory", f"8g{ch}"]),
        lambda: grants._check_name("outputs[0].name", f"out{ch}.txt"),
        lambda: validate_workdir(f"/work{ch}", "workdir"),
    ]
    for check in checks:
        with pytest.raises(SpecError, match="control characters"):
            check()
