"""
Equivalences that make the model trustworthy, each against a slow obvious computation (float64, CPU).

MeSH family (the MeSH paper's prelude/core/coda layouts, its §3.1 heuristics and its Eq. 3 memory): a
one-loop layout equals the vanilla stack; MeSH with one-hot routers equals base and residual recursion;
KV-cache decoding equals full recompute; causality; the papers' parameter counts. T²MLR (the Jacobi
training and exact decoding of the T²MLR code): Jacobi with D >= T equals exact recurrence
equals a naive token-by-token loop over the full stack (with the gate and the state update in their direct
forms, gate_direct and update_direct), values and gradients; the exactness front for D < T; zero gates
equal the vanilla model; a vanilla checkpoint retrofitted; cached decoding; batch-row independence; the
control flow (c = 0 padding, 1 non-recurrent, >= 2 recurrent) against a naive loop of its own.

Run: python -m pytest -q test_equivalence.py
"""

import pytest
import torch

from model import GPT, GPTConfig, InferenceCache
from support.accounting import param_counts, summary


@pytest.fixture(autouse=True)
def float64_default():
    """Every test in this file builds its models and tensors in float64 (the 1e-12 tolerances need it). The
    default is set per test and restored after, so tests in other files keep running in float32."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


TINY = dict(vocab_size=64, block_size=48, n_embd=32, n_head=4)
TINY_LLAMA = dict(TINY, flavour="llama", n_kv_head=2, mlp_hidden=48, rope_theta=100000.0)
VARIANTS = {
    "vanilla_neox": dict(TINY, n_layer=4),
    "vanilla_llama": dict(TINY_LLAMA, n_layer=4),
    **{
        f"recursive_{mode}": dict(TINY, layout="1+2R2+1", state_passing=mode)
        for mode in ("base", "residual", "anchor", "anchor_star", "mesh")
    },
    "mesh_emb_router_llama": dict(
        TINY_LLAMA, layout="1+1R3+1", state_passing="mesh", mesh_trans_router_in="emb"
    ),
    "t2mlr_llama": dict(TINY_LLAMA, n_layer=5, t2mlr=True, l_start=1, l_end=3),
    "t2mlr_neox_detached": dict(TINY, n_layer=4, t2mlr=True, l_start=1, l_end=-2, recurrent_detach=True),
    "t2mlr_no_residual": dict(TINY_LLAMA, n_layer=4, t2mlr=True, l_start=0, l_end=-1, recurrent_residual=False),
}


def build(seed=0, **kw):
    """A float64 model with random weights; T²MLR gates opened (θ != 0) so the recurrence is active."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**kw))
    with torch.no_grad():
        for p in model.parameters():      # perturb biases and norms too, so no term is trivially zero
            if p.dim() < 2:
                p.add_(0.1 * torch.randn_like(p))
        if model.gate is not None:
            model.gate.theta_r.fill_(0.6)
            model.gate.theta_x.fill_(-0.3)
    return model.eval()


def tokens(B=3, T=24, vocab=64, seed=1):
    return torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(seed))


# -----------------------------------------------------------------------------
# MeSH family

def test_one_loop_layout_equals_vanilla():
    """layout 0+12R1+0 with base state passing is literally the 12-layer vanilla stack."""
    vanilla = build(**dict(TINY, n_layer=12))
    looped = GPT(GPTConfig(**dict(TINY, layout="0+12R1+0", state_passing="base"))).eval()
    looped.load_state_dict(vanilla.state_dict())
    idx = tokens()
    assert torch.allclose(vanilla(idx)[0], looped(idx)[0], atol=1e-12, rtol=0)


def one_hot_routers(model, reads, writes):
    """Force every router to a one-hot slot choice: zero weights, bias +1e4 on the chosen slot (softmax ->
    exactly 1)."""
    with torch.no_grad():
        for routers, slots in ((model.mesh.write_routers, writes), (model.mesh.read_routers, reads)):
            for router, slot in zip(routers, slots):
                router.weight.zero_()
                router.bias.fill_(-1e4)
                router.bias[slot] = 1e4


@pytest.mark.parametrize("flavour", [TINY, TINY_LLAMA])
def test_mesh_one_hot_reproduces_base_and_residual(flavour):
    """The MeSH paper says its memory contains base and residual recursion as special cases; that one-hot
    routers reproduce them exactly is our own reading. Steps = transitional + K loops.
    base: write step s into fresh slot s+1 and read it back -> h(t+1) = f_core(h(t)).
    residual: write and read slot 1 always -> m_1 = h_pre + sum of the y_k, so h(t+1) = h(t) + f_core(h(t))."""
    K, idx = 3, tokens()
    for mode, slots in (("base", [1, 2, 3, 4]), ("residual", [1, 1, 1, 1])):
        recursion = build(**dict(flavour, layout=f"1+2R{K}+1", state_passing=mode))
        mesh = GPT(GPTConfig(**dict(flavour, layout=f"1+2R{K}+1", state_passing="mesh"))).eval()
        assert mesh.cfg.n_slots == K + 3
        missing, unexpected = mesh.load_state_dict(recursion.state_dict(), strict=False)
        assert unexpected == [] and all(name.startswith("mesh.") for name in missing)
        one_hot_routers(mesh, reads=slots, writes=slots)
        assert torch.allclose(mesh(idx)[0], recursion(idx)[0], atol=1e-12, rtol=0), mode
    # the mapping is not vacuous: base and residual differ on these weights
    base = build(**dict(flavour, layout=f"1+2R{K}+1", state_passing="base"))
    residual = GPT(GPTConfig(**dict(flavour, layout=f"1+2R{K}+1", state_passing="residual"))).eval()
    residual.load_state_dict(base.state_dict())
    assert (base(idx)[0] - residual(idx)[0]).abs().max() > 1e-3


def test_state_passings_follow_their_equations():
    """h(t+1) = f_core(h(t)) + h_sup(t) for the heuristic modes, checked against a hand-written loop."""
    idx = tokens()
    for mode in ("base", "residual", "anchor", "anchor_star"):
        model = build(**dict(TINY, layout="1+2R3+1", state_passing=mode))
        h_emb = model.wte(idx) * TINY["n_embd"] ** 0.5
        seen = []                     # the rotary tables run_layers hands the layers, read by a pre-hook
        hook = model.layers[0].register_forward_pre_hook(lambda m, args: seen.append(args[1:3]))
        model.run_layers(h_emb, model.layers[:1], 0)
        hook.remove()
        cos, sin = seen[0]
        h = h0 = model.layers[0](h_emb, cos, sin)
        for _ in range(3):
            y = model.layers[2](model.layers[1](h, cos, sin), cos, sin)
            h = y + {"base": 0, "residual": h, "anchor": h0, "anchor_star": h_emb}[mode]
        logits = model.lm_head(model.ln_f(model.layers[3](h, cos, sin)))
        assert torch.allclose(model(idx)[0], logits, atol=1e-12, rtol=0), mode


def test_mesh_routers_are_not_symmetric_at_init():
    """Zero router weights would keep the empty slots identical forever (the MeSH paper gives no router init;
    ours is random weights, zero bias): init must not do that."""
    model = GPT(GPTConfig(**dict(TINY, layout="1+2R2+1", state_passing="mesh")))
    for router in list(model.mesh.write_routers) + list(model.mesh.read_routers):
        assert router.weight.std() > 0.05 and router.bias.abs().max() == 0


@pytest.mark.parametrize("grad", [False, True, "mixed"], ids=["no_grad", "grad", "mixed"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_kv_cache_equals_full_recompute(name, grad):
    """Prefill a prompt, then decode one token at a time and in a chunk: logits equal one full forward,
    without autograd, with it, and switching between them."""
    model = build(**VARIANTS[name])
    idx = tokens(T=30)
    full, _ = model(idx)
    cache = InferenceCache(model.cfg.n_unrolled)
    with torch.set_grad_enabled(bool(grad)):
        pieces = [model(idx[:, :9], cache=cache)[0]]
    with torch.set_grad_enabled(grad is True):
        pieces += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(9, 21)]
        pieces.append(model(idx[:, 21:], cache=cache)[0])      # a multi-token chunk after a cached prefix
    assert cache.length == 30
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_causality(name):
    """Changing token t never changes logits at positions < t, and does change position t's."""
    model = build(**VARIANTS[name])
    idx = tokens(T=20)
    changed = idx.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 64
    for mode in ("jacobi", "exact") if model.gate is not None else (None,):
        a, b = model(idx, mode=mode)[0], model(changed, mode=mode)[0]
        assert torch.equal(a[:, :12], b[:, :12]), mode
        assert (a[:, 12] - b[:, 12]).abs().max() > 1e-6, mode


PAPER_COUNTS = [   # (config fields, non-embedding parameters, router parameters): Pythia's published counts,
    # the MeSH paper's Table 5 and its router formula (with biases); last row: the T²MLR code's
    # SmolLM2-135M
    (dict(n_embd=768, n_head=12, n_layer=12), 85_056_000, 0),
    (dict(n_embd=768, n_head=12, layout="2+4R2+2", state_passing="mesh"), 56_704_512, 23_070),
    (dict(n_embd=1024, n_head=16, n_layer=24), 302_311_424, 0),
    (dict(n_embd=1024, n_head=16, layout="4+8R2+4", state_passing="mesh"), 201_541_632, 30_750),
    (dict(n_embd=1024, n_head=16, layout="3+6R3+3", state_passing="mesh"), 151_156_736, 49_200),
    (dict(n_embd=2048, n_head=8, n_layer=16), 805_736_448, 0),
    (dict(n_embd=2048, n_head=8, layout="3+5R2+3", state_passing="mesh"), 553_945_088, 61_470),
    (dict(n_embd=2048, n_head=16, n_layer=24), 1_208_602_624, 0),
    (dict(n_embd=2048, n_head=16, layout="4+8R2+4", state_passing="mesh"), 805_736_448, 61_470),
    (dict(flavour="llama", n_embd=576, n_layer=30, n_head=9, n_kv_head=3, mlp_hidden=1536), 106_203_456, 0),
]


@pytest.mark.parametrize("fields,non_embedding,router", PAPER_COUNTS)
def test_paper_parameter_counts(fields, non_embedding, router):
    """Non-embedding counts equal the papers' exactly (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=50304, block_size=128, **fields))
    counts = param_counts(model)
    assert counts["non_embedding"] == non_embedding
    assert counts["router"] == router


def test_pythia_total_and_summary():
    """Vanilla 1.4B total equals Pythia-1.4B's published 1,414,647,808; the summary prints the paper's
    numbers."""
    with torch.device("meta"):
        model = GPT(GPTConfig(vocab_size=50304, n_embd=2048, n_head=16, n_layer=24))
    assert param_counts(model)["total"] == 1_414_647_808
    text = summary(GPTConfig(vocab_size=50304, n_embd=768, n_head=12, layout="2+4R2+2", state_passing="mesh"))
    assert "56,704,512" in text and "23,070" in text and "unrolled depth     12" in text


# -----------------------------------------------------------------------------
# T²MLR

def gate_direct(gate, x, r):
    """The gate in the T²MLR paper's form (T1), written apart from model.py's, by matrix products and
    A's rows A_r, A_x: r~ = W_p r, g = [x ; r~], a_r = σ(A_r g + b_r), a_x = σ(A_x g + b_x),
    x' = x + tanh(θ_r) a_r ⊙ r~ + tanh(θ_x) a_x ⊙ x. x, r: (B, T, C) -> (B, T, C)."""
    C = x.shape[-1]
    r = r @ gate.W_p.weight.T
    g = torch.cat([x, r], dim=-1)
    A_r, A_x, b_r, b_x = gate.A.weight[:C], gate.A.weight[C:], gate.A.bias[:C], gate.A.bias[C:]
    a_r, a_x = torch.sigmoid(g @ A_r.T + b_r), torch.sigmoid(g @ A_x.T + b_x)
    return x + torch.tanh(gate.theta_r) * a_r * r + torch.tanh(gate.theta_x) * a_x * x


def update_direct(h, r_prev, residual):
    """The T²MLR code's state update: R_t = h_t (residual off) or R_t = s·(h_t + R_{t-1}) with
    s = clamp(1 / sqrt(mean((h_t + R_{t-1})²) + 1e-6), 1/5, 5) on detached values. (B, T, C) -> (B, T, C)."""
    if not residual:
        return h
    u = h + r_prev
    return u * torch.clamp(1 / torch.sqrt(u.detach().pow(2).mean(-1, keepdim=True) + 1e-6), 0.2, 5.0)


def naive_t2mlr_logits(model, idx):
    """The obvious O(T²) recurrence: for each t, run the FULL stack on idx[:, :t+1] with the known states
    R_{-1}..R_{t-1} injected at l_start (gate_direct), read h_t at l_end, and set R_t = update_direct(h_t,
    R_{t-1})."""
    cfg = model.cfg
    lower, middle, upper = model.lower, model.middle, model.upper
    B, T = idx.shape
    states = [torch.zeros(B, 1, cfg.n_embd)]                    # R_{-1} = 0
    logits = []
    for t in range(T):
        h = model.wte(idx[:, :t + 1]) * cfg.n_embd ** 0.5
        h = model.run_layers(h, lower, 0)
        h = model.run_layers(gate_direct(model.gate, h, torch.cat(states, dim=1)), middle, 0)
        states.append(update_direct(h[:, -1:], states[-1], cfg.recurrent_residual))
        logits.append(model.lm_head(model.ln_f(model.run_layers(h, upper, 0)))[:, -1:])
    return torch.cat(logits, dim=1)


T2MLR_NAMES = [name for name in VARIANTS if name.startswith("t2mlr")]


@pytest.mark.parametrize("name", T2MLR_NAMES)
def test_jacobi_full_depth_equals_exact_equals_naive(name):
    """Jacobi with D >= T is exact (each sweep makes one more position exact): the same logits as exact mode
    and the naive loop."""
    T = 12
    model = build(**dict(VARIANTS[name], jacobi_sweeps=T, jacobi_grad_sweeps=2))
    idx = tokens(T=T)
    jacobi, exact, naive = (
        model(idx, mode="jacobi")[0],
        model(idx, mode="exact")[0],
        naive_t2mlr_logits(model, idx),
    )
    assert (jacobi - naive).abs().max() <= 1e-12
    assert (exact - naive).abs().max() <= 1e-12
    assert (exact - model(idx)[0]).abs().max() == 0               # eval() defaults to exact


@pytest.mark.parametrize("name", T2MLR_NAMES)
def test_jacobi_gradients_equal_exact_gradients(name):
    """With D >= T and b >= D the Jacobi graph computes the exact function, so every gradient agrees."""
    T = 10
    model = build(**dict(VARIANTS[name], jacobi_sweeps=T, jacobi_grad_sweeps=T)).train()
    idx, targets = tokens(T=T), tokens(T=T, seed=2)
    grads = {}
    for mode in ("jacobi", "exact"):
        model.zero_grad()
        model(idx, targets, mode=mode)[1].backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n in grads["exact"]:
        assert torch.allclose(grads["jacobi"][n], grads["exact"][n], atol=1e-12, rtol=1e-10), n
    assert grads["exact"]["gate.W_p.weight"].abs().max() > 0      # the recurrence really carries gradient


def test_jacobi_exactness_front_and_convergence():
    """D < T: positions < D are exact, position D is not; on a contractive setting (small gates) the
    error beyond the front shrinks as D grows."""
    T = 24
    idx = tokens(T=T)
    model = build(**VARIANTS["t2mlr_llama"])
    exact = model(idx, mode="exact")[0]
    for D in (1, 4, 9):
        model.cfg.jacobi_sweeps = D
        diff = (model(idx, mode="jacobi")[0] - exact).abs().amax(dim=(0, 2))
        assert diff[:D].max() <= 1e-12 and diff[D] > 1e-6, D
    with torch.no_grad():
        model.gate.theta_r.fill_(0.05)
        model.gate.theta_x.fill_(0.05)
    exact = model(idx, mode="exact")[0]
    errors = []
    for D in (2, 4, 8, 16):
        model.cfg.jacobi_sweeps = D
        errors.append((model(idx, mode="jacobi")[0] - exact).abs().max().item())
    assert all(a > b for a, b in zip(errors, errors[1:])) and errors[-1] < errors[0] / 10, errors


def test_zero_global_gates_equal_vanilla():
    """θ_r = θ_x = 0 makes the gate an exact identity: T²MLR logits equal the vanilla model's, in both
    modes."""
    fields = dict(TINY_LLAMA, n_layer=5)
    vanilla = build(**fields)
    t2mlr = GPT(GPTConfig(**fields, t2mlr=True, l_start=1, l_end=3)).eval()    # gate at its identity init
    missing, unexpected = t2mlr.load_state_dict(vanilla.state_dict(), strict=False)
    assert unexpected == [] and all(name.startswith("gate.") for name in missing)
    idx = tokens()
    for mode in ("jacobi", "exact"):
        assert torch.allclose(t2mlr(idx, mode=mode)[0], vanilla(idx)[0], atol=1e-12, rtol=0), mode


def test_batch_rows_are_independent():
    """A row's logits do not depend on the other rows of the batch, in every mode."""
    model = build(**VARIANTS["t2mlr_llama"])
    idx = tokens(B=4, T=16)
    for mode in ("jacobi", "exact"):
        together = model(idx, mode=mode)[0]
        alone = torch.cat([model(idx[i:i + 1], mode=mode)[0] for i in range(4)])
        assert torch.allclose(together, alone, atol=1e-12, rtol=0), mode


def identity_middle(model):
    """Zero the middle layers' output projections (attention out, MLP down): each middle layer is then the
    identity, so the middle output h equals the gate's output."""
    with torch.no_grad():
        for layer in model.middle:
            for linear in (layer.attn.proj, layer.mlp.down):
                linear.weight.zero_()
                if linear.bias is not None:
                    linear.bias.zero_()
    return model


def test_state_update_clamps_its_stop_gradient_scale():
    """state_update (T2) writes R = s·(h + R_prev), s = clamp(1/rms, 0.2, 5) on detached values (the
    T²MLR code's update), R = h at non-recurrent tokens (c = 1) and without recurrent_residual, and
    R = R_prev at a pad (c = 0): a pad leaves the state."""
    model = build(**VARIANTS["t2mlr_llama"])
    h = torch.full((1, 1, 32), 10.0, requires_grad=True)            # rms 10 -> s = 0.1, clamped to 0.2
    r = model.state_update(h, torch.zeros(1, 1, 32))
    assert torch.allclose(r, torch.full((1, 1, 32), 2.0), atol=1e-14, rtol=0)
    r.sum().backward()
    assert torch.allclose(h.grad, torch.full((1, 1, 32), 0.2))     # the scale is a constant for autograd
    small = model.state_update(torch.full((1, 1, 32), 0.25), torch.full((1, 1, 32), 0.25))
    # u = 0.5, s = 1/sqrt(0.25 + 1e-6)
    assert torch.allclose(small, torch.full((1, 1, 32), 0.5 / 0.250001 ** 0.5), atol=1e-15, rtol=0)
    h2, control = torch.randn(1, 4, 32), torch.tensor([2, 1, 0, 3]).view(1, 4, 1)
    R_prev = torch.randn(1, 1, 32)
    mixed = model.state_update(h2, R_prev, control)
    assert torch.equal(mixed[:, 1], h2[:, 1]) and torch.equal(mixed[:, 2], R_prev[:, 0])
    assert torch.equal(mixed[:, 0], model.state_update(h2, R_prev)[:, 0]) and not torch.equal(mixed[:, 0], h2[:, 0])
    model.cfg.recurrent_residual = False                                # R_t = h_t, the raw l_end output
    assert torch.equal(model.state_update(h.detach(), torch.ones(1, 1, 32)), h.detach())
    assert torch.equal(model.state_update(h2, R_prev, control)[:, 2], R_prev[:, 0])   # a pad still keeps it


def test_gate_equals_the_direct_form():
    """GPT.temporal_gate (one Linear on g = [x; r~], a state broadcast over the positions), and its Jacobi
    speed-up (x_part: A's x columns and b applied to x once, as jacobi_forward does), are the gate of (T1)
    written by A's rows (gate_direct): values, and the gradients of x, R and every gate weight."""
    model = build(**VARIANTS["t2mlr_llama"])
    gate = model.gate
    x, r = torch.randn(2, 5, 32, requires_grad=True), torch.randn(2, 1, 32, requires_grad=True)
    grads = {}
    for name, out in (("direct", lambda: gate_direct(gate, x, r.expand(2, 5, 32))),
                      ("model", lambda: model.temporal_gate(x, r)),
                      ("split", lambda: model.temporal_gate(x, r, x_part=torch.nn.functional.linear(
                          x, gate.A.weight[:, :32], gate.A.bias)))):
        gate.zero_grad(), setattr(x, "grad", None), setattr(r, "grad", None)
        y = out()
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        grads[name] = (y.detach(), x.grad, r.grad, *(p.grad for p in gate.parameters()))
    for name in ("model", "split"):
        for want, got in zip(grads["direct"], grads[name]):
            assert (want - got).abs().max() <= 1e-13
    assert grads["split"][3].abs().max() > 0                                    # W_p gets a gradient


def test_controlled_gate_equals_the_direct_form():
    """The gate under control flow (c > 1 recurrent; 1 and 0, a pad, not) equals gate_direct at recurrent
    positions and passes x through at the others; through identity middle layers, so does the middle output."""
    model = identity_middle(build(**VARIANTS["t2mlr_llama"]))
    x, r = torch.randn(2, 5, 32), torch.randn(2, 5, 32)
    control = torch.tensor([[2, 3, 0, 2, 1], [1, 2, 2, 2, 2]]).unsqueeze(-1)
    recurrent = control > 1
    h = model.run_layers(model.temporal_gate(x, r, control=control), model.middle, 0)
    want = torch.where(recurrent, gate_direct(model.gate, x, r), x)
    assert (h - want).abs().max() <= 1e-14 and (h - x)[recurrent.expand_as(x)].abs().min() > 0


def test_retrofit_from_a_vanilla_checkpoint(tmp_path):
    """train.py --init_from=vanilla/ckpt.pt: the T²MLR gate starts as an identity, so the first forward of the
    retrofitted model equals the vanilla model's exactly, in both modes; another architecture is refused."""
    from train import RunError, init_weights_from
    fields = dict(TINY_LLAMA, n_layer=5)
    vanilla = build(**fields)
    torch.save({"model": vanilla.state_dict()}, tmp_path / "ckpt.pt")
    t2mlr = GPT(GPTConfig(**fields, t2mlr=True, l_start=1, l_end=3)).eval()
    init_weights_from(t2mlr, str(tmp_path / "ckpt.pt"))
    idx = tokens()
    # the same operations: bit-identical
    assert torch.equal(t2mlr(idx, mode="jacobi")[0], vanilla(idx)[0])
    assert torch.allclose(t2mlr(idx, mode="exact")[0], vanilla(idx)[0], atol=1e-12, rtol=0)   # token by token
    wider = GPT(GPTConfig(**dict(fields, n_embd=48), t2mlr=True, l_start=1, l_end=3))
    with pytest.raises(RunError, match=r"wte.weight \(64, 32\) vs this model's \(64, 48\)"):
        init_weights_from(wider, str(tmp_path / "ckpt.pt"))


# -----------------------------------------------------------------------------
# T²MLR control flow: c = 0 padding, 1 non-recurrent, >= 2 recurrent (mixing and merging only where c > 1)

def mixed_control(T=14):
    """Four rows with segment switches: a prompt then recurrence with pads at the end; several switches;
    recurrent from the start with pads at the end; left pads, then pads in the middle of a recurrent span
    (a later token reads the state from before them)."""
    rows = [[1] * 4 + [2] * (T - 6) + [0] * 2,
            ([1, 1, 2, 2, 1, 1, 2, 2, 2, 1] + [2] * T)[:T],
            [2] * (T - 3) + [0] * 3,
            ([0, 0, 1, 2, 2, 0, 0, 2, 2, 1, 0, 2] + [2] * T)[:T]]
    return torch.tensor(rows)


def naive_control_logits(model, idx, control):
    """The obvious O(T²) loop with control flow: for each t, run the FULL stack on idx[:, :t+1], mixing the
    known states R_{-1}..R_{t-1} only into positions with c > 1; then R_t = update(h_t, R_{t-1}) if c_t > 1,
    the raw h_t if c_t = 1, and R_{t-1} if c_t = 0 (a pad leaves the state). Written without model.py's
    mask helpers."""
    cfg = model.cfg
    lower, middle, upper = model.lower, model.middle, model.upper
    B, T = idx.shape
    states = [torch.zeros(B, 1, cfg.n_embd)]
    logits = []
    for t in range(T):
        x = model.run_layers(model.wte(idx[:, :t + 1]) * cfg.n_embd ** 0.5, lower, 0)
        mixed = gate_direct(model.gate, x, torch.cat(states, dim=1))
        is_rec = (control[:, :t + 1] >= 2)[..., None].to(x.dtype)
        h = model.run_layers(is_rec * mixed + (1 - is_rec) * x, middle, 0)
        h_t, rec_t = h[:, -1:], is_rec[:, -1:]
        pad_t = (control[:, t:t + 1] == 0)[..., None].to(x.dtype)
        states.append(rec_t * update_direct(h_t, states[-1], cfg.recurrent_residual)
                      + (1 - rec_t - pad_t) * h_t + pad_t * states[-1])
        logits.append(model.lm_head(model.ln_f(model.run_layers(h, upper, 0)))[:, -1:])
    return torch.cat(logits, dim=1)


@pytest.mark.parametrize("name", T2MLR_NAMES)
def test_control_flow_jacobi_equals_exact_equals_naive(name):
    """Mixed segments: Jacobi with D >= T = exact (with its parallel non-recurrent spans) = the naive loop."""
    T = 14
    model = build(**dict(VARIANTS[name], jacobi_sweeps=T, jacobi_grad_sweeps=2))
    idx, control = tokens(B=4, T=T), mixed_control(T)
    naive = naive_control_logits(model, idx, control)
    jacobi, exact = (
        model(idx, mode="jacobi", control=control)[0],
        model(idx, mode="exact", control=control)[0],
    )
    assert (jacobi - naive).abs().max() <= 1e-10
    assert (exact - naive).abs().max() <= 1e-10
    assert (exact - model(idx)[0]).abs().max() > 1e-3          # control really changes the function


@pytest.mark.parametrize("name", T2MLR_NAMES)
def test_control_flow_gradients_jacobi_equal_exact(name):
    T = 12
    model = build(**dict(VARIANTS[name], jacobi_sweeps=T, jacobi_grad_sweeps=T)).train()
    idx, targets, control = tokens(B=4, T=T), tokens(B=4, T=T, seed=2), mixed_control(T)
    grads = {}
    for mode in ("jacobi", "exact"):
        model.zero_grad()
        model(idx, targets, mode=mode, control=control)[1].backward()
        grads[mode] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n in grads["exact"]:
        assert torch.allclose(grads["jacobi"][n], grads["exact"][n], atol=1e-10, rtol=1e-8), n
    assert grads["exact"]["gate.W_p.weight"].abs().max() > 0


def test_control_flow_all_recurrent_is_bit_identical_to_none():
    """control = 2 everywhere takes the masked path and must give exactly control=None's values."""
    model = build(**VARIANTS["t2mlr_llama"])
    idx = tokens(T=16)
    for mode in ("jacobi", "exact"):
        assert torch.equal(
            model(idx, mode=mode, control=torch.full_like(idx, 2))[0], model(idx, mode=mode)[0]
        )


def test_control_flow_cached_decoding_equals_exact():
    """Prefill the non-recurrent prompt with the cache, then decode one token at a time: exact's logits."""
    model = build(**VARIANTS["t2mlr_llama"])
    T, P = 14, 5
    idx, control = tokens(B=4, T=T), mixed_control(T)
    exact = model(idx, mode="exact", control=control)[0]
    cache = InferenceCache(model.cfg.n_unrolled)
    pieces = [model(idx[:, :P], cache=cache, control=control[:, :P])[0]]
    for t in range(P, T):
        pieces.append(model(idx[:, t:t + 1], cache=cache, control=control[:, t:t + 1])[0])
    assert (torch.cat(pieces, dim=1) - exact).abs().max() <= 1e-10


def test_padding_changes_no_other_position():
    """Right padding (c = 0) with any ids: the real positions' logits do not move, in both modes, and
    equal those of the unpadded row run alone. (Only trailing pads: a pad before a real token is keyed by
    attention unless the cache's offsets mask it, as generate's left pads are.)"""
    T = 14
    model = build(**dict(VARIANTS["t2mlr_llama"], jacobi_sweeps=T))
    idx, control = tokens(B=4, T=T), mixed_control(T)
    other, trailing = idx.clone(), (control == 0) & (control.flip(1).cumsum(1).flip(1) == 0)
    assert trailing[[0, 2]].any() and not trailing[3].any()
    other[trailing] = (other[trailing] + 7) % 64
    real = control[0] > 0
    alone_ids, alone_control = idx[:1, real], control[:1, real]
    for mode in ("jacobi", "exact"):
        a, b = model(idx, mode=mode, control=control)[0], model(other, mode=mode, control=control)[0]
        assert torch.equal(a[control > 0], b[control > 0]), mode
        alone = model(alone_ids, mode=mode, control=alone_control)[0]
        assert (a[0, real] - alone[0]).abs().max() <= 1e-10, mode


def test_recurrent_token_after_a_prompt_receives_its_raw_h():
    """c = [1, 2]: position 1 is mixed with R_0 = h_0, the raw l_end output of the prompt token (no merge)."""
    model = build(**VARIANTS["t2mlr_llama"])
    idx = tokens(B=1, T=2)
    lower, middle, upper = model.lower, model.middle, model.upper
    x = model.run_layers(model.wte(idx) * model.cfg.n_embd ** 0.5, lower, 0)
    h0 = model.run_layers(x[:, :1], middle, 0)                      # position 0: not mixed
    h = model.run_layers(torch.cat([x[:, :1], gate_direct(model.gate, x[:, 1:], h0)], dim=1), middle, 0)
    expected = model.lm_head(model.ln_f(model.run_layers(h, upper, 0)))
    got = model(idx, mode="exact", control=torch.tensor([[1, 2]]))[0]
    assert (got - expected).abs().max() <= 1e-12


def test_identity_gate_still_receives_gradient_with_control_flow():
    """At the T²MLR code's gate init (θ = 0: the gate is an identity) only θ gets gradient, and it must: the
    state of a prompt-then-recurrent sequence reaches θ_r, with the same value in Jacobi (D >= T, b >= D) and
    exact mode."""
    T = 12
    torch.manual_seed(0)
    model = GPT(GPTConfig(**dict(VARIANTS["t2mlr_llama"], jacobi_sweeps=T, jacobi_grad_sweeps=T, rope_pct=0.0,
                                 recurrent_detach=True, gate_bias_prob=0.5))).train()
    idx, targets, control = tokens(B=4, T=T), tokens(B=4, T=T, seed=2), mixed_control(T)
    grads = {}
    for mode in ("jacobi", "exact"):
        model.zero_grad()
        model(idx, targets, mode=mode, control=control)[1].backward()
        grads[mode] = (model.gate.theta_r.grad.item(), model.gate.W_p.weight.grad.abs().max().item())
    assert abs(grads["jacobi"][0]) > 1e-6
    assert grads["jacobi"][0] == pytest.approx(grads["exact"][0], rel=1e-9, abs=1e-15)
    assert grads["jacobi"][1] == 0.0 and grads["exact"][1] == 0.0      # W_p is behind γ_r = tanh(0) = 0
