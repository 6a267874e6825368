"""Every test here: a child process it starts dies with it (tests/processes.py)."""

from processes import processes_die_with_their_test, tracked_subprocesses  # noqa: F401 (autouse fixtures)
