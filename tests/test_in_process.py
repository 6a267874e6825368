"""
A script's main called in-process (a notebook, a test) leaves the process as it found it
(support/process.py): the caller's Ctrl-C and SIGTERM handlers, environment, working directory, global RNGs
and torch's settings, after a finished run and after a run stopped by SIGINT. And prepare_data.py's worker
pool never forks its caller, so it completes after torch has run multi-threaded work.

    python -m pytest -q tests/test_in_process.py
"""

import os
import random
import signal

import numpy as np
import pytest
import torch

import prepare_data
import sample
import train
from test_train import TINY, write_dataset


def callers_handler(signum, frame):         # a caller's own handler: what must be there again afterwards
    raise AssertionError(f"the caller's handler got signal {signum}")


@pytest.fixture
def caller(monkeypatch):
    """The process as a caller set it up: its own handlers, thread count, seeds, environment variable."""
    previous = {sig: signal.signal(sig, callers_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    monkeypatch.setenv("CALLERS_VARIABLE", "kept")
    yield
    torch.set_num_threads(threads)
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def process_state():
    return {"SIGINT": signal.getsignal(signal.SIGINT), "SIGTERM": signal.getsignal(signal.SIGTERM),
            "threads": torch.get_num_threads(), "dtype": torch.get_default_dtype(), "cwd": os.getcwd(),
            "environ": dict(os.environ), "torch": torch.get_rng_state(), "numpy": np.random.get_state()[1],
            "random": random.getstate()}


def assert_same(before, after):
    assert after["SIGINT"] is callers_handler and after["SIGTERM"] is callers_handler
    for key in ("threads", "dtype", "cwd", "environ", "random"):
        assert after[key] == before[key], key
    assert torch.equal(after["torch"], before["torch"]) and np.array_equal(after["numpy"], before["numpy"])


def test_train_and_sample_in_process_leave_the_callers_handlers_and_state(tmp_path, caller):
    write_dataset(tmp_path / "fox")
    before = process_state()
    train.main([*TINY, f"--data_dir={tmp_path / 'fox'}", "--max_iters=3", f"--out_dir={tmp_path / 'run'}"])
    assert_same(before, process_state())
    sample.main([f"--out_dir={tmp_path / 'run'}", "--max_new_tokens=5", "--device=cpu"])
    assert_same(before, process_state())


def test_a_run_stopped_by_sigint_in_process_saves_and_gives_back_the_handlers(tmp_path, caller, monkeypatch):
    write_dataset(tmp_path / "fox")
    get_lr = train.get_lr

    def ctrl_c_at_step_2(step, cfg):         # Ctrl-C during step 2: the run stops before step 3
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return get_lr(step, cfg)

    monkeypatch.setattr(train, "get_lr", ctrl_c_at_step_2)
    before = process_state()
    with pytest.raises(SystemExit) as stopped:
        train.main([*TINY, f"--data_dir={tmp_path / 'fox'}", "--max_iters=10", "--eval_interval=100",
                    f"--out_dir={tmp_path / 'run'}"])
    assert stopped.value.code == 130
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)["step"] == 3
    assert_same(before, process_state())
    with pytest.raises(AssertionError, match="the caller's handler got signal 2"):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C reaches the caller again


def test_prepare_data_pool_completes_after_torch_threads_and_equals_one_process(tmp_path):
    torch.set_num_threads(2)
    a = torch.randn(256, 256)
    for _ in range(20):                      # torch's OpenMP pool now has live threads (and their locks)
        a = torch.tanh(a @ a)
    texts = [f"document {i}: " + "the fox " * (i % 17 + 1) for i in range(300)]
    src = tmp_path / "in.txt.jsonl"
    src.write_text("".join('{"text": "%s"}\n' % t for t in texts))
    out = {}
    for n in (1, 2):
        prepare_data.main(["--input", str(src), "--tokenizer", "byte", "--name", f"p{n}", "--out_dir",
                           str(tmp_path), "--num_proc", str(n)])
        out[n] = [(tmp_path / f"p{n}" / f"{split}.bin").read_bytes() for split in ("train", "val")]
    assert out[1] == out[2] and len(out[1][0]) > 0
