"""
A run that is killed never loses or corrupts its work: a tiny train.py run is killed with SIGKILL at 20
random moments (saves included: it saves at every step), relaunched each time, and after every kill its
checkpoint loads; the resumed run's training losses equal an uninterrupted run's, bit for bit, each step
logged once. Also: a second run on the same out_dir is refused in one line naming the first one's pid.

    python -m pytest -q tests/test_fault_injection.py
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from support.checkpoints import load_checkpoint
from test_train import ROOT, TINY, read_log, write_dataset

RUN = [*TINY, "--dataset=fox", "--max_iters=10", "--eval_interval=1"]


def launch(out_dir, cwd, resume, *more):
    cmd = [sys.executable, os.path.join(ROOT, "train.py"), *RUN, f"--out_dir={out_dir}", *more]
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd + (["--init_from=resume"] if resume else []), cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def train_losses(out_dir):
    rows = [r for r in read_log(out_dir) if "loss" in r]
    assert len({r["step"] for r in rows}) == len(rows), "a step logged twice"
    return {r["step"]: r["loss"] for r in rows}


@pytest.mark.slow
def test_twenty_kills_lose_nothing_and_change_no_loss(tmp_path):
    write_dataset(tmp_path / "data" / "fox")
    whole = launch("whole", tmp_path, resume=False)
    t0 = time.time()
    assert whole.wait(timeout=300) == 0, whole.stderr.read()
    seconds = time.time() - t0                             # the whole run, start-up included
    want = train_losses(tmp_path / "whole")
    assert sorted(want) == list(range(10))

    rng, kills, rounds = random.Random(0), 0, 0
    while kills < 20:                     # rounds: a fresh out_dir killed until it finishes, then compared
        rounds += 1
        name = f"killed{rounds}"
        out = tmp_path / name
        ckpt = out / "ckpt.pt"
        for _ in range(200):
            # whatever the moment of the last kill, the checkpoint loads; one at step 10 is a finished run
            # (killed after its final save: a resume would say there is nothing to train)
            if ckpt.exists() and load_checkpoint(str(ckpt))["step"] == 10:
                break
            proc = launch(name, tmp_path, resume=ckpt.exists())
            try:
                proc.wait(timeout=rng.uniform(0.2, 0.9) * seconds)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                kills += 1
                continue
            assert proc.returncode == 0, proc.stderr.read()
            break
        else:
            raise AssertionError(f"{name} never finished in 200 launches")
        assert train_losses(out) == want                   # bit for bit: the floats as JSON wrote them
        assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    assert kills >= 20


def test_a_second_run_on_the_same_out_dir_is_refused_naming_the_first(tmp_path):
    write_dataset(tmp_path / "data" / "fox")
    ckpt = tmp_path / "run" / "ckpt.pt"
    first = launch("run", tmp_path, False, "--max_iters=100000")     # still running when the second starts
    try:
        deadline = time.time() + 120
        while not ckpt.exists() and time.time() < deadline:
            time.sleep(0.1)
        second = launch("run", tmp_path, resume=False)
        assert second.wait(timeout=120) != 0
        err = second.stderr.read().strip()
        assert err.count("\n") == 0 and f"pid {first.pid}" in err, err      # not "ckpt.pt exists"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    step = load_checkpoint(str(ckpt))["step"]
    again = launch("run", tmp_path, True, f"--max_iters={step + 2}")   # kill -9 left no stale lock
    assert again.wait(timeout=300) == 0, again.stderr.read()
    assert load_checkpoint(str(ckpt))["step"] == step + 2
