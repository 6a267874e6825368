"""
Tests of probe.py: the properties of the three measures (MeSH paper §4.1), a run of the command line on
tiny random checkpoints of each kind of variant, and a checkpoint whose keys carry wrapper prefixes giving what
the clean one gives (with resume and sample.py).
Run: python -m pytest -q studies/tests/test_probe.py
"""

import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

import sample
import train
from model import GPT, GPTConfig
from studies import probe
from support.checkpoints import load_checkpoint
from test_loading import train_tiny


def random_states(b=3, t=40, c=16, seed=0):
    return torch.randn(b, t, c, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("kernel", ["rbf", "linear"])
def test_cka_of_a_matrix_with_itself_is_one(kernel):
    x = random_states()
    assert torch.allclose(probe.cka(x, x, kernel), torch.ones(3, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("kernel", ["rbf", "linear"])
def test_cka_is_invariant_to_orthogonal_maps_and_isotropic_scaling(kernel):
    x, y = random_states(seed=0), random_states(seed=1)
    q, _ = torch.linalg.qr(torch.randn(16, 16, dtype=torch.float64))
    base = probe.cka(x, y, kernel)
    assert torch.allclose(probe.cka(x @ q, y, kernel), base, atol=1e-10)
    assert torch.allclose(probe.cka(x, 7.5 * y, kernel), base, atol=1e-10)
    assert torch.allclose(probe.cka(x, y @ q * 0.01, kernel), base, atol=1e-10)
    assert (base < 0.99).all()                  # and independent states are told apart


def test_linear_cka_equals_the_direct_formula():
    x, y = random_states(seed=2), random_states(c=24, seed=3)
    for b in range(3):
        xc, yc = x[b] - x[b].mean(0), y[b] - y[b].mean(0)
        direct = (yc.T @ xc).norm() ** 2 / ((xc.T @ xc).norm() * (yc.T @ yc).norm())
        assert torch.allclose(probe.cka(x, y, "linear")[b], direct, atol=1e-12)


def test_rbf_cka_matches_kornblith_reference_code():
    """numpy transcription of Kornblith et al.'s gram_rbf / center_gram / cka
    (google-research/representation_similarity)."""
    x, y = random_states(b=1, seed=4)[0].numpy(), random_states(b=1, seed=5)[0].numpy()

    def gram_rbf(a):
        dot = a @ a.T
        sq = np.diag(dot)
        d = -2 * dot + sq[:, None] + sq[None, :]
        return np.exp(-d / (2 * np.median(d)))

    def center(k):
        n = k.shape[0]
        h = np.eye(n) - np.ones((n, n)) / n
        return h @ k @ h

    kx, ky = center(gram_rbf(x)), center(gram_rbf(y))
    expected = (kx * ky).sum() / (np.linalg.norm(kx) * np.linalg.norm(ky))
    got = probe.cka(torch.from_numpy(x)[None], torch.from_numpy(y)[None], "rbf")
    assert abs(got.item() - expected) < 1e-10


def test_a_rank_r_matrix_has_r_nonzero_normalised_singular_values():
    g = torch.Generator().manual_seed(0)
    r = 5
    x = torch.randn(2, 60, r, generator=g, dtype=torch.float64) @ torch.randn(
        2, r, 32, generator=g, dtype=torch.float64
    )
    sigma = probe.singular_values(x)
    ratios = sigma / sigma[:, :1]
    assert ((ratios > 1e-10).sum(dim=1) == r).all()
    assert (probe.effective_rank(sigma) <= r + 1e-6).all()
    # equal singular values: effective rank = their number
    flat = torch.ones(1, 8, dtype=torch.float64)
    assert torch.allclose(probe.effective_rank(flat), torch.tensor([8.0], dtype=torch.float64))


def test_skew_of_an_identity_block_is_zero():
    x = random_states()
    assert torch.equal(probe.relative_update(x, x), torch.zeros(3, dtype=torch.float64))
    assert torch.allclose(probe.relative_update(x, -x), torch.full((3,), 2.0, dtype=torch.float64))


# ---- what the hooks read, against the model's own pieces run by hand ------------------------------------

def test_depth_probe_reads_every_state_and_unit_through_hooks():
    """Recursive: h_emb, h(0)..h(K), h_out and the units prelude, core0..core{K-1}, coda, each (input,
    output) equal to the model's pieces applied by hand; the logits are unchanged and no hook is left."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, layout="2+1R3+1", state_passing="residual")).eval()
    idx = torch.randint(0, 64, (2, 10))
    units, states = probe.depth_probe(model, idx)
    assert list(states) == ["h_emb", "h(0)", "h(1)", "h(2)", "h(3)", "h_out"]
    assert [name for name, _, _ in units] == ["prelude", "core0", "core1", "core2", "coda"]
    with torch.no_grad():
        h = model.wte(idx) * 32 ** 0.5
        assert torch.equal(states["h_emb"], h)
        h = model.run_layers(h, model.prelude, 0)                                  # h(0) (residual: no mixing)
        assert torch.equal(units[0][2], h) and torch.equal(states["h(0)"], h)
        for t in range(3):                                                        # h(t+1) = f_core(h(t)) + h(t)
            f_core = model.run_layers(h, model.core, 0)
            assert torch.equal(units[1 + t][1], h) and torch.equal(units[1 + t][2], f_core)
            h = f_core + h
            assert torch.equal(states[f"h({t + 1})"], h)
        out = model.run_layers(h, model.coda, 0)
        assert torch.equal(units[-1][2], out) and torch.equal(states["h_out"], out)
        assert torch.equal(model(idx)[0], model.lm_head(model.ln_f(out)))
    assert not any(m._forward_hooks for m in model.modules())


def test_t2mlr_probe_joins_the_token_loop_and_zeroes_the_state():
    """T²MLR: the gate and the middle layers run once per token in exact mode; the probe joins their calls,
    so layer l_end's output equals the exact forward's (the parallel middle step fed the exact states), and
    the R ≡ 0 units are the gate and the layers run with a zero state."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, **VARIANTS["t2mlr"])).double().eval()
    with torch.no_grad():
        model.gate.theta_r.fill_(0.5)
    idx = torch.randint(0, 64, (2, 12))
    units, units_no_state, states = probe.t2mlr_probe(model, idx)
    names = ["layer0", "gate", "layer1", "layer2", "layer3"]
    assert [n for n, _, _ in units] == names and [n for n, _, _ in units_no_state] == names
    assert list(states) == ["h_emb", "layer0", "layer1", "layer2", "h_out"]
    with torch.no_grad():
        x = model.run_layers(model.wte(idx) * 32 ** 0.5, model.lower, 0)
        R_read, h_exact = torch.zeros_like(x[:, :1]), []    # the states positions 0..t read: [0, R_0, ..]
        for t in range(12):                                  # the exact recurrence, by hand (O(T²))
            h_t = model.run_layers(model.temporal_gate(x[:, :t + 1], R_read), model.middle, 0)
            R = model.state_update(h_t, R_read)
            R_read = torch.cat([torch.zeros_like(x[:, :1]), R], dim=1)
            h_exact.append(h_t[:, -1:])
        h_exact = torch.cat(h_exact, dim=1)
        assert (units[3][2] - h_exact).abs().max() <= 1e-12                      # layer2 = l_end
        mixed0 = model.temporal_gate(x, torch.zeros_like(x))
        assert torch.equal(units_no_state[1][2], mixed0)
        assert torch.equal(units_no_state[2][2], model.run_layers(mixed0, model.middle[:1], 0))
    assert (units[1][2] - units_no_state[1][2]).abs().max() > 1e-3                  # the state matters


# ---- the command line on tiny random checkpoints ---------------------------------------------------

TINY = dict(vocab_size=64, block_size=32, n_embd=32, n_head=4)
VARIANTS = {
    "vanilla": dict(n_layer=3),
    "mesh": dict(layout="1+1R3+1", state_passing="mesh"),
    "t2mlr": dict(flavour="llama", mlp_hidden=64, n_layer=4, t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=4),
}


def write_checkpoint(tmp_path, fields):
    """A random model of GPTConfig(**fields) saved as train.py does, and a token folder with meta.json."""
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 400), ("val", 300)):
        rng.integers(0, 60, n).astype(np.uint16).tofile(data / f"{split}.bin")
    (data / "meta.json").write_text(
        json.dumps({"vocab_size": 60, "dtype": "uint16", "train_tokens": 400, "val_tokens": 300})
    )
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, **fields))
    if model.gate is not None:          # θ = 0.5 so the state matters (θ = 0: identity gate)
        model.gate.theta_r.data.fill_(0.5)
        model.gate.theta_x.data.fill_(0.5)
    path = tmp_path / "ckpt.pt"
    torch.save(
        {
            "model": model.state_dict(),
            "model_config": asdict(model.cfg),
            "train_config": {"dataset": "tiny", "data_dir": str(data), "batch_size": 4},
            "tokenizer": "byte",
        },
        path,
    )
    return path


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_probe_command_line_writes_json_and_figures(tmp_path, variant):
    path = write_checkpoint(tmp_path, VARIANTS[variant])
    out = tmp_path / "probe"
    result = probe.main([str(path), "--num_seqs", "6", "--batch_size", "4", "--out", str(out)])
    saved = json.loads((out / "probe.json").read_text())
    assert saved["skew"] == json.loads(json.dumps(result["skew"]))
    states = saved["cka"]["states"]
    blocks = saved["skew"]["blocks"]
    if variant == "mesh":
        assert states == ["h_emb", "h(0)", "h(1)", "h(2)", "h(3)", "h_out"]
        assert blocks == ["prelude", "core0", "core1", "core2", "coda"]
    elif variant == "vanilla":
        assert states == ["h_emb", "layer0", "layer1", "h_out"] and blocks == ["layer0", "layer1", "layer2"]
    else:
        assert blocks == ["layer0", "gate", "layer1", "layer2", "layer3"]
        assert saved["skew_no_state"]["blocks"] == blocks
        # the layer below the gate does not see the state; the gate does
        assert saved["skew_no_state"]["mean"][0] == pytest.approx(saved["skew"]["mean"][0])
        assert saved["skew_no_state"]["mean"][1] != pytest.approx(saved["skew"]["mean"][1])
    s = len(states)
    rbf = np.array(saved["cka"]["rbf"])
    assert rbf.shape == (s, s) and np.allclose(np.diag(rbf), 1) and np.allclose(rbf, rbf.T)
    assert all(len(v) == min(32, 50) for v in saved["spectra"]["ratio_mean"].values())
    assert all(
        v[0] == pytest.approx(1) and max(v) <= 1 + 1e-9 for v in saved["spectra"]["ratio_mean"].values()
    )
    assert all(len(saved["skew"][k]) == len(blocks) for k in ("mean", "std"))
    pytest.importorskip("matplotlib")
    for name in ("skew", "cka", "spectra"):
        assert (out / f"probe_{name}.png").stat().st_size > 1000


def test_probe_sequence_lengths_at_the_edges(tmp_path):
    """--seq_len 2, the fewest tokens CKA can centre, works (self-CKA 1); 1 (a zero centred Gram matrix), 0
    (once silently block_size) and more than block_size are refused in one line naming the value and the
    range, as is --num_seqs 0."""
    path = write_checkpoint(tmp_path, VARIANTS["vanilla"])
    result = probe.main([str(path), "--num_seqs", "3", "--seq_len", "2", "--out", str(tmp_path / "probe")])
    assert result["seq_len"] == 2 and np.allclose(np.diag(np.array(result["cka"]["rbf"])), 1)
    for args, message in ((["--seq_len", "1"], r"--seq_len 1 must be in \[2, block_size = 32\] \(CKA"),
                          (["--seq_len", "0"], r"--seq_len 0 must be in \[2, block_size = 32\]"),
                          (["--seq_len", "33"], r"--seq_len 33 must be in \[2, block_size = 32\]"),
                          (["--num_seqs", "0"], r"--num_seqs 0 and --batch_size 8 must be >= 1")):
        with pytest.raises(probe.RunError, match=message):
            probe.main([str(path), *args, "--out", str(tmp_path / "bad")])


def test_gate_calls_nest_and_put_the_method_back():
    """GateCalls wraps the gate (a method, not a module): nested, both see every call, with the gate's true
    output; each exit restores what was there, the last one the plain method, even after an exception."""
    model = GPT(GPTConfig(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=8, flavour="llama",
                          mlp_hidden=16, t2mlr=True, l_start=1, l_end=1)).eval()
    model.gate.theta_r.data.fill_(0.5)
    idx, outer, inner = torch.randint(0, 16, (1, 6)), [], []
    with torch.no_grad(), probe.GateCalls(model, lambda x, r, y: outer.append(y)):
        with probe.GateCalls(model, lambda x, r, y: inner.append(y)):
            model(idx, mode="exact")
        assert "temporal_gate" in model.__dict__
        model(idx, mode="exact")
    assert len(inner) == 6 and len(outer) == 12 and all(torch.equal(a, b) for a, b in zip(inner, outer))
    x = torch.randn(1, 2, 8)
    assert torch.equal(outer[0], outer[6]) and not torch.equal(model.temporal_gate(x, x), x)
    assert "temporal_gate" not in model.__dict__
    with pytest.raises(RuntimeError), probe.GateCalls(model, lambda x, r, y: None):
        raise RuntimeError("inside")
    assert "temporal_gate" not in model.__dict__


def test_prefixed_resume_sample_and_probe_equal_the_clean_checkpoint(tmp_path, capsys):
    """--init_from=resume, sample.py and probe.py on a checkpoint whose keys carry `module._orig_mod.`:
    the same results as on the clean checkpoint (resume is bit-exact, so the final weights are equal)."""
    clean = train_tiny(tmp_path, "clean")
    prefixed = tmp_path / "prefixed" / "ckpt.pt"
    prefixed.parent.mkdir()
    ckpt = torch.load(clean, weights_only=True)
    torch.save({**ckpt, "model": {"module._orig_mod." + k: v for k, v in ckpt["model"].items()}}, prefixed)
    for out in ("clean", "prefixed"):
        train.main([f"--out_dir={tmp_path / out}", "--init_from=resume", "--max_iters=3"])
    a, b = (load_checkpoint(str(tmp_path / out / "ckpt.pt")) for out in ("clean", "prefixed"))
    assert a["step"] == b["step"] == 3
    assert a["model"].keys() == b["model"].keys() and all(
        torch.equal(a["model"][k], b["model"][k]) for k in a["model"]
    )

    resumed = torch.load(prefixed, weights_only=True)              # written by the resume, with clean keys
    torch.save({**resumed, "model": {"_orig_mod." + k: v for k, v in resumed["model"].items()}}, prefixed)
    outputs = []
    for out in ("clean", "prefixed"):
        capsys.readouterr()
        sample.main([f"--out_dir={tmp_path / out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=8",
                     "--start=The"])
        printed = capsys.readouterr().out.split("\n" + "-" * 80)[0]
        probed = probe.main([str(tmp_path / out / "ckpt.pt"), "--num_seqs=2", "--seq_len=8",
                             f"--data_dir={tmp_path / 'data' / 'fox'}", f"--out={tmp_path / out / 'probe'}"])
        outputs.append((printed, probed["skew"]["mean"]))
    assert outputs[0][0].startswith("The") and len(outputs[0][1]) > 0
    assert outputs[0] == outputs[1]
