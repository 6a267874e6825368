"""
studies/state_probe.py: each ablation of the state T²MLR tokens read (carry off, reset every k, reset at p)
against a direct loop written here, and the command line on a tiny checkpoint (float64 where exact); bad input
(no sequences, a zero length, a bare checkpoint) is a RunError naming it.
"""

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

from model import GPT, GPTConfig
from studies import state_probe
from support.runtime import RunError
from test_equivalence import gate_direct, update_direct
from test_sample import write_run

CFG = dict(vocab_size=64, block_size=24, n_embd=32, n_head=4, flavour="llama", n_kv_head=2, mlp_hidden=48,
           n_layer=4, t2mlr=True, l_start=1, l_end=2)


def build(**kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**(CFG | kw))).double().eval()
    with torch.no_grad():
        model.gate.theta_r.fill_(0.8)          # the state matters
        model.gate.theta_x.fill_(-0.2)
    return model


def direct_logits(model, idx, resets):
    """The O(T²) loop over the full stack: token t reads zero where resets(t), else R_{t-1}; R_t from h_t and
    what token t read (gate_direct and update_direct, written apart from model.py)."""
    cfg = model.cfg
    B, T = idx.shape
    read, last, logits = [], torch.zeros(B, 1, cfg.n_embd, dtype=torch.float64), []
    for t in range(T):
        read.append(torch.zeros_like(last) if resets(t) else last)          # what token t reads
        h = model.run_layers(model.wte(idx[:, :t + 1]) * cfg.n_embd ** 0.5, model.lower, 0)
        h = model.run_layers(gate_direct(model.gate, h, torch.cat(read, dim=1)), model.middle, 0)
        last = update_direct(h[:, -1:], read[-1], cfg.recurrent_residual)   # R_t
        logits.append(model.lm_head(model.ln_f(model.run_layers(h, model.upper, 0)))[:, -1:])
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("residual", [True, False])
def test_every_ablation_equals_the_direct_loop(residual):
    model = build(recurrent_residual=residual)
    idx = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        exact = model(idx, mode="exact")[0]
        for name, resets in state_probe.ablations(20, reset_at=7).items():
            got = state_probe.ablated_logits(model, idx, resets)
            assert (got - direct_logits(model, idx, resets)).abs().max() <= 1e-12, name
            if name == "none":
                assert (got - exact).abs().max() <= 1e-12
            else:                                   # an ablation changes the logits where it acts, not before
                first = next(t for t in range(1, 20) if resets(t))
                assert torch.equal(got[:, :first], state_probe.ablated_logits(model, idx[:, :first], resets))
                assert (got[:, first:] - exact[:, first:]).abs().max() > 1e-6, name
                assert (got[:, :first] - exact[:, :first]).abs().max() <= 1e-12, name
        carry_off = state_probe.ablated_logits(model, idx, lambda t: True)
        assert torch.equal(carry_off, state_probe.ablated_logits(model, idx, lambda t: t % 1 == 0))


def test_state_probe_reports_deltas_and_distances():
    model = build()
    g = torch.Generator().manual_seed(2)
    idx, targets = torch.randint(0, 64, (3, 20), generator=g), torch.randint(0, 64, (3, 20), generator=g)
    result = state_probe.state_probe(model, idx, targets, reset_at=5, accuracy=True)
    rows = result["ablations"]
    assert list(rows) == ["none", "carry off", "reset every 1", "reset every 8", "reset at 5"]
    assert rows["none"]["delta"] == 0 and rows["carry off"]["loss"] == rows["reset every 1"]["loss"]
    losses = state_probe.token_losses(model(idx, mode="exact")[0], targets)
    assert abs(rows["none"]["loss"] - losses.mean().item()) <= 1e-10
    by_pos = rows["reset at 5"]["loss_by_position"]
    assert by_pos[:5] == pytest.approx(rows["none"]["loss_by_position"][:5], abs=1e-10)
    assert len(result["delta_by_distance"]) == 15
    assert result["delta_by_distance"][0] == pytest.approx(by_pos[5] - rows["none"]["loss_by_position"][5])
    assert 0 <= rows["none"]["accuracy"] <= 1 and len(rows["none"]["accuracy_by_position"]) == 20


def test_command_line_on_a_tiny_checkpoint(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 400), ("val", 400)):
        rng.integers(0, 60, n).astype(np.uint16).tofile(data / f"{split}.bin")
    (data / "meta.json").write_text(json.dumps({"vocab_size": 60, "dtype": "uint16", "train_tokens": 400,
                                                "val_tokens": 400}))
    model = build().float()
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "model_config": asdict(model.cfg),
                "train_config": {"dataset": "tiny", "data_dir": str(data), "batch_size": 4}, "tokenizer": "byte"},
               path)
    result = state_probe.main([str(path), "--num_seqs", "4", "--seq_len", "16", "--reset_at", "4"])
    saved = json.loads((tmp_path / "state_probe.json").read_text())
    assert saved["ablations"].keys() == result["ablations"].keys() and saved["reset_at"] == 4
    assert saved["ablations"]["carry off"]["delta"] != 0
    vanilla = GPT(GPTConfig(**(CFG | dict(t2mlr=False))))
    torch.save({"model": vanilla.state_dict(), "model_config": asdict(vanilla.cfg),
                "train_config": {"data_dir": str(data)}, "tokenizer": "byte"}, tmp_path / "v.pt")
    with pytest.raises(state_probe.RunError, match="is not a T²MLR model"):
        state_probe.main([str(tmp_path / "v.pt")])


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
