"""PEP 561: sbxkit ships ``py.typed`` so callers' type checkers read its annotations
(what they then refuse is pinned in tests/typing, checked by ``./dev typecheck``)."""

from __future__ import annotations

import tomllib
from importlib.resources import files
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_package_has_a_py_typed_marker() -> None:
    assert files("sbxkit").joinpath("py.typed").is_file()


def test_the_marker_is_declared_as_package_data_so_wheels_carry_it() -> None:
    config = tomllib.loads(PYPROJECT.read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["sbxkit"]
