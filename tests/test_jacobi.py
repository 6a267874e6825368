"""
T²MLR's Jacobi options, each against what it claims to equal (float64, CPU); all but jacobi_init "ungated"
(the T²MLR code's own start) are ours:

- jacobi_tol: 0 is bit-identical to fixed D; a stop at tolerance tol is within the error bound that the
  tolerance and the measured contraction imply; the gradient still flows through the final sweep and
  exactly b sweeps before it.
- converged prefill (mode "converged", generate/sample prefill="converged"): equal to exact prefill, and
  bit for bit to Jacobi at D = T; the cache it fills continues decoding exactly.
- jacobi_checkpoint: the same values and gradients, fewer bytes held for backward.
- jacobi_lag: D follows the length (D = T - lag): the exactness front there, gradient in the last b sweeps.
- jacobi_init "ungated" (the T²MLR code's warm start): the exactness front is at D for both starts.

    python -m pytest -q tests/test_jacobi.py
"""

import pytest
import torch

from bench import SavedTensorMeter
from model import GPT, GPTConfig, InferenceCache
from support.accounting import count_middle_passes, layer_passes, train_flops_per_token

TINY_LLAMA = dict(
    vocab_size=64,
    block_size=48,
    n_embd=32,
    n_head=4,
    flavour="llama",
    n_kv_head=2,
    mlp_hidden=48,
    rope_theta=100000.0,
    n_layer=5,
    t2mlr=True,
    l_start=1,
    l_end=3,
)


def build(seed=0, theta=(0.6, -0.3), dtype=torch.float64, **kw):
    """A float64 T²MLR model with random weights, biases and norms perturbed, the global gates opened."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(**(TINY_LLAMA | kw))).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() < 2:
                p.add_(0.1 * torch.randn_like(p))
        model.gate.theta_r.fill_(theta[0])
        model.gate.theta_x.fill_(theta[1])
    # model.passes.n: the middle-layer passes of the last forward, counted from outside by a hook
    model.passes = count_middle_passes(model)
    model.register_forward_pre_hook(lambda m, args: setattr(m.passes, "n", 0))
    return model.eval()


def tokens(B=3, T=24, seed=1):
    return torch.randint(0, 64, (B, T), generator=torch.Generator().manual_seed(seed))


def shift(R):
    """R_t at position t -> read by position t + 1; position 0 reads zeros (R_{-1} = 0)."""
    return torch.cat([torch.zeros_like(R[:, :1]), R[:, :-1]], dim=1)


def lower_output(model, idx):
    """x, the input of layer l_start, (B, T, C)."""
    return model.run_layers(model.wte(idx) * model.cfg.n_embd ** 0.5, model.lower, 0)


def x_part_of(model, x):
    """A's x columns and b on x, as GPT.jacobi_forward computes them once for its sweeps (its speed-up)."""
    return torch.nn.functional.linear(x, model.gate.A.weight[:, :x.shape[-1]], model.gate.A.bias)


def middle_step(model, x, R_prev, control=None, x_part=None):
    """One sweep's step at every position of x: the gate (T1), the middle layers, the update (T2) -> (h, R);
    control (B, T, 1) the control flow c_t."""
    h = model.run_layers(model.temporal_gate(x, R_prev, control, x_part), model.middle, 0)
    return h, model.state_update(h, R_prev, control)


def logits_from_state(model, x, state, control=None, x_part=None):
    """The final sweep from a given state R^(D-1): middle_step, the upper layers and the head."""
    h, _ = middle_step(model, x, state, control, x_part_of(model, x) if x_part is None else x_part)
    return model.lm_head(model.ln_f(model.run_layers(h, model.upper, 0)))


def fixed_d_logits(model, idx, control=None):
    """Jacobi with a fixed D written out as the loop it was before jacobi_tol existed: D-1 sweeps from
    R = 0, the last b with gradient, then the final pass (the slow obvious definition for tol = 0)."""
    cfg = model.cfg
    grad = torch.is_grad_enabled()
    x = lower_output(model, idx)
    x_part, c = x_part_of(model, x), None if control is None else control.unsqueeze(-1)
    state = torch.zeros_like(x)
    for d in range(cfg.jacobi_sweeps - 1):
        with torch.set_grad_enabled(grad and cfg.jacobi_sweeps - 1 - d <= cfg.jacobi_grad_sweeps):
            state = shift(middle_step(model, x, state, c, x_part)[1])
    return logits_from_state(model, x, state, c, x_part)


def sweep_changes(model, idx, sweeps):
    """`sweeps` Jacobi sweeps by hand: (x, states R^(0..sweeps), changes max|R^(k) - R^(k-1)| / RMS(R^(k)))"""
    x = lower_output(model, idx)
    states, changes = [torch.zeros_like(x)], []   # R^(0)
    for _ in range(sweeps):
        states.append(shift(middle_step(model, x, states[-1], x_part=x_part_of(model, x))[1]))
        changes.append(((states[-1] - states[-2]).abs().max() / states[-1].pow(2).mean().sqrt()).item())
    return x, states, changes


# -----------------------------------------------------------------------------
# jacobi_tol: early stop of the no-grad sweeps

@pytest.mark.parametrize("D, b", [pytest.param(16, 4, marks=pytest.mark.slow), (6, 6), (3, 0)])
def test_tol_zero_is_bit_identical_to_fixed_d(D, b):
    """Values and gradients of jacobi_tol = 0 equal the fixed-D loop bit for bit; D passes are recorded."""
    model = build(jacobi_sweeps=D, jacobi_grad_sweeps=b).train()
    idx, targets = tokens(), tokens(seed=2)
    logits, passes = model(idx, mode="jacobi")[0], model.passes.n
    assert torch.equal(logits, fixed_d_logits(model, idx)) and passes == D
    grads = []
    for forward in (lambda: model(idx, mode="jacobi")[0], lambda: fixed_d_logits(model, idx)):
        model.zero_grad()
        torch.nn.functional.cross_entropy(forward().flatten(0, 1), targets.flatten()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])


@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-7])
def test_tol_stop_is_within_the_bound_it_implies(tol):
    """Contractive setting (small global gates, R_t = h_t): the stop comes at the first sweep k whose change
    is <= tol · RMS(R^(k)), and the state then differs from the converged one (T - 1 sweeps: exact) by at
    most Σ_{j>k} Δ_j <= Δ_k · ρ / (1 - ρ) <= tol · RMS(R^(k)) · ρ / (1 - ρ), with Δ_j = max|R^(j) - R^(j-1)|
    and ρ < 1 the largest measured ratio Δ_{j+1} / Δ_j after the stop."""
    T = 24
    model = build(
        theta=(0.05, 0.05), recurrent_residual=False, jacobi_sweeps=T, jacobi_grad_sweeps=0, jacobi_tol=tol
    )
    idx = tokens(T=T)
    with torch.no_grad():
        x, states, changes = sweep_changes(model, idx, T - 1)
        k = next(i for i, c in enumerate(changes, start=1) if c <= tol)            # sweeps until the stop
        logits = model(idx, mode="jacobi")[0]
        # k sweeps + the final pass, which started from R^(k)
        assert model.passes.n == k + 1 < T
        assert torch.equal(logits, logits_from_state(model, x, states[k]))
    # Δ_{k+1}, Δ_{k+2}, ...
    deltas = [(b - a).abs().max().item() for a, b in zip(states[k:], states[k + 1:])]
    # float64 rounding of O(1) states: ratios below it are noise
    floor = 1e-13
    deltas = [d for d in [(states[k] - states[k - 1]).abs().max().item()] + deltas if d > floor]
    rho = max(b / a for a, b in zip(deltas, deltas[1:]))          # the contraction factor ρ
    assert rho < 1
    bound = tol * states[k].pow(2).mean().sqrt().item() * rho / (1 - rho) + T * floor
    error = (states[k] - states[-1]).abs().max().item()   # the stop's state vs the converged one
    assert 0 < error <= bound, (error, bound, k, rho)


def test_tol_gradient_flows_through_the_final_and_exactly_b_sweeps():
    """A stop after k free sweeps is the fixed-D computation with D = k + b + 1: equal values and gradients,
    and those differ from a computation with one gradient sweep fewer."""
    idx, targets = tokens(T=16), tokens(T=16, seed=2)
    stopped = build(theta=(0.05, 0.05), recurrent_residual=False, jacobi_sweeps=16, jacobi_grad_sweeps=3,
                    jacobi_tol=1e-3).train()
    loss = torch.nn.functional.cross_entropy(stopped(idx, mode="jacobi")[0].flatten(0, 1), targets.flatten())
    D = stopped.passes.n
    # it did stop early, after some free sweeps
    assert 4 < D < 16
    loss.backward()
    for b, same in ((3, True), (2, False)):
        fixed = build(theta=(0.05, 0.05), recurrent_residual=False, jacobi_sweeps=D, jacobi_grad_sweeps=b).train()
        fixed_loss = torch.nn.functional.cross_entropy(
            fixed(idx, mode="jacobi")[0].flatten(0, 1), targets.flatten()
        )
        fixed_loss.backward()
        assert torch.equal(fixed_loss, loss)
        g, h = stopped.gate.W_p.weight.grad, fixed.gate.W_p.weight.grad
        assert torch.equal(g, h) == same


@pytest.mark.parametrize("lag", [1, 3])
def test_jacobi_lag_makes_D_follow_the_length(lag):
    """jacobi_lag: D = T - lag sweeps for each length T (one for T <= lag), so the first T - lag positions
    equal exact recurrence and the next does not."""
    model = build(jacobi_lag=lag)          # jacobi_sweeps = 16 is not used
    for T in (2, 7, 15, 24):
        idx = tokens(T=T)
        with torch.no_grad():
            exact = model(idx, mode="exact")[0]
            diff = (model(idx, mode="jacobi")[0] - exact).abs().amax(dim=(0, 2))
        D = max(1, T - lag)
        assert model.passes.n == D, (T, model.passes.n)
        assert diff[:D].max() <= 1e-12 and (D == T or diff[D] > 1e-6), (T, diff)


def test_jacobi_lag_keeps_gradient_in_the_final_and_b_sweeps():
    """Under jacobi_lag the gradient flows through the final sweep and jacobi_grad_sweeps = b before it:
    the fixed-D model at D = T - lag with that b gives the same loss and gradients, with b - 1 others."""
    T, lag = 16, 5
    idx, targets = tokens(T=T), tokens(T=T, seed=2)

    def grad(**kw):
        model = build(**({"jacobi_grad_sweeps": 3} | kw)).train()
        model(idx, targets, mode="jacobi")[1].backward()
        return model.passes.n, model.gate.W_p.weight.grad

    n, g = grad(jacobi_lag=lag)
    assert n == T - lag
    assert torch.equal(g, grad(jacobi_sweeps=T - lag)[1])
    assert not torch.allclose(g, grad(jacobi_sweeps=T - lag, jacobi_grad_sweeps=2)[1])


def test_jacobi_tol_is_range_checked():
    with pytest.raises(ValueError, match=r"^jacobi_tol = -0\.1 must be in \[0, 1\)"):
        GPTConfig(**TINY_LLAMA, jacobi_tol=-0.1)
    with pytest.raises(ValueError, match=r"^jacobi_lag = -1 must be >= 0"):
        GPTConfig(**TINY_LLAMA, jacobi_lag=-1)
    with pytest.raises(ValueError, match=r"^jacobi_init = 'warm' must be one of 'zero', 'ungated'"):
        GPTConfig(**TINY_LLAMA, jacobi_init="warm")


# -----------------------------------------------------------------------------
# Parallel Jacobi prefill (mode "converged")

@pytest.mark.parametrize("control", [None, "mixed"])
def test_converged_prefill_equals_exact_prefill(control):
    """tol = 0: logits, the cache's final state and every cached key equal exact prefill (float64, 1e-12),
    and the logits equal Jacobi at D = T bit for bit."""
    T = 20
    model = build()
    idx = tokens(T=T)
    c = None if control is None else torch.tensor([[1] * 5 + [2] * 15, [2] * 20, [1] * 12 + [2] * 8])
    caches = {mode: InferenceCache(model.cfg.n_unrolled) for mode in ("exact", "converged")}
    with torch.no_grad():
        out = {mode: model(idx, mode=mode, cache=cache, control=c)[0] for mode, cache in caches.items()}
        model.cfg.jacobi_sweeps = T
        jacobi = model(idx, mode="jacobi", control=c)[0]
    assert (out["converged"] - out["exact"]).abs().max() <= 1e-12
    assert torch.equal(out["converged"], jacobi)
    assert (caches["converged"].R - caches["exact"].R).abs().max() <= 1e-12
    for a, b in zip(caches["converged"].layers, caches["exact"].layers):
        assert a["k"].shape[2] == b["k"].shape[2] == T and (a["k"] - b["k"]).abs().max() <= 1e-12


def test_converged_prefill_then_decoding_equals_exact_generation():
    """generate(prefill="converged") continues exactly: greedy tokens equal exact prefill's, with a
    non-recurrent prompt (converges in two sweeps) and a recurrent one, also once the window slides."""
    model = build(block_size=24)
    prompt = tokens(B=2, T=16)
    for recurrent_prompt in (False, True):
        want = model.generate(prompt, 14, temperature=0, recurrent_prompt=recurrent_prompt)
        got = model.generate(
            prompt, 14, temperature=0, recurrent_prompt=recurrent_prompt, prefill="converged"
        )
        assert torch.equal(got, want)
    with torch.no_grad():
        model(prompt, mode="converged", cache=InferenceCache(model.cfg.n_unrolled), control=torch.ones_like(prompt),
              tol=1e-12)
    # sweep 1 is exact, sweep 2 confirms it, then the final pass
    assert model.passes.n == 3


def test_converged_prefill_tolerance_trades_sweeps_for_bounded_error():
    T = 40
    model = build(theta=(0.05, 0.05), recurrent_residual=False, block_size=T)
    idx = tokens(T=T)
    with torch.no_grad():
        exact = model(idx, mode="exact")[0]
        errors, passes = [], []
        for tol in (0.0, 1e-8, 1e-4):
            errors.append((model(idx, mode="converged", tol=tol)[0] - exact).abs().max().item())
            passes.append(model.passes.n)
    assert passes[0] == T and passes[0] > passes[1] > passes[2]
    assert errors[0] <= 1e-12 and errors[1] <= 1e-6 and errors[1] <= errors[2]


def test_converged_prefill_refuses_a_filled_cache():
    model = build()
    cache = InferenceCache(model.cfg.n_unrolled)
    with torch.no_grad():
        model(tokens(T=4), cache=cache)
        with pytest.raises(
            ValueError, match=r"^mode 'converged' cannot continue a cache of 4 positions"
        ):
            model(tokens(T=4), mode="converged", cache=cache)
    with pytest.raises(ValueError, match=r"^prefill = 'fast' must be one of 'exact', 'converged'"):
        model.generate(tokens(T=4), 2, prefill="fast")


# -----------------------------------------------------------------------------
# Sweep checkpointing and the ungated start

def test_checkpointed_sweeps_equal_plain_sweeps_and_hold_fewer_bytes():
    idx, targets = tokens(T=24), tokens(T=24, seed=2)
    held, grads = {}, {}
    for ckpt in (False, True):
        model = build(jacobi_sweeps=8, jacobi_grad_sweeps=4, jacobi_checkpoint=ckpt).train()
        weights = list(model.parameters())
        with SavedTensorMeter(exclude=weights) as meter:
            logits, loss = model(idx, targets, mode="jacobi")
        held[ckpt] = meter.peak
        loss.backward()
        grads[ckpt] = (logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    assert torch.equal(grads[True][0], grads[False][0])
    for n, g in grads[False][1].items():
        assert torch.allclose(grads[True][1][n], g, rtol=1e-12, atol=1e-14), n
    assert held[True] < 0.8 * held[False], held


@pytest.mark.parametrize("init", ["zero", "ungated"])
def test_exactness_front_is_at_d_for_both_starts(init):
    T = 24
    model = build(jacobi_init=init)
    idx = tokens(T=T)
    with torch.no_grad():
        exact = model(idx, mode="exact")[0]
        for D in (1, 4, 9):
            model.cfg.jacobi_sweeps = D
            diff = (model(idx, mode="jacobi")[0] - exact).abs().amax(dim=(0, 2))
            assert diff[:D].max() <= 1e-12 and diff[D] > 1e-6, (init, D)
            assert model.passes.n == D + (init == "ungated")


def test_ungated_start_is_the_shifted_ungated_middle_pass():
    """R^(0) = shift(h^(0)), h^(0) the middle layers on x without the gate (the T²MLR code's start): with
    D = 1 the final sweep starts from it."""
    model = build(jacobi_init="ungated", jacobi_sweeps=1, jacobi_grad_sweeps=0)
    idx = tokens()
    with torch.no_grad():
        x = lower_output(model, idx)
        start = shift(model.run_layers(x, model.middle, 0))                            # R^(0)
        want = logits_from_state(model, x, start)
        zero = logits_from_state(model, x, torch.zeros_like(x))
        assert torch.equal(model(idx, mode="jacobi")[0], want) and model.passes.n == 2
    assert (want - zero)[:, 1:].abs().max() > 1e-6                                  # the start matters


def test_flop_count_follows_the_options():
    """layer_passes: the ungated start adds a middle forward, checkpointing b recomputed forwards."""
    def middle(**kw):
        with torch.device("meta"):
            model = GPT(GPTConfig(**(TINY_LLAMA | dict(jacobi_sweeps=16, jacobi_grad_sweeps=4) | kw)))
        return layer_passes(model)[2]                              # layer 2: inside l_start..l_end = 1..3
    assert middle() == (16, 5)
    assert middle(jacobi_init="ungated") == (17, 5)
    assert middle(jacobi_checkpoint=True) == (20, 5)
    assert middle(jacobi_tol=0.1) == (16, 5)                          # an early stop only lowers it
    assert middle(jacobi_sweeps=3, jacobi_grad_sweeps=3, jacobi_init="ungated") == (4, 4)


@pytest.mark.parametrize("option, extra_passes", [("jacobi_init", 1), ("jacobi_checkpoint", 4)])
def test_the_options_add_middle_layer_flops_only(option, extra_passes):
    """The ungated start's extra middle pass and checkpointing's recomputed forwards (b = 4 of them) run the
    middle layers but not the gate: train_flops_per_token grows by exactly that many middle forwards of
    layer FLOPs (b < D: no backward through the ungated start)."""
    with torch.device("meta"):
        zero = GPT(GPTConfig(**(TINY_LLAMA | dict(jacobi_sweeps=16, jacobi_grad_sweeps=4))))
        other = GPT(GPTConfig(**(TINY_LLAMA | dict(jacobi_sweeps=16, jacobi_grad_sweeps=4,
                                                   **{option: "ungated" if option == "jacobi_init" else True}))))
    T, C = TINY_LLAMA["block_size"], TINY_LLAMA["n_embd"]
    layer_fwd = 2 * sum(p.numel() for p in zero.layers[0].parameters()) + 4 * C * T
    n_mid = len(zero.middle)
    assert train_flops_per_token(other) - train_flops_per_token(zero) == extra_passes * n_mid * layer_fwd
