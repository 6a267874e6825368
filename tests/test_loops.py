"""
Depth at test time and random-depth training, for the recursive layouts (float64):

- n_loops = K, exit_threshold = 0 and exits of K everywhere give today's logits, bit for bit;
- n_loops = K' equals the core looped K' times by hand (base, anchor; MeSH reusing its last routers);
- an exit keeps the state: the uncached forward at given exits equals cached decoding at the same exits,
  and a batch whose rows exit at different loops gives each row what it gives alone;
- generate with an exit threshold that saves loops, and its stats;
- draw_loops is a pure function with its stated means, truncation keeps the prelude's gradient;
- every bad value is refused in one line.

    python -m pytest -q tests/test_loops.py
"""

import pytest
import torch

from model import GPT, GPTConfig, InferenceCache
from support.accounting import train_flops_per_token
from support.loop import draw_loops, mean_loops
from test_model import tables_applied

TINY = dict(vocab_size=64, block_size=48, n_embd=32, n_head=4)
PASSINGS = ("base", "residual", "anchor", "anchor_star", "mesh")


@pytest.fixture(autouse=True)
def float64_default():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def build(passing, layout="1+2R3+1", seed=0, **kw):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**TINY, layout=layout, state_passing=passing, **kw))
    with torch.no_grad():
        for p in model.parameters():            # biases and norms off their init, so no term is zero
            if p.dim() < 2:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def tokens(B=3, T=20, seed=1):
    return torch.randint(0, TINY["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("passing", PASSINGS)
def test_trained_depth_and_threshold_zero_give_todays_logits(passing):
    model, idx = build(passing), tokens()
    today = model(idx)[0]
    stats = {}
    assert torch.equal(model(idx, n_loops=3)[0], today)
    assert torch.equal(model(idx, exit_threshold=0.0, stats=stats)[0], today)    # strict <: never exits
    assert stats["loops"].eq(3).all()
    assert torch.equal(model(idx, exits=torch.full(idx.shape, 3))[0], today)


def by_hand(model, idx, K):
    """The prelude, the core written out K times with (M1) or (M2), the coda: the slow obvious form."""
    cfg = model.cfg
    h_emb = model.wte(idx) * cfg.n_embd ** 0.5
    cos, sin = tables_applied(model, 0, idx.shape[1], h_emb.dtype)
    h = h_emb
    for layer in model.prelude:
        h = layer(h, cos, sin)
    if cfg.state_passing == "mesh":
        buffer = torch.zeros(cfg.n_slots, *h.shape)
        buffer[0] = h_emb

    def step(s, buffer, u, y):                # (M2) at step s, the router of min(s, max_loops)
        s = min(s, cfg.max_loops)
        w = model.mesh.write_routers[s](u).softmax(-1)
        r = model.mesh.read_routers[s](u).softmax(-1)
        buffer = torch.stack([buffer[i] + w[..., i:i + 1] * y for i in range(cfg.n_slots)])
        return buffer, sum(r[..., i:i + 1] * buffer[i] for i in range(cfg.n_slots))
    if cfg.state_passing == "mesh":
        buffer, h = step(0, buffer, h, h)
    h0 = h
    for t in range(K):
        y = h
        for layer in model.core:
            y = layer(y, cos, sin)
        if cfg.state_passing == "mesh":
            buffer, h = step(t + 1, buffer, h, y)
        else:
            h = y + {"base": 0, "residual": h, "anchor": h0, "anchor_star": h_emb}[cfg.state_passing]
    for layer in model.coda:
        h = layer(h, cos, sin)
    return model.lm_head(model.ln_f(h))


@pytest.mark.parametrize("passing", PASSINGS)
@pytest.mark.parametrize("K_test", [1, 2, 5, 7])
def test_n_loops_equals_the_core_looped_by_hand(passing, K_test):
    model, idx = build(passing, max_loops=5), tokens()     # 7 > max_loops: loops 6, 7 reuse router 5
    assert torch.allclose(model(idx, n_loops=K_test)[0], by_hand(model, idx, K_test), atol=1e-12, rtol=0)


def test_max_loops_adds_routers_and_keeps_the_trained_ones():
    small, big = build("mesh"), build("mesh", max_loops=6)
    assert len(small.mesh.write_routers) == 4 and len(big.mesh.write_routers) == 7
    assert small.state_dict().keys() <= big.state_dict().keys()


@pytest.mark.parametrize("passing", ["base", "anchor", "mesh"])
def test_cached_decoding_at_given_exits_equals_the_uncached_forward(passing):
    model, idx = build(passing), tokens()
    exits = torch.randint(1, 6, idx.shape, generator=torch.Generator().manual_seed(2))  # 1..5, apart
    full = model(idx, n_loops=5, exits=exits)[0]
    cache = InferenceCache(1 + 2 * 5 + 1)
    parts = [model(idx[:, :7], cache=cache, n_loops=5, exits=exits[:, :7])[0]]       # the prompt
    for t in range(7, idx.shape[1]):                                                   # then one by one
        parts.append(model(idx[:, t:t + 1], cache=cache, n_loops=5, exits=exits[:, t:t + 1])[0])
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-12, rtol=0)
    alone = torch.cat([model(idx[b:b + 1], n_loops=5, exits=exits[b:b + 1])[0] for b in range(3)])
    assert torch.allclose(alone, full, atol=1e-12, rtol=0)
    # an exit is a real decision: more loops at those positions change the logits
    assert (model(idx, n_loops=5)[0] - full).abs().max() > 1e-3


def test_an_exited_position_serves_its_last_loops_keys():
    """After every position of a call has exited, the later loops are not run: their caches get the
    last loop's keys, and the next token, which runs every loop, reads them there."""
    model, idx = build("base"), tokens(B=1, T=6)
    exits = torch.tensor([[1, 1, 1, 1, 1, 5]])
    full = model(idx, n_loops=5, exits=exits)[0]
    cache = InferenceCache(1 + 2 * 5 + 1)
    first = model(idx[:, :5], cache=cache, n_loops=5, exits=exits[:, :5])[0]
    last = model(idx[:, 5:], cache=cache, n_loops=5, exits=exits[:, 5:])[0]
    assert torch.allclose(torch.cat([first, last], 1), full, atol=1e-12, rtol=0)
    loop1, loop5 = cache.layers[1], cache.layers[1 + 2 * 4]      # core layer 0 in loops 1 and 5
    assert torch.equal(loop5["k"][:, :, :5], loop1["k"][:, :, :5])


def test_generate_with_loops_and_exits():
    model = build("mesh", max_loops=8)
    prompt = tokens(B=2, T=5)
    stats = {}
    out = model.generate(prompt, 12, temperature=0, n_loops=8, exit_threshold=0.5, stats=stats)
    assert out.shape == (2, 17) and 1 <= stats["mean_loops"] < 8       # it saved loops
    assert torch.equal(model.generate(prompt, 12, temperature=0, n_loops=3),
                       model.generate(prompt, 12, temperature=0))      # K' = K: today's continuation
    stats = {}
    model.generate(prompt, 3, temperature=0, n_loops=6, exit_threshold=0.0, stats=stats)
    assert stats["mean_loops"] == 6


def test_draw_loops_is_pure_capped_and_has_its_means():
    for sampler in ("fixed", "uniform", "poisson_lognormal"):
        draws = [draw_loops(sampler, 4, 16, seed=3, step=s) for s in range(3000)]
        assert draws == [draw_loops(sampler, 4, 16, seed=3, step=s) for s in range(3000)]
        assert min(draws) >= 1 and max(draws) <= 16
        assert abs(sum(draws) / len(draws) - 4) < 0.15, sampler
    assert set(draw_loops("uniform", 4, 16, 0, s) for s in range(500)) == set(range(1, 8))
    assert max(draw_loops("poisson_lognormal", 4, 6, 0, s) for s in range(500)) == 6     # the cap
    assert mean_loops("poisson_lognormal", 4, 6) < mean_loops("poisson_lognormal", 4, 16)
    assert [draw_loops("uniform", 4, 16, 0, s) for s in range(50)] != \
        [draw_loops("uniform", 4, 16, 1, s) for s in range(50)]               # seeds differ
    assert draw_loops("poisson_lognormal", 1, 8, 0, 5) == 1


@pytest.mark.parametrize("passing", ["base", "mesh"])
def test_truncation_keeps_the_value_and_the_preludes_gradient(passing):
    model, idx = build(passing, max_loops=6).train(), tokens()
    targets = idx.roll(-1, 1)
    whole = model(idx, targets, n_loops=6)[1]
    cut = model(idx, targets, n_loops=6, loops_backprop=2)[1]
    assert torch.allclose(whole, cut, atol=1e-12, rtol=0)                     # the same forward
    cut.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert grads["wte.weight"].abs().sum() > 0 and grads["layers.0.attn.qkv.weight"].abs().sum() > 0
    if passing == "mesh":          # steps 1..4 ran without gradient; 5, 6 (and the read at 0) with it
        assert [s for s in range(7) if grads[f"mesh.write_routers.{s}.weight"] is None] == [1, 2, 3, 4]
    model.zero_grad()
    model(idx, targets, n_loops=6, loops_backprop=6)[1].backward()            # k >= n: no truncation
    again = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad()
    whole.backward()
    assert all(torch.equal(again[n], p.grad) for n, p in model.named_parameters())


def test_flops_follow_the_draw():
    model = build("mesh", max_loops=6)
    at = {n: train_flops_per_token(model, n_loops=n) for n in (1, 3, 6)}
    assert at[3] == train_flops_per_token(model) and at[1] < at[3] < at[6]
    assert train_flops_per_token(model, n_loops=6, loops_backprop=2) < at[6]


@pytest.mark.parametrize("fields, message", [
    (dict(layout="1+2R3+1", max_loops=2), "max_loops = 2 must be >= the layout's K = 3"),
    (dict(n_layer=2, max_loops=4), "max_loops = 4 must be None: no loops"),
])
def test_bad_config_values(fields, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**TINY, **fields)


@pytest.mark.parametrize("kwargs, message", [
    (dict(n_loops=0), "n_loops = 0 must be >= 1 or None"),
    (dict(loops_backprop=0), "loops_backprop = 0 must be >= 1 or None"),
    (dict(exit_threshold=-0.1), "exit_threshold = -0.1 must be >= 0"),
])
def test_bad_forward_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build("base")(tokens(), **kwargs)


@pytest.mark.parametrize("fields", [dict(n_layer=2), dict(n_layer=3, t2mlr=True, l_start=1, l_end=1)])
@pytest.mark.parametrize("kwargs", [dict(n_loops=2), dict(exit_threshold=0.1)])
def test_loops_on_a_flat_stack_are_refused(fields, kwargs):
    model = GPT(GPTConfig(**TINY, **fields)).eval()
    with pytest.raises(ValueError, match="no loops to set"):
        model(tokens(), **kwargs)
    with pytest.raises(ValueError, match="no loops to set"):
        model.generate(tokens(), 2, **kwargs)


def test_unknown_sampler_is_refused():
    with pytest.raises(ValueError, match="loops_sampler 'gamma' is not one of 'fixed', 'poisson_lognormal'"):
        draw_loops("gamma", 4, 8, 0, 0)


@pytest.mark.slow
def test_compiled_random_depth_compiles_one_graph_per_draw_and_never_falls_back(tmp_path, monkeypatch):
    """train.py compiles random-depth training with static shapes: one graph per loop count drawn, plus the
    evaluation's (no_grad, the trained K), no graph break; a draw past the recompile limit would raise."""
    import json
    import torch._dynamo
    from torch._dynamo.utils import counters

    import train
    from test_train import TINY as TRAIN_TINY, write_dataset
    monkeypatch.chdir(tmp_path)
    write_dataset(tmp_path / "data" / "fox")
    args = [a for a in TRAIN_TINY if not a.startswith("--compile")] + [
        "--compile=True", "--dataset=fox", "--layout=1+1R2+1", "--state_passing=mesh", "--max_iters=8",
        "--loops_sampler=uniform", "--max_loops=4", "--eval_interval=8", "--out_dir=o"]
    torch._dynamo.reset()
    counters.clear()
    with torch._dynamo.config.patch(recompile_limit=torch._dynamo.config.recompile_limit,
                                    fail_on_recompile_limit_hit=False):     # train.py sets both
        torch.set_default_dtype(torch.float32)
        train.main(args)
    rows = [json.loads(line) for line in open(tmp_path / "o" / "log.jsonl")]
    draws = {n for r in rows for n in r.get("loops", [])}
    assert len(draws) > 1, draws                                  # the loop count changed between steps
    assert counters["stats"]["unique_graphs"] == len(draws) + 1
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()
