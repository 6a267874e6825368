"""
Stopping loses nothing: SIGINT (Ctrl-C) or SIGTERM (a scheduler's stop) during training saves the step
it stopped at, between two checkpoints, and exits with one line naming the command that resumes; the
resumed run ends with weights bit-equal to a run never stopped. Under one process and under torchrun
with 2 CPU processes (every rank stops at the same step), at a fixed depth and with random-depth
training (the loop count of each step is drawn from the step alone, so the resumed run draws the same).

    python -m pytest -q tests/test_interrupt.py
"""

import json
import os
import random
import re
import signal
import subprocess
import sys

import pytest
import torch

from test_train import ROOT, TINY, write_dataset

STEPS = 150                                  # eval_interval above it: checkpoints only at 0 and STEPS
ARGS = [*TINY, "--dataset=fox", "--bias=False", f"--max_iters={STEPS}", "--eval_interval=100000",
        "--log_interval=1", "--warmup_iters=2"]


RANDOM_DEPTH = ["--layout=1+1R2+1", "--state_passing=mesh", "--loops_sampler=uniform", "--max_loops=4",
                "--loops_backprop=2"]     # a loop count drawn per step (MeSH: some routers idle at a step)


def command(torchrun, out_dir, extra=()):
    launch = [sys.executable] + (["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
                                 if torchrun else [])
    return launch + [os.path.join(ROOT, "train.py"), *ARGS, *extra, f"--out_dir={out_dir}"]


def run(cmd, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def interrupt(cmd, cwd, sig, at_step):
    """Start cmd, send `sig` once it has logged step `at_step`; (its stdout, its exit code)."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(f"step {at_step}:"):
            os.kill(proc.pid, sig)
            break
    out = proc.communicate(timeout=300)[0]
    return "".join(lines) + out, proc.returncode


def weights(out_dir):
    return torch.load(os.path.join(out_dir, "ckpt.pt"), weights_only=True)


@pytest.mark.parametrize("sig, torchrun, extra", [
    (signal.SIGINT, False, ()),                                           # the first tier: Ctrl-C
    pytest.param(signal.SIGTERM, False, (), marks=pytest.mark.slow),      # the rest: a scheduler's SIGTERM, DDP
    pytest.param(signal.SIGINT, True, (), marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, True, (), marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, False, RANDOM_DEPTH, marks=pytest.mark.slow),
    pytest.param(signal.SIGINT, True, RANDOM_DEPTH, marks=pytest.mark.slow)],
    ids=["SIGINT-one process", "SIGTERM-one process", "SIGINT-torchrun x2", "SIGTERM-torchrun x2",
         "SIGINT-one process-random depth", "SIGINT-torchrun x2-random depth"])
def test_a_stopped_run_saves_its_step_and_resumes_bit_equal(tmp_path, sig, torchrun, extra):
    write_dataset(tmp_path / "data" / "fox")
    at_step = random.Random(f"{sig}{torchrun}").randrange(20, 80)     # between the two checkpoints
    run(command(torchrun, "whole", extra), tmp_path)
    out, code = interrupt(command(torchrun, "stopped", extra), tmp_path, sig, at_step)
    assert code != 0, out
    assert "params: total" in out and re.search(r"first micro-step .* ETA [\d.]+ (min|h) for \d+ steps", out)
    stopped = re.findall(r"stopped at step (\d+) \(saved in (\S+)\); resume with: (.+)", out)
    assert len(stopped) == 1, out
    step, path, resume = stopped[0]
    step = int(step)
    assert at_step < step < STEPS and os.path.samefile(tmp_path / path, tmp_path / "stopped" / "ckpt.pt")
    assert weights(tmp_path / "stopped")["step"] == step                # the checkpoint holds that step
    assert "--init_from=resume" in resume and ("torchrun" in resume) == torchrun
    resumed_out = run(command(torchrun, "stopped", extra) + ["--init_from=resume"], tmp_path)
    assert f"at step {step}: {STEPS - step} steps to go" in resumed_out          # the resume says where
    whole, resumed = weights(tmp_path / "whole"), weights(tmp_path / "stopped")
    assert resumed["step"] == whole["step"] == STEPS
    assert all(torch.equal(whole["model"][k], resumed["model"][k]) for k in whole["model"])
    if extra:                                           # the draws varied, and the resumed run drew the same
        rows = [json.loads(line) for line in open(tmp_path / "whole" / "log.jsonl")]
        assert len({n for r in rows for n in r.get("loops", [])}) > 1


def test_a_signal_while_saving_leaves_a_whole_checkpoint(tmp_path):
    """The handler only notes a second signal: save_checkpoint runs to its end (loadable, that step)."""
    from support.runtime import StopRequest
    from support.checkpoints import save_checkpoint, load_checkpoint
    stop = StopRequest(master=False)
    try:
        big = {"model": {"w": torch.randn(2000, 2000)}, "step": 7}
        os.kill(os.getpid(), signal.SIGINT)             # the first: noted
        save_checkpoint(str(tmp_path / "ckpt.pt"), big | {"note": os.kill(os.getpid(), signal.SIGINT)})
        assert stop.flag and load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 7
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
