"""The studies' tests are the second tier: `python -m pytest -q -m slow` runs them (pytest.ini)."""

import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "studies" in item.path.parts:
            item.add_marker(pytest.mark.slow)
