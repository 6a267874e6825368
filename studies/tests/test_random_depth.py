"""studies/random_depth.py: bits per byte equals the model's own loss over ln 2, an exit threshold no state
change reaches runs one loop everywhere (and gives the one-loop bits), the p-hop exit curve of a saved run
moves from few loops to max_loops, and the summary pairs random depth with fixed depth seed by seed."""

import math
import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from model import GPT, GPTConfig
from studies import phop, random_depth
from support.checkpoints import save_checkpoint


def tiny_mesh(max_loops=6):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=64, block_size=32, n_embd=32, n_head=4, layout="1+1R2+1",
                         state_passing="mesh", max_loops=max_loops)).eval()


def test_bits_per_byte_is_the_models_loss_over_ln2_and_exits_count_loops():
    model, val = tiny_mesh(), np.random.default_rng(0).integers(0, 64, 200).astype(np.uint16)
    bits, loops = random_depth.lm_bits_per_byte(model, val, block=32, n_loops=3)
    x = torch.from_numpy(val[:32 * 6].astype(np.int64)).view(6, 32)
    y = torch.from_numpy(val[1:32 * 6 + 1].astype(np.int64)).view(6, 32)
    with torch.no_grad():
        loss = model(x, y, n_loops=3)[1].item()
    assert bits == pytest.approx(loss / math.log(2), rel=1e-6) and loops == 3
    one = random_depth.lm_bits_per_byte(model, val, block=32, n_loops=1)[0]
    bits, loops = random_depth.lm_bits_per_byte(model, val, block=32, n_loops=6, exit_threshold=1e9)
    assert loops == 1 and bits == pytest.approx(one, rel=1e-6)
    assert random_depth.lm_bits_per_byte(model, val, block=32, n_loops=6, exit_threshold=0.0)[1] == 6


def test_phop_exit_curve_of_a_saved_run(tmp_path, monkeypatch):
    run = dict(arm="base", n=16, width=32, p=2, max_loops=6, name="base_K4_p2_n16_s0_poisson_lognormal")
    torch.manual_seed(0)
    model = GPT(replace(phop.model_config("base", 4, None, 16, 32), max_loops=6))
    monkeypatch.setattr(random_depth, "PHOP_CKPTS", str(tmp_path))
    save_checkpoint(os.path.join(tmp_path, run["name"] + ".pt"), dict(model=model.state_dict()))
    monkeypatch.setattr(random_depth, "THRESHOLDS", (1e9, 0.0))
    curve = random_depth.phop_exits(run)
    assert [c["mean_loops"] for c in curve] == [1, 6]
    X, y = phop.eval_set(16, 2)
    with torch.no_grad():
        assert curve[1]["accuracy"] == phop.accuracy(lambda X: model.eval()(X, n_loops=6), X, y)


def test_summary_pairs_random_with_fixed_by_seed():
    def run(seed, acc):
        return dict(test_time_K={str(k): acc + 0.01 * k for k in phop.MEASURED_KS}, steps_to_learn=100 * seed)
    runs = {("base", "fixed"): {0: run(0, 0.1), 1: run(1, 0.2), 2: run(2, 0.3)},
            ("base", "poisson_lognormal"): {0: run(0, 0.5), 1: run(1, 0.4), 2: run(2, 0.9)}}
    doc = random_depth.summarise(runs, [])
    s = doc["phop_random_minus_fixed"]["base"]["8"]
    assert s["n"] == 3 and s["diff"] == pytest.approx((0.4 + 0.2 + 0.6) / 3)
    assert doc["phop_accuracy_at_K"]["base fixed"]["4"] == pytest.approx(0.24)
    assert doc["phop_gain_16_minus_4"]["base"] == pytest.approx({0: 0.12, 1: 0.12, 2: 0.12})
    assert "| base | +0.400 [" in random_depth.markdown(doc)


def test_exit_is_compared_with_fixed_depth_at_equal_mean_loops(monkeypatch):
    at_K = {"1": 0.5, "2": 0.7, "4": 0.9, "8": 0.8}
    assert random_depth.at_equal_loops(3.0, at_K) == pytest.approx(0.8)      # halfway from K' = 2 to 4
    assert random_depth.at_equal_loops(6.0, at_K) == pytest.approx(0.85)
    curves = {0: [dict(mean_loops=3.0, accuracy=0.9)], 1: [dict(mean_loops=1.5, accuracy=0.7)]}
    monkeypatch.setattr(random_depth, "THRESHOLDS", (0.3,))
    (row,) = random_depth.exit_table(curves, {0: at_K, 1: at_K}, "accuracy")
    assert row["mean_loops"] == pytest.approx(2.25) and row["value"] == pytest.approx(0.8)
    assert row["minus_fixed"]["diff"] == pytest.approx(((0.9 - 0.8) + (0.7 - 0.6)) / 2)
