"""The studies' tests are the second tier: `python -m pytest -q -m slow` runs them (pytest.ini). A child
process a test starts dies with it (tests/processes.py)."""

import pytest
from processes import processes_die_with_their_test, tracked_subprocesses  # noqa: F401 (autouse fixtures)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "studies" in item.path.parts:
            item.add_marker(pytest.mark.slow)
