"""
Unit tests of model.py beyond the equivalences: config validation, initialisation, probes, FLOP
accounting, generation and the `python model.py config/x.py` summary.

Run: python -m pytest -q test_model.py
"""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import GPT, GPTConfig, parse_layout

ROOT = Path(__file__).resolve().parent
TINY = dict(vocab_size=64, block_size=32, n_embd=32, n_head=4)


@pytest.mark.parametrize("layout", ["2+4R0+2", "abc", "-1+4R2+2", "2+0R2+2", "2+4R2", "2+4x2+2", ""])
def test_malformed_layout_quotes_the_string(layout):
    with pytest.raises(ValueError) as e:
        parse_layout(layout)
    assert repr(layout) in str(e.value) and "2+4R2+2" in str(e.value)


def test_layout_parses_and_sets_depths():
    assert parse_layout("2+4R2+2") == (2, 4, 2, 2)
    cfg = GPTConfig(**TINY, layout="3+6R3+3")
    assert (cfg.n_unique, cfg.n_unrolled) == (12, 24)
    assert GPTConfig(**TINY, n_layer=7).depth == (7, 0, 0, 0)


@pytest.mark.parametrize("fields,words", [
    (dict(layout="1+2R0+1"), ["'1+2R0+1'"]),
    (dict(state_mode="memory"), ["'memory'", "mesh"]),
    (dict(mesh_slots=1, layout="1+1R2+1", state_mode="mesh"), ["mesh_slots = 1", ">= 2"]),
    (dict(block_size=0), ["block_size = 0"]),
    (dict(flavour="gpt"), ["'gpt'", "llama"]),
    (dict(flavour="llama"), ["mlp_hidden"]),
    (dict(n_head=5), ["n_head (5)"]),
    (dict(t2mlr=True, n_layer=4, l_start=3, l_end=1), ["l_start = 3", "l_end = 1", "n_layer = 4"]),
    (dict(t2mlr=True, n_layer=4, l_start=0, l_end=4), ["l_end = 4"]),
    (dict(t2mlr=True, layout="1+2R2+1"), ["flat stack"]),
])
def test_config_errors_name_the_value(fields, words):
    with pytest.raises(ValueError) as e:
        GPTConfig(**{**TINY, **fields})
    for word in words:
        assert word in str(e.value)


def test_flavour_defaults():
    neox, llama = GPTConfig(**TINY), GPTConfig(**TINY, flavour="llama", mlp_hidden=48)
    assert (neox.bias, neox.tie_embeddings, neox.rope_pct, neox.mlp_hidden) == (True, False, 0.25, 128)
    assert (llama.bias, llama.tie_embeddings, llama.rope_pct) == (False, True, 1.0)
    assert GPTConfig(**TINY, n_layer=4, t2mlr=True, l_start=-3, l_end=-2).recurrent_layers == (1, 2)


def test_init_follows_the_recipe():
    """std sqrt(2/(5C)) everywhere, out projections / sqrt(2·unrolled depth), zero biases (mesh.md §3)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=512, block_size=32, n_embd=256, n_head=4, layout="2+2R3+2", state_mode="mesh")
    model = GPT(cfg)
    std = math.sqrt(2 / (5 * 256))
    assert abs(model.wte.weight.std().item() / std - 1) < 0.02
    assert abs(model.layers[0].attn.qkv.weight.std().item() / std - 1) < 0.02
    out_std = std / math.sqrt(2 * 10)
    for layer in model.layers:
        assert abs(layer.mlp.down.weight.std().item() / out_std - 1) < 0.05
        assert layer.attn.qkv.bias.abs().max() == 0
    assert model.lm_head.weight is not model.wte.weight             # neox: untied


def test_embeddings_are_scaled_by_sqrt_d():
    model = GPT(GPTConfig(**TINY, n_layer=1))
    probes = {}
    idx = torch.tensor([[3, 5]])
    model(idx, probes=probes)
    assert torch.allclose(probes["states"]["h_emb"], model.wte(idx) * math.sqrt(32))


def test_probes_collect_every_state_and_block():
    """Probes: h_emb, h(0)..h(K), h_out and one (input, output) pair per block application, without changing logits."""
    model = GPT(GPTConfig(**TINY, layout="2+1R3+1", state_mode="mesh")).eval()
    idx = torch.randint(0, 64, (2, 10))
    probes = {}
    logits = model(idx, probes=probes)[0]
    assert torch.equal(logits, model(idx)[0])
    assert list(probes["states"]) == ["h_emb", "h(0)", "h(1)", "h(2)", "h(3)", "h_out"]
    names = [name for name, _, _ in probes["blocks"]]
    assert names == ["prelude0", "prelude1", "core0", "core1", "core2", "coda0"]
    core1_in, core1_out = probes["blocks"][3][1:]
    assert torch.equal(core1_in, probes["states"]["h(1)"]) and not torch.equal(core1_out, core1_in)
    t2mlr = GPT(GPTConfig(**TINY, n_layer=4, t2mlr=True, l_start=1, l_end=2)).eval()
    probes = {}
    t2mlr(idx, probes=probes)
    assert [name for name, _, _ in probes["blocks"]] == ["lower0", "middle", "upper0"]


def test_flop_accounting_counts_unrolled_depth_and_sweeps():
    """A looped model costs like its unrolled vanilla twin; Jacobi costs D forward and b+1 backward middle passes."""
    vanilla = GPT(GPTConfig(**TINY, n_layer=6))
    looped = GPT(GPTConfig(**TINY, layout="1+2R2+1", state_mode="base"))
    assert vanilla.train_flops_per_token() == looped.train_flops_per_token()
    cfg = dict(TINY, n_layer=4, t2mlr=True, l_start=1, l_end=2, jacobi_iters=5, jacobi_grad_iters=2)
    t2mlr = GPT(GPTConfig(**cfg))
    assert t2mlr.layer_passes() == [(1, 1), (5, 3), (5, 3), (1, 1)]
    plain = GPT(GPTConfig(**TINY, n_layer=4))
    layer = plain.train_flops_per_token() - GPT(GPTConfig(**TINY, n_layer=3)).train_flops_per_token()
    per_pass = t2mlr.gate.proj.weight.numel() + t2mlr.gate.gates_r.weight.numel()    # W_p and the r half: every pass
    once = t2mlr.gate.gates_x.weight.numel() + t2mlr.gate.gates_x.bias.numel()       # the x half: once per forward
    expected = (plain.train_flops_per_token() + 2 * (5 - 1 + 2 * (3 - 1)) * layer / 3
                + 2 * (5 + 2 * 3) * per_pass + 6 * once)
    assert t2mlr.train_flops_per_token() == pytest.approx(expected)


def test_generate_greedy_matches_argmax_of_full_forward():
    """Greedy generation with the KV cache picks, at every step, the argmax of a full recompute."""
    torch.manual_seed(0)
    for fields in (dict(layout="1+1R2+1", state_mode="mesh"), dict(n_layer=3, t2mlr=True, l_start=1, l_end=1)):
        model = GPT(GPTConfig(**TINY, **fields)).eval()
        if model.gate is not None:
            with torch.no_grad():
                model.gate.theta_r.fill_(0.5)
        idx = torch.randint(0, 64, (2, 5))
        out = model.generate(idx, 12, temperature=0)
        for t in range(5, 17):
            assert torch.equal(model(out[:, :t])[0][:, -1].argmax(-1), out[:, t])


def test_generate_beyond_block_size_and_top_k():
    """Generation continues past block_size (the cache is rebuilt) and top_k=1 equals greedy; top_k > vocab is clamped."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, n_layer=2)).eval()
    idx = torch.randint(0, 64, (1, 40))                          # longer than block_size 32: cropped
    out = model.generate(idx, 30, temperature=0)
    assert out.shape == (1, 70) and torch.equal(out[:, :40], idx)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(model.generate(idx[:, :8], 10, temperature=1.0, top_k=1, generator=g),
                       model.generate(idx[:, :8], 10, temperature=0))
    assert model.generate(idx[:, :8], 3, top_k=10_000, generator=g).shape == (1, 11)


def test_cache_overflow_and_long_input_raise():
    model = GPT(GPTConfig(**TINY, n_layer=1))
    with pytest.raises(ValueError, match="exceeds block_size = 32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="mode 'fast'"):
        GPT(GPTConfig(**TINY, n_layer=2, t2mlr=True))(torch.zeros(1, 3, dtype=torch.long), mode="fast")


def test_optimizer_decays_only_matrices():
    model = GPT(GPTConfig(**TINY, n_layer=2, t2mlr=True))
    decay, no_decay = model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert any(p is model.gate.theta_r for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_summary_cli_prints_paper_counts():
    """`python model.py config/mesh_160m.py` prints 56,704,512 non-embedding and 23,070 router parameters."""
    out = subprocess.run([sys.executable, "model.py", "config/mesh_160m.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "56,704,512" in out.stdout and "23,070" in out.stdout and "unrolled depth     12" in out.stdout
    bad = subprocess.run([sys.executable, "model.py", "config/mesh_160m.py", "--layout=2+4R0+2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "'2+4R0+2'" in bad.stderr


def test_t2mlr_gate_initialisation():
    """Reference init (t2mlr.md §1): θ = 0 (identity), A_r/A_x xavier-normal gain 1 = std sqrt(2/(3C)),
    biases U(±1/sqrt(2C)), W_p the Linear default U(±1/sqrt(C)); 5C² + 2C + 2 parameters."""
    torch.manual_seed(0)
    C = 256
    model = GPT(GPTConfig(vocab_size=64, block_size=16, n_embd=C, n_head=4, n_layer=3, t2mlr=True, l_start=1, l_end=1))
    gate = model.gate
    assert gate.theta_r.item() == 0 and gate.theta_x.item() == 0
    for weight in (gate.gates_x.weight, gate.gates_r.weight):
        assert abs(weight.std().item() / math.sqrt(2 / (3 * C)) - 1) < 0.02
    assert gate.gates_x.bias.abs().max() <= 1 / math.sqrt(2 * C) and gate.gates_x.bias.std() > 0.5 / math.sqrt(6 * C)
    assert gate.proj.weight.abs().max() <= 1 / math.sqrt(C) and gate.proj.weight.std() > 0.9 / math.sqrt(3 * C)
    assert model.param_counts()["gate"] == 5 * C * C + 2 * C + 2
    x = torch.randn(2, 5, C)
    assert torch.equal(gate(x, torch.randn(2, 5, C)), x)


def test_rotary_is_a_relative_position_encoding():
    """Rotary (NeoX/LLaMA rotate-half form): the score q·k depends only on the offset between positions,
    position 0 is the identity, and the rotated dims keep their norm; the pass-through dims are untouched."""
    from model import apply_rotary, rotary_tables
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)
    for pct in (1.0, 0.25):
        cos, sin = (t.double() for t in rotary_tables(16, pct, 10000.0, 40))
        rot = lambda x, p: apply_rotary(x, cos[p:p + 1], sin[p:p + 1])
        score = lambda m, n: (rot(q, m) * rot(k, n)).sum()
        assert torch.allclose(score(7, 3), score(30, 26)) and torch.allclose(score(0, 9), score(11, 20))
        assert not torch.allclose(score(7, 3), score(7, 4))
        assert torch.equal(rot(q, 0), q)
        r = cos.shape[-1]
        assert torch.allclose(rot(q, 13)[..., :r].norm(), q[..., :r].norm())
        assert torch.equal(rot(q, 13)[..., r:], q[..., r:])
