"""
studies.state_probe on input that used to end in a traceback: no sequences, a zero length, a bare checkpoint.
"""
import os

import pytest

from studies import state_probe
from support.runtime import RunError
from test_robust_sample import write_run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = dict(vocab_size=320, block_size=16, n_layer=2, n_embd=32, n_head=2)


def test_state_probe_refuses_no_sequences_and_a_zero_length(tmp_path):
    path = str(write_run(tmp_path / "t2mlr", flavour="llama", mlp_hidden=48, t2mlr=True, l_start=0, l_end=0)
               / "ckpt.pt")
    with pytest.raises(RunError, match=r"^--num_seqs 0 must be >= 1 \(validation windows to probe\)$"):
        state_probe.main([path, "--num_seqs", "0"])
    with pytest.raises(RunError, match=r"^--num_seqs -3 must be >= 1"):
        state_probe.main([path, "--num_seqs=-3"])
    with pytest.raises(RunError, match=r"^--seq_len 0 must be in \[2, block_size = 16\]$"):
        state_probe.main([path, "--seq_len", "0"])
    write_run(tmp_path / "bare", drop=("train_config",), flavour="llama", mlp_hidden=48, t2mlr=True, l_start=0,
              l_end=0)
    with pytest.raises(RunError, match=r"bare/ckpt.pt lacks train_config: it is not a complete checkpoint"):
        state_probe.main([str(tmp_path / "bare" / "ckpt.pt")])
