"""
A test's child processes never outlive it. Every process a test starts through subprocess (train.py,
prepare_data.py, sample.py, torchrun and its ranks) starts as the leader of its own process group, and
when the test ends, passed, failed or timed out, whatever is left of that group is killed, so no orphan
holds a lock, a port or a core for the next test. tests/conftest.py and studies/tests/conftest.py use it.
"""

import os
import signal
import subprocess

import pytest


class TrackedPopen(subprocess.Popen):
    """subprocess.Popen (and so subprocess.run) recording what it started, each in its own process group."""
    started = []

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("start_new_session", True)
        super().__init__(*args, **kwargs)
        TrackedPopen.started.append(self)


def kill_group(proc):
    """SIGKILL to every process still in proc's process group (its id is proc's pid), then reap proc."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):   # the whole group has already exited
        pass
    proc.wait()


@pytest.fixture(scope="session", autouse=True)
def tracked_subprocesses():
    """From the start of the test run, so module-scoped fixtures' processes are tracked too."""
    original, subprocess.Popen = subprocess.Popen, TrackedPopen
    yield
    subprocess.Popen = original


@pytest.fixture(autouse=True)
def processes_die_with_their_test(tracked_subprocesses):
    yield
    while TrackedPopen.started:
        kill_group(TrackedPopen.started.pop())
