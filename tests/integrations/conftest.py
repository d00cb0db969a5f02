"""Agent frameworks' own test suites are asyncio code (pytest-asyncio); this project runs
pytest-trio's ``trio_mode``, which marks every coroutine test for trio. A test that asks for
asyncio (``pytest.mark.asyncio``) keeps it: trio's automatic mark is taken off it again."""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)  # after pytest-trio's own collection hook has marked the items
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("asyncio") is not None:
            item.own_markers[:] = [mark for mark in item.own_markers if mark.name != "trio"]
