"""
Tests for what sits around T²MLR's gate in training: the gate's learning-rate
groups (gate_lr_multiplier, support/loop.py), the gradients that reach the gate at θ_r = 0, exact training
against Jacobi at D >= T, and the RMS ratio that studies/gate_scale.py reports.

    python -m pytest tests/test_gate.py -q
"""


import pytest
import torch

from model import GPT, GPTConfig
from support.loop import configure_optimizers, get_lr, load_optimizer_state, make_trainer, optimizer_step
from support.runtime import RunError
from train import TrainConfig


def tiny_t2mlr(**overrides):
    keys = dict(flavour="llama", vocab_size=64, block_size=12, n_layer=3, n_embd=16, n_head=2, mlp_hidden=32,
                t2mlr=True, l_start=1, l_end=1, jacobi_sweeps=4, jacobi_grad_sweeps=2) | overrides
    torch.manual_seed(0)
    return GPT(GPTConfig(**keys))


def gate_names(model):
    return {f"gate.{n}" for n, _ in model.gate.named_parameters()}


def group_names(model, optimizer):
    names = {id(p): n for n, p in model.named_parameters()}
    return [{names[id(p)] for p in g["params"]} for g in optimizer.param_groups]


# -----------------------------------------------------------------------------
# gate_lr_multiplier: the parameter groups and the schedule

def test_default_multiplier_keeps_the_two_groups_of_before():
    model = tiny_t2mlr()
    optimizer = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, no_decay = optimizer.param_groups
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    assert decay["lr_scale"] == no_decay["lr_scale"] == 1.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_gate_groups_run_at_m_times_the_schedule_through_warmup_and_decay():
    """m = 5: the gate's groups hold exactly model.gate's parameters (W_p, A, b, θ) and step at 5 x get_lr,
    the others at get_lr, at every step of warmup and cosine decay; weight decay on >= 2-D tensors only."""
    model = tiny_t2mlr()
    cfg = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=3, max_iters=8, weight_decay=0.1,
                      gate_lr_multiplier=5.0)
    trainer = make_trainer(model, cfg, "cpu", torch.float32, "unused.pt")
    groups = trainer.optimizer.param_groups
    names = group_names(model, trainer.optimizer)
    boosted = [n for n, g in zip(names, groups) if g["lr_scale"] == 5.0]
    assert set().union(*boosted) == gate_names(model) == {
        "gate.W_p.weight", "gate.A.weight", "gate.A.bias", "gate.theta_r", "gate.theta_x"}
    assert all(not (n & gate_names(model)) for n, g in zip(names, groups) if g["lr_scale"] == 1.0)
    assert sum(len(n) for n in names) == len(list(model.named_parameters()))     # every parameter once
    for g in groups:
        assert all((p.dim() >= 2) == (g["weight_decay"] == 0.1) for p in g["params"])
    theta = {id(model.gate.theta_r), id(model.gate.theta_x)}
    assert all(g["weight_decay"] == 0.0 for g in groups if theta & {id(p) for p in g["params"]})
    x = torch.randint(0, 64, (2, 12))
    for step in range(cfg.max_iters):
        _, _, lr = optimizer_step(trainer, step, 1, lambda m, _: m(x, x)[1])
        assert lr == get_lr(step, cfg)
        for g in groups:
            assert g["lr"] == pytest.approx(lr * g["lr_scale"], rel=1e-12)
    assert {g["lr_scale"] for g in groups} == {1.0, 5.0}


def test_the_multiplier_scales_the_gates_first_update():
    """Adam's first update is lr · sign(gradient) per parameter: θ_r moves m times as far with m = 10."""
    moves = {}
    for m in (1.0, 10.0):
        model = tiny_t2mlr()
        trainer = make_trainer(model, TrainConfig(learning_rate=1e-3, warmup_iters=0, max_iters=5,
                                                  gate_lr_multiplier=m), "cpu", torch.float32, "x.pt")
        x = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
        optimizer_step(trainer, 0, 1, lambda mod, _: mod(x, x)[1])
        moves[m] = (model.gate.theta_r.item(), model.layers[0].mlp.up.weight.clone())
    assert abs(moves[1.0][0]) == pytest.approx(1e-3, rel=1e-4)
    assert moves[10.0][0] == pytest.approx(10 * moves[1.0][0], rel=1e-4)
    assert torch.allclose(moves[1.0][1], moves[10.0][1])              # the other parameters: the same step


def test_models_without_a_gate_ignore_the_multiplier():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_embd=16, n_head=2, vocab_size=32, block_size=8))
    assert len(configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu", 10.0).param_groups) == 2


def adam_state_by_name(model, optimizer):
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: s["exp_avg"].clone() for p, s in optimizer.state.items()}


@pytest.mark.parametrize("saved_m, resumed_m", [(1.0, 1.0), (1.0, 10.0), (10.0, 1.0), (10.0, 3.0)])
def test_optimizer_state_resumes_across_groupings(saved_m, resumed_m):
    """A state saved with 2 groups (gate_lr_multiplier 1, the layout of every older checkpoint, whose
    groups have no lr_scale) or 4 resumes under any multiplier: every parameter gets its own moments back,
    and the groups keep this run's lr_scale and weight decay."""
    x = torch.randint(0, 64, (2, 12))
    model = tiny_t2mlr()
    saved_opt = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu", saved_m)
    model(x, x)[1].backward()
    saved_opt.step()
    saved = saved_opt.state_dict()
    if saved_m == 1.0:                                  # as written before lr_scale existed
        saved["param_groups"] = [{k: v for k, v in g.items() if k != "lr_scale"} for g in saved["param_groups"]]
    expected = adam_state_by_name(model, saved_opt)
    fresh = configure_optimizers(model, 0.05, 1e-3, (0.9, 0.95), "cpu", resumed_m)
    load_optimizer_state(fresh, saved, model, "ckpt.pt")
    got = adam_state_by_name(model, fresh)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    assert len(fresh.param_groups) == (2 if resumed_m == 1.0 else 4)
    assert {g["lr_scale"] for g in fresh.param_groups} == {1.0, resumed_m}
    assert {g["weight_decay"] for g in fresh.param_groups} == {0.05, 0.0}


def test_an_optimizer_state_of_another_model_is_refused():
    small, other = tiny_t2mlr(), tiny_t2mlr(n_layer=4, l_end=2)
    saved = configure_optimizers(other, 0.1, 1e-3, (0.9, 0.95), "cpu", 2.0).state_dict()
    with pytest.raises(RunError, match=r"ckpt.pt: its optimizer state has groups of \[\d+, \d+, 2, 3\] "
                                       r"parameters, which fit neither grouping"):
        load_optimizer_state(configure_optimizers(small, 0.1, 1e-3, (0.9, 0.95), "cpu"), saved, small, "ckpt.pt")


# -----------------------------------------------------------------------------
# The gradients at θ_r = 0

def gate_grads(model, x):
    model.zero_grad(set_to_none=False)
    model(x, x, mode="exact")[1].backward()
    C = model.cfg.n_embd
    g = model.gate
    return {"W_p": g.W_p.weight.grad, "A_r": g.A.weight.grad[:C], "b_r": g.A.bias.grad[:C],
            "A_x": g.A.weight.grad[C:], "b_x": g.A.bias.grad[C:], "theta_r": g.theta_r.grad, "theta_x": g.theta_x.grad}


def test_at_theta_r_zero_A_r_gets_no_gradient_and_W_p_only_through_the_x_gate():
    """x' = x + tanh(θ_r) σ(A_r g + b_r) ⊙ W_p R + tanh(θ_x) σ(A_x g + b_x) ⊙ x, g = [x; W_p R]. At θ_r = 0, A_r
    and b_r get exactly zero gradient, and W_p only through the x-gate's input (tanh(θ_x)·A_x's r~ columns):
    at init (θ_r = θ_x = 0) W_p, A_r, b_r, A_x, b_x all get exactly zero; θ_r and θ_x get gradient. With θ_x
    = 0.5 (θ_r still 0) W_p does get gradient, A_r still none."""
    model = tiny_t2mlr(recurrent_residual=True).double()
    x = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(3))
    model.train()
    grads = gate_grads(model, x)
    for name in ("W_p", "A_r", "b_r", "A_x", "b_x"):
        assert torch.count_nonzero(grads[name]) == 0, name
    assert grads["theta_r"].abs().item() > 1e-8 and grads["theta_x"].abs().item() > 1e-8
    with torch.no_grad():
        model.gate.theta_x.fill_(0.5)
    grads = gate_grads(model, x)
    assert torch.count_nonzero(grads["A_r"]) == 0 and torch.count_nonzero(grads["b_r"]) == 0
    assert grads["W_p"].abs().max().item() > 1e-8 and grads["A_x"].abs().max().item() > 1e-8
    with torch.no_grad():
        model.gate.theta_r.fill_(0.3)
    assert gate_grads(model, x)["A_r"].abs().max().item() > 1e-8          # once θ_r moves, A_r learns


# -----------------------------------------------------------------------------
# Exact training = Jacobi at D >= T

@pytest.mark.parametrize("detach", [False, True])
def test_exact_training_gradients_equal_jacobi_with_D_at_least_T(detach):
    """model(x, y, mode="exact") in train mode (train_mode="exact": token by token with autograd) has the loss
    and every parameter's gradient of Jacobi with D = T and every sweep with gradient (b = D), in float64
    with an open gate; with D < T the loss differs (positions >= D are not exact)."""
    T = 10
    x = torch.randint(0, 64, (2, T + 1), generator=torch.Generator().manual_seed(2))
    results = {}
    for mode, D in (("exact", T), ("jacobi", T), ("jacobi", T + 2), ("jacobi", 3)):
        model = tiny_t2mlr(block_size=T, jacobi_sweeps=D, jacobi_grad_sweeps=D, recurrent_detach=detach).double()
        with torch.no_grad():
            model.gate.theta_r.fill_(0.7)
            model.gate.theta_x.fill_(-0.4)
        model.train()
        loss = model(x[:, :-1], x[:, 1:].contiguous(), mode=mode)[1]
        loss.backward()
        results[mode, D] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()})
    exact_loss, exact_grads = results["exact", T]
    for D in (T, T + 2):
        loss, grads = results["jacobi", D]
        assert loss == pytest.approx(exact_loss, rel=1e-12, abs=1e-12)
        for name, g in exact_grads.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-9, atol=1e-12, msg=name)
    assert abs(results["jacobi", 3][0] - exact_loss) > 1e-6
