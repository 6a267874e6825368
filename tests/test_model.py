"""
Unit tests of model.py beyond the equivalences: config validation, initialisation, probes, FLOP
accounting, generation and the `python model.py config/x.py` summary.

Run: python -m pytest -q test_model.py
"""

import dataclasses
import difflib
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import model as model_module
from model import GPT, GPTConfig, InferenceCache
from support.accounting import layer_passes, param_counts, train_flops_per_token
from support.loop import configure_optimizers

ROOT = Path(__file__).resolve().parent.parent
TINY = dict(vocab_size=64, block_size=32, n_embd=32, n_head=4)


@pytest.mark.parametrize("layout", ["2+4R0+2", "abc", "-1+4R2+2", "2+0R2+2", "2+4R2", "2+4x2+2"])
def test_malformed_layout_quotes_the_string(layout):
    with pytest.raises(ValueError) as e:
        GPTConfig(**TINY, layout=layout)
    assert f"layout = {layout!r} must be" in str(e.value) and "'P+NRK+Q'" in str(e.value)


def test_layout_parses_and_sets_depths():
    assert GPTConfig(**TINY, layout="2+4R2+2").depth == (2, 4, 2, 2)
    assert GPTConfig(**TINY, layout=" 1 + 3R4 + 0").depth == (1, 3, 4, 0)
    cfg = GPTConfig(**TINY, layout="3+6R3+3")
    assert (cfg.n_unique, cfg.n_unrolled) == (12, 24)
    assert GPTConfig(**TINY, n_layer=7).depth == (7, 0, 0, 0)


@pytest.mark.parametrize("fields,words", [
    (dict(layout="1+2R0+1"), ["'1+2R0+1'"]),
    (dict(state_passing="memory"), ["'memory'", "mesh"]),
    (dict(mesh_slots=1, layout="1+1R2+1", state_passing="mesh"), ["mesh_slots = 1", ">= 2"]),
    (dict(block_size=0), ["block_size = 0"]),
    (dict(flavour="gpt"), ["'gpt'", "llama"]),
    (dict(flavour="llama"), ["mlp_hidden"]),
    (dict(n_head=5), ["n_head = 5"]),
    (dict(t2mlr=True, n_layer=4, l_start=3, l_end=1), ["l_start = 3", "l_end = 1", "-4 .. 3"]),
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


@pytest.mark.parametrize("l_start, l_end, want", [(-8, -1, (0, 7)), (-2, 7, (6, 7)), (3, -5, (3, 3)),
                                                  (-9, -1, None), (-20, -1, None), (0, -9, None)])
def test_negative_layer_indices_count_from_the_end_and_never_wrap(l_start, l_end, want):
    """-1 is the last of 8 layers and -8 the first, as Python indexes a list; -9 or -20 is no layer at all
    (an index taken modulo n_layer would silently pick layer 7 or 4)."""
    fields = dict(TINY, n_layer=8, t2mlr=True, l_start=l_start, l_end=l_end)
    if want is not None:
        assert GPTConfig(**fields).recurrent_layers == want
        return
    with pytest.raises(ValueError, match=rf"^l_start = {l_start} must be <= l_end = {l_end}, both in -8 \.\. 7"):
        GPTConfig(**fields)


def test_init_follows_the_recipe():
    """std sqrt(2/(5C)) everywhere, out projections / sqrt(2·unrolled depth), zero biases.
    The out-projection scaling is the MeSH paper's depth-aware init; the paper gives no base std or bias init,
    so Huginn's std and zero biases are our choice."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=512, block_size=32, n_embd=256, n_head=4, layout="2+2R3+2", state_passing="mesh")
    model = GPT(cfg)
    std = math.sqrt(2 / (5 * 256))
    assert abs(model.wte.weight.std().item() / std - 1) < 0.02
    assert abs(model.layers[0].attn.qkv.weight.std().item() / std - 1) < 0.02
    out_std = std / math.sqrt(2 * 10)
    for layer in model.layers:
        assert abs(layer.mlp.down.weight.std().item() / out_std - 1) < 0.05
        assert layer.attn.qkv.bias.abs().max() == 0
    assert model.lm_head.weight is not model.wte.weight             # neox: untied


def test_default_dtype_is_float32_here():
    """The float64 tests set their dtype locally (test_equivalence's fixture): collected after them in one
    pytest run, the tests of this file still build float32 models."""
    assert torch.get_default_dtype() == torch.float32
    assert GPT(GPTConfig(**TINY, n_layer=1)).wte.weight.dtype == torch.float32


def test_embeddings_are_scaled_by_sqrt_d():
    model = GPT(GPTConfig(**TINY, n_layer=1))
    seen = []
    model.layers[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))   # the first layer's input
    idx = torch.tensor([[3, 5]])
    model(idx)
    assert torch.allclose(seen[0], model.wte(idx) * math.sqrt(32))


def test_flop_accounting_counts_unrolled_depth_and_sweeps():
    """A looped model costs like its unrolled vanilla twin; Jacobi costs D forward and b+1 backward middle
    passes."""
    vanilla = GPT(GPTConfig(**TINY, n_layer=6))
    looped = GPT(GPTConfig(**TINY, layout="1+2R2+1", state_passing="base"))
    assert train_flops_per_token(vanilla) == train_flops_per_token(looped)
    cfg = dict(TINY, n_layer=4, t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=5, jacobi_grad_sweeps=2)
    t2mlr = GPT(GPTConfig(**cfg))
    assert layer_passes(t2mlr) == [(1, 1), (5, 3), (5, 3), (1, 1)]
    plain = GPT(GPTConfig(**TINY, n_layer=4))
    layer = train_flops_per_token(plain) - train_flops_per_token(GPT(GPTConfig(**TINY, n_layer=3)))
    C = 32
    per_pass = C * C + 2 * C * C          # W_p and A's r~ columns: every pass
    once = 2 * C * C + 2 * C              # A's x columns and the biases: once a forward (x_part)
    expected = (train_flops_per_token(plain) + 2 * (5 - 1 + 2 * (3 - 1)) * layer / 3
                + 2 * (5 + 2 * 3) * per_pass + 6 * once)
    assert train_flops_per_token(t2mlr) == pytest.approx(expected)
    # jacobi_lag: D follows the length, so a step on T tokens costs what fixed D = T - lag costs
    lagged = GPT(GPTConfig(**(cfg | {"jacobi_lag": 3})))
    assert layer_passes(lagged, T=8) == [(1, 1), (5, 3), (5, 3), (1, 1)]
    assert train_flops_per_token(lagged, T=8) == train_flops_per_token(GPT(GPTConfig(**cfg)), T=8)
    assert train_flops_per_token(lagged, T=20) > train_flops_per_token(t2mlr, T=20)


def test_generate_greedy_matches_argmax_of_full_forward():
    """Greedy generation with the KV cache picks, at every step, the argmax of a full recompute."""
    torch.manual_seed(0)
    for fields in (
        dict(layout="1+1R2+1", state_passing="mesh"),
        dict(n_layer=3, t2mlr=True, l_start=1, l_end=1),
    ):
        model = GPT(GPTConfig(**TINY, **fields)).eval()
        if model.gate is not None:
            with torch.no_grad():
                model.gate.theta_r.fill_(0.5)
        idx = torch.randint(0, 64, (2, 5))
        # every token c = 2 = control None
        out = model.generate(idx, 12, temperature=0, recurrent_prompt=True)
        for t in range(5, 17):
            assert torch.equal(model(out[:, :t])[0][:, -1].argmax(-1), out[:, t])


def test_generate_beyond_block_size_and_top_k():
    """Generation continues past block_size (each step then recomputes the last block_size tokens) and top_k=1
    equals greedy; top_k > vocab is clamped."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, n_layer=2)).eval()
    idx = torch.randint(0, 64, (1, 40))                          # longer than block_size 32: cropped
    with pytest.warns(UserWarning, match="^a 40-token prompt > block_size: last 32 kept$"):
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
    cache = InferenceCache(model.cfg.n_unrolled)                   # a cache holds block_size positions
    with torch.no_grad():
        model(torch.zeros(1, 30, dtype=torch.long), cache=cache)
        with pytest.raises(ValueError, match="^33 tokens exceeds block_size = 32"):
            model(torch.zeros(1, 3, dtype=torch.long), cache=cache)
    assert cache.length == 30 and cache.layers[0]["k"].shape[2] == 30     # the refused call wrote nothing
    with pytest.raises(ValueError, match="mode = 'fast'"):
        GPT(GPTConfig(**TINY, n_layer=2, t2mlr=True))(torch.zeros(1, 3, dtype=torch.long), mode="fast")


def test_optimizer_decays_only_matrices():
    model = GPT(GPTConfig(**TINY, n_layer=2, t2mlr=True))
    decay, no_decay = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu").param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() >= 2 for p in decay["params"])
    assert any(p is model.gate.theta_r for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


@pytest.mark.slow
def test_summary_cli_prints_paper_counts():
    """`python model.py config/mesh_160m.py` prints 56,704,512 non-embedding and 23,070 router parameters."""
    out = subprocess.run([sys.executable, "model.py", "config/mesh_160m.py"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "56,704,512" in out.stdout and "23,070" in out.stdout and "unrolled depth     12" in out.stdout
    bad = subprocess.run([sys.executable, "model.py", "config/mesh_160m.py", "--layout=2+4R0+2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "'2+4R0+2'" in bad.stderr


@pytest.mark.parametrize(
    "config, lines",
    [
        # 8 LLaMA layers of 4·128² + 3·128·512 + 2·128, a final norm; the gate 5·128² + 2·128 + 2; embedding
        # 320·128
        (
            "config/tiny_t2mlr.py",
            [
                "non-embedding      2,099,328",
                "total params       2,222,466",
                "T²MLR gate params  82,178 (layers 2..5, D=16, b=4)",
            ],
        ),
        (
            "config/mesh_160m.py",
            ["non-embedding      56,704,512", "router params      23,070 (+5 slots, 3 steps)"],
        ),
    ],
)
@pytest.mark.slow
def test_summary_cli_does_not_import_train(config, lines):
    """`python model.py config/x.py` reads the model keys and skips the training keys of the file without
    importing train.py (which imports model.py)."""
    code = (
        f"import runpy, sys; sys.argv = ['model.py', {config!r}]; runpy.run_path('model.py', "
        "run_name='__main__');"
        "print('train imported' if 'train' in sys.modules else 'train not imported')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "train not imported"
    for line in lines:
        assert line in out.stdout.splitlines()


@pytest.mark.slow
def test_summary_cli_still_reports_a_misspelled_model_key():
    """Training keys are skipped, a near miss of a model key is still an error (configurator's
    skip_unknown)."""
    args = [sys.executable, "model.py", "config/tiny_mesh.py", "--batch_size=8", "--learning_rate=1e-3"]
    assert subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120).returncode == 0
    bad = subprocess.run(args + ["--n_layers=4"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1
    assert bad.stderr == "error: unknown config key 'n_layers' in command line (did you mean 'n_layer'?)\n"


def test_no_training_key_passes_for_a_misspelled_model_key():
    """skip_unknown reports a key within difflib ratio 0.8 of a GPTConfig field as a typo: no TrainConfig key
    may be that close, or `python model.py` would refuse every config file that sets it."""
    from train import TrainConfig
    model_keys = [f.name for f in dataclasses.fields(GPTConfig)]
    near = {
        f.name: difflib.get_close_matches(f.name, model_keys, n=1, cutoff=0.8)
        for f in dataclasses.fields(TrainConfig)
    }
    assert {key: match for key, match in near.items() if match} == {}


def test_t2mlr_gate_initialisation():
    """The T²MLR code's gate init: θ = 0 (identity), A_r/A_x xavier-normal gain 1 = std sqrt(2/(3C)),
    biases U(±1/sqrt(2C)), W_p the Linear default U(±1/sqrt(C)); 5C² + 2C + 2 parameters."""
    torch.manual_seed(0)
    C = 256
    model = GPT(
        GPTConfig(vocab_size=64, block_size=16, n_embd=C, n_head=4, n_layer=3, t2mlr=True, l_start=1, l_end=1)
    )
    gate = model.gate
    assert gate.theta_r.item() == 0 and gate.theta_x.item() == 0
    for weight in (gate.A.weight[:, :C], gate.A.weight[:, C:]):                # A's x and r~ columns
        assert abs(weight.std().item() / math.sqrt(2 / (3 * C)) - 1) < 0.02
    bias = gate.A.bias
    assert bias.abs().max() <= 1 / math.sqrt(2 * C) and bias.std() > 0.5 / math.sqrt(6 * C)
    W_p = gate.W_p.weight
    assert W_p.abs().max() <= 1 / math.sqrt(C) and W_p.std() > 0.9 / math.sqrt(3 * C)
    assert param_counts(model)["gate"] == 5 * C * C + 2 * C + 2
    x = torch.randn(2, 5, C)
    assert torch.equal(model.temporal_gate(x, torch.randn(2, 5, C)), x)                    # the mixed input is x


def tables_applied(model, pos, T, dtype):
    """The rotary (cos, sin) that GPT.run_layers hands its first layer for positions pos..pos+T-1 of a
    residual stream of `dtype`, read by a forward pre-hook."""
    seen = []
    handle = model.layers[0].register_forward_pre_hook(lambda m, args: seen.append(args[1:3]))
    with torch.no_grad():
        model.run_layers(torch.zeros(1, T, model.cfg.n_embd, dtype=dtype), model.layers[:1], pos)
    handle.remove()
    return seen[0]


def test_rotary_is_a_relative_position_encoding(monkeypatch):
    """Rotary (NeoX/LLaMA rotate-half form, applied inside Layer.forward): the score q·k depends only on the offset
    between positions, position 0 is the identity, and the rotated dims keep their norm; the pass-through
    dims are untouched. The rotated q, k are read where attention hands them to SDPA."""
    seen, original = {}, F.scaled_dot_product_attention

    def sdpa(q, k, v, **kw):
        seen["q"], seen["k"] = q, k
        return original(q, k, v, **kw)

    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention", sdpa)
    torch.manual_seed(0)
    for pct in (1.0, 0.25):
        cfg = GPTConfig(vocab_size=8, block_size=40, n_embd=16, n_head=1, n_layer=1, rope_pct=pct)
        model = GPT(cfg).double()
        layer = model.layers[0]
        x = torch.randn(1, 1, 16, dtype=torch.float64).expand(1, 40, 16)      # one vector at every position
        cos, sin = tables_applied(model, 0, 40, torch.float64)               # float64 from the start: ~1e-16
        layer(x, cos, sin)
        q, k = seen["q"][0, 0], seen["k"][0, 0]                               # (40, 16) rotated by position
        q0 = layer.attn.qkv(layer.ln1(x))[0, 0, :16]                               # the unrotated query
        score = lambda m, n: (q[m] * k[n]).sum()
        close = lambda a, b: (a - b).abs().max() <= 1e-13
        assert close(score(7, 3), score(30, 26)) and close(score(0, 9), score(11, 20))
        assert not torch.allclose(score(7, 3), score(7, 4))
        assert close(q[0], q0)
        r = cos.shape[-1]
        assert r == (16 if pct == 1.0 else 4)
        assert close(q[13, :r].norm(), q0[:r].norm())
        assert torch.equal(q[13, r:], q0[r:]) and not torch.allclose(q[13, :r], q0[:r])


def test_normal_initialisation_has_the_t2mlr_codes_statistics():
    """weight_init "normal_0.02" (the T²MLR code's Hugging Face Llama models): every Linear and Embedding
    weight N(0, 0.02²), the output projections included (no depth scaling), biases 0, norms 1; the gate keeps
    its own initialisation (identity at θ = 0); with embed_scale=False the embeddings enter unscaled."""
    torch.manual_seed(0)
    cfg = dict(vocab_size=512, block_size=16, n_embd=256, n_head=4, n_layer=4, flavour="llama", mlp_hidden=1024,
               t2mlr=True, l_start=1, l_end=2, embed_scale=False)
    normal, ours = GPT(GPTConfig(**cfg, weight_init="normal_0.02")), GPT(GPTConfig(**cfg))
    for name, p in normal.named_parameters():
        if name.startswith("gate."):
            continue
        if p.dim() == 2:
            assert abs(p.std().item() / 0.02 - 1) < 0.03 and abs(p.mean().item()) < 2e-3, name
        else:
            assert torch.equal(p, torch.ones_like(p)), name          # the RMSNorm weights
    assert abs(normal.layers[0].mlp.down.weight.std().item() / 0.02 - 1) < 0.03     # not depth-scaled
    ours_std = math.sqrt(2 / (5 * 256)) / math.sqrt(2 * 4)                       # ours: depth-scaled, 0.014
    assert abs(ours.layers[0].mlp.down.weight.std().item() / ours_std - 1) < 0.03
    assert torch.equal(normal.gate.theta_r, torch.zeros(1)) and normal.gate.A.weight.std() > 0.04
    idx = torch.randint(0, 512, (2, 8))
    seen = []
    normal.layers[0].register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    normal(idx)
    assert torch.equal(seen[0], normal.wte(idx))                                  # unscaled embeddings
    with pytest.raises(ValueError, match=r"^weight_init = 'hf' must be one of 'mesh', 'normal_0.02'"):
        GPTConfig(weight_init="hf")


def test_gate_initialisation_options():
    """gate_bias_prob p sets b_r = b_x = logit(p) (S5: p = 0.5 -> 0); gate_weight_gain scales the xavier std
    sqrt(2/(3C)) of A_r, A_x; the default keeps the Linear's uniform biases."""
    C = 128
    base = dict(vocab_size=64, block_size=16, n_embd=C, n_head=4, flavour="llama", mlp_hidden=64, n_layer=2,
                t2mlr=True)
    torch.manual_seed(0)
    half = GPT(GPTConfig(**base, gate_bias_prob=0.5)).gate
    assert torch.equal(half.A.bias, torch.zeros(2 * C))
    skewed = GPT(GPTConfig(**base, gate_bias_prob=0.9)).gate
    assert torch.allclose(skewed.A.bias, torch.full((2 * C,), math.log(9.0)))
    default = GPT(GPTConfig(**base)).gate
    assert default.A.bias.std() > 0 and default.A.bias.abs().max() <= 1 / math.sqrt(2 * C)
    for gain in (1.0, 1e-2):
        gate = GPT(GPTConfig(**base, gate_weight_gain=gain)).gate
        std = gate.A.weight.std().item()
        assert std == pytest.approx(gain * math.sqrt(2 / (3 * C)), rel=0.02), gain


@pytest.mark.parametrize("flavour", [dict(), dict(flavour="llama", mlp_hidden=64)])
def test_rope_pct_zero_is_nope(flavour):
    """rope_pct = 0 is no positional encoding: one causal attention layer without positions is blind to the
    order of the earlier tokens, so the last position's logits survive any permutation of the prefix; with
    rotary they do not. (Deeper NoPE stacks do see order, through the causal mask of the layers below.)"""
    torch.manual_seed(0)
    idx = torch.randint(0, 64, (1, 12))
    shuffled = torch.cat([idx[:, :-1][:, torch.randperm(11)], idx[:, -1:]], dim=1)
    for rope_pct, invariant in ((0.0, True), (1.0, False)):
        model = GPT(GPTConfig(**TINY, **flavour, n_layer=1, rope_pct=rope_pct)).double().eval()
        a, b = model(idx)[0][0, -1], model(shuffled)[0][0, -1]
        assert ((a - b).abs().max() <= 1e-12) == invariant, rope_pct


# -----------------------------------------------------------------------------
# Generation at the edges: tiny windows, extreme sampling settings

def greedy_by_full_recompute(model, idx, n, recurrent_prompt=False):
    """The slow obvious definition: each step runs the model without cache on the last block_size tokens
    (T²MLR in eval: the exact recurrence, from R = 0 at the window's first token; the prompt's control
    flow c = 1, or 2 with recurrent_prompt, and c = 2 for generated tokens) and takes the argmax."""
    control = torch.full_like(idx, 2 if recurrent_prompt else 1)
    for _ in range(n):
        logits, _ = model(idx[:, -model.cfg.block_size:], control=control[:, -model.cfg.block_size:])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        control = torch.cat([control, torch.full_like(control[:, :1], 2)], dim=1)
    return idx


GENERATE_VARIANTS = {"vanilla": dict(n_layer=2),
                     "mesh": dict(layout="1+1R2+1", state_passing="mesh"),
                     "t2mlr": dict(flavour="llama", mlp_hidden=48, n_layer=3, t2mlr=True, l_start=1, l_end=1)}


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [1, 2, 3, 4])
@pytest.mark.parametrize("variant", list(GENERATE_VARIANTS))
def test_generate_equals_full_recompute_over_the_window(variant, block_size):
    """Greedy generate() = the argmax of a full recompute over the last block_size tokens at every step, for
    prompts shorter than, as long as and longer than the window, far past block_size (float64: no ties).
    block_size 1 used to crash (a window of block_size // 2 = 0 tokens sliced the whole sequence)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**dict(TINY, block_size=block_size), **GENERATE_VARIANTS[variant])).double().eval()
    if model.gate is not None:
        with torch.no_grad():
            model.gate.theta_r.fill_(0.5)          # the recurrence is active
    for T in (1, block_size, block_size + 2):
        idx = torch.randint(0, 64, (2, T))
        for recurrent_prompt in (False, True):
            out = model.generate(idx, 3 * block_size + 2, temperature=0, recurrent_prompt=recurrent_prompt)
            assert torch.equal(
                out, greedy_by_full_recompute(model, idx, 3 * block_size + 2, recurrent_prompt)
            ), T


def test_generate_block_size_1_from_the_issue():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, block_size=1, n_layer=2, n_head=2, n_embd=16)).eval()
    idx = torch.zeros(1, 1, dtype=torch.long)
    assert torch.equal(model.generate(idx, 4, temperature=0), greedy_by_full_recompute(model, idx, 4))


def test_sampling_at_extreme_settings():
    """A temperature so small that logits / temperature overflow gives exactly the greedy tokens (it used to
    crash: "probability tensor contains inf/nan"); top_k = 1 is greedy; top_k >= vocab is all tokens;
    bad values raise ValueError naming them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, n_layer=2)).eval()
    idx = torch.randint(0, 64, (2, 5))
    greedy = model.generate(idx, 40, temperature=0)              # past block_size 32 as well
    for temperature in (1e-40, 1e-320, 5e-324):
        assert torch.equal(
            model.generate(idx, 40, temperature=temperature, generator=torch.Generator()), greedy
        )
    assert torch.equal(model.generate(idx, 40, temperature=1.0, top_k=1, generator=torch.Generator()), greedy)
    model64 = GPT(GPTConfig(**TINY, n_layer=2)).double().eval()
    assert torch.equal(
        model64.generate(idx, 10, temperature=1e-300), model64.generate(idx, 10, temperature=0)
    )
    draw = lambda top_k: model.generate(
        idx, 10, temperature=1.0, top_k=top_k, generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(draw(None), draw(64)) and torch.equal(draw(None), draw(10 ** 6))
    for bad, message in (
        (dict(temperature=-0.5), "temperature = -0.5 must be >= 0"),
        (dict(temperature=float("nan")), "temperature = nan must be >= 0"),
        (dict(top_k=0), "top_k = 0 must be >= 1"),
        (dict(top_k=-3), "top_k = -3 must be >= 1"),
    ):
        with pytest.raises(ValueError, match=message):
            model.generate(idx, 1, **bad)


def draws_from(logits, temperature, top_k=None, n=1, generator=None, dtype=torch.float32):
    """n tokens that generate draws after a one-token prompt whose next-token logits are exactly `logits`
    (V,): a one-layer model whose final norm outputs ones (weight 0, bias 1) and whose head's first column is
    the logits."""
    model = GPT(GPTConfig(vocab_size=logits.numel(), block_size=4, n_embd=8, n_head=2, n_layer=1)).to(dtype)
    with torch.no_grad():
        model.ln_f.weight.zero_()
        model.ln_f.bias.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = logits
        prompt = torch.zeros(n, 1, dtype=torch.long)
        assert torch.equal(model(prompt)[0][0, -1], logits.to(dtype))
    return model.eval().generate(prompt, 1, temperature, top_k, generator)[:, -1].tolist()


def test_sampling_on_hand_made_logits():
    """generate's sampling: ties, tiny and infinite temperatures, top_k, in float32, bfloat16 and float64."""
    logits = torch.tensor([0.0, 3.0, 2.0, 1.0])
    for dtype in (torch.float32, torch.bfloat16, torch.float64):
        for temperature in (0, 1e-46, 1e-40, 5e-324):
            assert draws_from(logits, temperature, dtype=dtype) == [1]
    g = torch.Generator().manual_seed(0)
    draws = draws_from(logits, float("inf"), top_k=2, n=2000, generator=g)
    assert set(draws) == {1, 2} and 900 < draws.count(1) < 1100     # uniform over the 2 kept tokens
    draws = draws_from(torch.tensor([5.0, 1.0, 5.0]), 1e-30, n=2000, generator=g)
    assert set(draws) == {0, 2} and 900 < draws.count(0) < 1100     # exact ties share the limit evenly
    # a -inf logit (a banned token) stays impossible at any temperature, inf included (was NaN there)
    banned = torch.tensor([0.0, -math.inf, 1.0, -math.inf])
    for temperature in (float("inf"), 1e-30, 2.0):
        draws = draws_from(banned, temperature, n=300, generator=g)
        assert set(draws) <= {0, 2} and 2 in draws


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")     # bf16 input, fp32 norm
def test_float64_model_has_float64_rotary_tables_and_loss():
    """The rotary tables of a float64 model are computed in float64 (not cast from float32: ~1e-7 off), and
    its loss is a float64 cross-entropy; a float32 model keeps float32 tables, and bf16 activations use
    them."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, flavour="llama", mlp_hidden=48, n_layer=2)).double()
    cos, sin = tables_applied(model, 0, 32, torch.float64)
    hs = TINY["n_embd"] // TINY["n_head"]
    inv_freq = 10000.0 ** (-torch.arange(0, hs, 2, dtype=torch.float64) / hs)
    angles = torch.arange(32, dtype=torch.float64)[:, None] * inv_freq
    assert cos.dtype == sin.dtype == torch.float64
    assert (cos[:, 0] - torch.cat([angles.cos(), angles.cos()], -1)).abs().max() <= 1e-15
    assert (sin[:, 0] - torch.cat([angles.sin(), angles.sin()], -1)).abs().max() <= 1e-15
    assert torch.equal(tables_applied(model, 3, 5, torch.float64)[0], cos[3:8])     # positions 3..7
    with torch.autocast("cpu", dtype=torch.bfloat16):                 # bf16 activations of a float32 model
        assert tables_applied(GPT(model.cfg), 0, 4, torch.bfloat16)[0].dtype == torch.float32
    idx, targets = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    targets[0, :3] = -1                                           # ignored positions
    logits, loss = model(idx, targets)
    log_probs = logits - logits.exp().sum(-1, keepdim=True).log()
    keep = targets >= 0
    expected = -log_probs[keep].gather(-1, targets[keep][:, None]).mean()
    assert loss.dtype == torch.float64 and (loss - expected).abs() <= 1e-12


@pytest.mark.slow
def test_generate_marks_the_prompt_non_recurrent_by_default():
    """T²MLR generation: prompt c = 1, generated tokens c = 2 (the T²MLR code's control flow); the default and
    recurrent_prompt=True really differ, and each matches the exact forward with its control flow."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, **GENERATE_VARIANTS["t2mlr"])).double().eval()
    with torch.no_grad():
        model.gate.theta_r.fill_(0.8)
        model.gate.theta_x.fill_(-0.4)
    idx = torch.randint(0, 64, (2, 6))
    plain, recurrent = model.generate(idx, 10, temperature=0), model.generate(
        idx, 10, temperature=0, recurrent_prompt=True
    )
    control = torch.cat([torch.ones(2, 6, dtype=torch.long), torch.full((2, 10), 2)], dim=1)
    for t in range(6, 16):
        assert torch.equal(model(plain[:, :t], control=control[:, :t])[0][:, -1].argmax(-1), plain[:, t])
        assert torch.equal(model(recurrent[:, :t])[0][:, -1].argmax(-1), recurrent[:, t])
    first = model(idx, control=control[:, :6])[0][:, -1] - model(idx)[0][:, -1]
    assert first.abs().max() > 1e-3                                # the prompt's marking changes the logits


def test_t2mlr_mode_is_explicit_and_jacobi_refuses_a_cache():
    """The mode is what the caller asks for: "jacobi" with a KV cache is an error (it used to run exact
    silently), an unknown mode is an error, and the defaults are jacobi in train() without a cache and
    exact otherwise (checked by value: Jacobi with D = 1 differs from exact beyond position 0)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, n_layer=4, t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=1,
                          jacobi_grad_sweeps=0))
    with torch.no_grad():
        model.gate.theta_r.fill_(0.8)
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        with pytest.raises(ValueError, match="mode 'jacobi' cannot continue a cache of"):
            model(idx, mode="jacobi", cache=InferenceCache(model.cfg.n_unrolled))
        with pytest.raises(ValueError, match="mode = 'sweeps' must be one of"):
            model(idx, mode="sweeps")
        exact, jacobi = model(idx, mode="exact")[0], model(idx, mode="jacobi")[0]
        assert (exact - jacobi)[:, 1:].abs().max() > 1e-4                 # D = 1: only position 0 exact
        assert torch.equal(model.train()(idx)[0], jacobi)                # train(): jacobi
        assert torch.equal(model.eval()(idx)[0], exact)                  # eval(): exact
        cached = model.train()(idx, cache=InferenceCache(model.cfg.n_unrolled))[0]
        assert torch.equal(cached, exact)                                # a cache: exact
