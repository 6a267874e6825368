"""
The training loop's pieces, plain functions for train.py and the studies: the trainer (AdamW with its
parameter groups, the GradScaler, autocast), the learning-rate schedule, when to evaluate, the training
state saved and resumed, the mean loss over fixed batches; and one optimizer step for the studies
(train.py writes its own on the page, with gradient accumulation and DDP's sync).

    trainer = make_trainer(raw_model, cfg, device, dtype, ckpt_path)
    start = resume(trainer, load_checkpoint(ckpt_path), ckpt_path) if resuming else 0
    for step in range(start, cfg.max_iters + 1):
        if evaluation_due(cfg, step, evaluated=start):
            save_state(trainer, step, [rng_states()], ...)
        if step == cfg.max_iters:
            break
        optimizer_step(trainer, step, 1, lambda model, micro: model(x, y)[1])
"""

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from model import GPT
from support.checkpoints import load_weights, save_checkpoint, set_rng_states
from support.runtime import RunError, autocast_context


@dataclass
class Trainer:
    """What an optimizer step changes and a checkpoint saves (make_trainer builds it)."""
    cfg: object                           # a TrainConfig (train.py): schedule, grad_clip, AdamW settings
    raw_model: torch.nn.Module            # never wrapped (T²MLR's parts compiled in place): clipped, saved
    model: torch.nn.Module                # what trains: raw_model, or it compiled and/or DDP-wrapped
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler          # loss scaling for float16; a no-op for the other dtypes
    autocast: object                      # the mixed-precision context of forward passes
    device: str
    ckpt_path: str                        # where save_state writes (named by the non-finite-loss error)
    ddp: bool = False                     # model is DDP-wrapped: gradients sync on the last micro-step
    compiled: bool = False                # model is raw_model compiled (support.runtime.compile_model)


def make_trainer(raw_model, cfg, device, dtype, ckpt_path) -> Trainer:
    """A Trainer for raw_model on `device`, autocast to `dtype`: AdamW (configure_optimizers), a GradScaler
    enabled for float16 only. It trains raw_model itself until the caller sets .model (compiled, DDP), .ddp."""
    device_type = device.split(":")[0]
    optimizer = configure_optimizers(raw_model, cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2),
                                     device_type, getattr(cfg, "gate_lr_multiplier", 1.0))
    return Trainer(cfg=cfg, raw_model=raw_model, model=raw_model, optimizer=optimizer,
                   scaler=torch.amp.GradScaler("cuda", enabled=dtype == torch.float16),
                   autocast=autocast_context(device_type, dtype), device=device, ckpt_path=ckpt_path)


def param_groups(model, weight_decay, gate_lr_multiplier=1.0):
    """The optimizer's parameter groups, each {"params", "weight_decay", "lr_scale"}: weight decay on >= 2-D
    tensors only (any module: a GPT, the S5 study's LSTM). With gate_lr_multiplier m != 1, the T²MLR gate's
    parameters (all of model.gate, as the T²MLR code's is_boosted_param_name) get groups of their own at
    lr_scale m; at m = 1 the two groups of before (decay, no decay). Empty groups are left out."""
    params = [p for p in model.parameters() if p.requires_grad]
    gate = getattr(model, "gate", None) if gate_lr_multiplier != 1.0 else None
    gate_ids = {id(p) for p in gate.parameters()} if gate is not None else set()
    groups = []
    for boosted, scale in ((False, 1.0), (True, gate_lr_multiplier)):
        for decay in (True, False):
            chosen = [p for p in params if (id(p) in gate_ids) == boosted and (p.dim() >= 2) == decay]
            if chosen:
                groups.append({"params": chosen, "weight_decay": weight_decay if decay else 0.0, "lr_scale": scale})
    return groups


def configure_optimizers(model, weight_decay, learning_rate, betas, device_type, gate_lr_multiplier=1.0):
    """AdamW over param_groups(model, weight_decay, gate_lr_multiplier), fused on CUDA, at learning_rate (set_lr)."""
    optimizer = torch.optim.AdamW(param_groups(model, weight_decay, gate_lr_multiplier), lr=learning_rate,
                                  betas=betas, fused=device_type == "cuda")
    set_lr(optimizer, learning_rate)
    return optimizer


def set_lr(optimizer, lr):
    """Set every parameter group to lr times its lr_scale (the T²MLR gate's: gate_lr_multiplier); returns lr."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_scale"]
    return lr


def load_optimizer_state(optimizer, saved, model, path):
    """Load the optimizer state `saved` (read from `path`) into `optimizer`, built by configure_optimizers for
    `model`; this run's lr_scale, weight_decay and betas win. A state saved under the other grouping (2 groups at
    gate_lr_multiplier 1, up to 4 with the gate apart) is regrouped parameter by parameter, so a run resumes
    with any gate_lr_multiplier. Raises RunError when neither grouping fits the saved one."""
    current = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    sizes = [len(g["params"]) for g in saved["param_groups"]]
    if sizes != [len(g["params"]) for g in optimizer.param_groups]:
        layouts = [param_groups(model, 0.0, m) for m in (1.0, 2.0)]      # without and with the gate apart
        layout = next((lay for lay in layouts if [len(g["params"]) for g in lay] == sizes), None)
        if layout is None:
            raise RunError(f"{path}: its optimizer state has groups of {sizes} parameters, which fit neither "
                           f"grouping of this model")
        by_old_index = {i: p for g, lay in zip(saved["param_groups"], layout)
                        for i, p in zip(g["params"], lay["params"])}
        new_index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
        saved = {"state": {new_index[id(by_old_index[i])]: s for i, s in saved["state"].items()},
                 "param_groups": [dict(g, params=[new_index[id(p)] for p in g["params"]])
                                  for g in optimizer.param_groups]}
    optimizer.load_state_dict(saved)
    for group, settings in zip(optimizer.param_groups, current):
        group.update({key: settings[key] for key in ("lr_scale", "weight_decay", "betas")})


LOOPS_SAMPLERS = ("fixed", "poisson_lognormal", "uniform")


def draw_loops(sampler, K, max_loops, seed, step) -> int:
    """The loop count of training step `step` (random-depth training; every micro-step of the step runs
    it): a pure function of its arguments, so every DDP rank, every arm at a seed and a resumed run draw
    the same. "fixed": K. "uniform": 1 .. 2K - 1, mean K. "poisson_lognormal" (Huginn, Geiping et al.
    2025, seal-rg/recurrent-pretraining's randomized_iteration_sampler): Poisson(λ) + 1, the +1 the pass
    every step makes, λ log-normal with σ = 0.5 and mean K - 1 (Huginn's mean is K, so its draws average
    K + 1; ours average K, the fixed depth they are compared with). A draw above max_loops is capped."""
    if sampler not in LOOPS_SAMPLERS:
        raise ValueError(f"loops_sampler {sampler!r} is not one of {', '.join(map(repr, LOOPS_SAMPLERS))}")
    if sampler == "fixed":
        return K
    g = torch.Generator().manual_seed((seed * 1_000_003 + step) % 2**63)
    if sampler == "uniform":
        return min(int(torch.randint(1, 2 * K, (1,), generator=g)), max_loops)
    sigma = 0.5
    rate = torch.zeros(1).log_normal_(math.log(K - 1) - sigma ** 2 / 2, sigma, generator=g) if K > 1 \
        else torch.zeros(1)
    return min(int(torch.poisson(rate, generator=g)) + 1, max_loops)


def mean_loops(sampler, K, max_loops, seed=0, steps=2000) -> float:
    """The mean draw after the cap, over `steps` steps of draw_loops (the FLOP estimate's depth)."""
    return sum(draw_loops(sampler, K, max_loops, seed, s) for s in range(steps)) / steps


def get_lr(step, cfg):
    """Learning rate of optimizer step `step` (0-based): linear warmup from learning_rate/(warmup_iters+1)
    (never 0), then cosine from learning_rate at step warmup_iters down to min_lr at step L - 1,
    L = lr_decay_iters or max_iters; min_lr beyond. No zero-length span divides: warmup_iters = 0 starts
    at the peak, warmup_iters >= L never decays. A run stopped early on the schedule of L and resumed
    follows the uninterrupted run's LRs."""
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    decay_end = cfg.lr_decay_iters or cfg.max_iters
    progress = min(1.0, (step - cfg.warmup_iters) / max(1, decay_end - 1 - cfg.warmup_iters))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


def optimizer_step(t: Trainer, step, grad_accum, micro_loss, lr=None):
    """Optimizer step `step` (0-based) for the studies (train.py writes its own on the page): at the schedule's
    LR (get_lr; or `lr`), grad_accum micro-steps, micro_loss(model, m) giving micro-step m's loss (under
    autocast), the gradients clipped to cfg.grad_clip (0 = not clipped), the update. Returns (the mean loss over
    micro-steps and ranks, the grad norm), 0-d tensors on the device, and the LR. Raises RunError, before the
    update, when the loss is not finite."""
    lr = set_lr(t.optimizer, get_lr(step, t.cfg) if lr is None else lr)
    loss_sum = torch.zeros((), device=t.device)      # summed on the device: no host sync per micro-step
    for micro in range(grad_accum):
        # DDP syncs in the forward of the last micro-step only: no_sync wraps the others' forward AND backward
        with t.model.no_sync() if t.ddp and micro < grad_accum - 1 else nullcontext():
            with t.autocast:
                loss = micro_loss(t.model, micro)
            loss_sum += loss.detach()
            t.scaler.scale(loss / grad_accum).backward()
    train_loss = check_finite(mean_over_ranks(loss_sum / grad_accum, t.ddp), step, t.ckpt_path)
    t.scaler.unscale_(t.optimizer)                    # clip the true gradients, not fp16-scaled ones
    grad_norm = torch.nn.utils.clip_grad_norm_(t.raw_model.parameters(), t.cfg.grad_clip or math.inf)
    t.scaler.step(t.optimizer)
    t.scaler.update()
    t.optimizer.zero_grad(set_to_none=True)
    return train_loss, grad_norm, lr


def check_finite(train_loss, step, ckpt_path):
    """train_loss, or RunError when it is NaN or inf (one host sync a step; the same on every rank), so the
    run stops before the update and ckpt.pt keeps the last good state."""
    if not torch.isfinite(train_loss):
        raise RunError(f"non-finite train loss {train_loss.item()} at step {step}; stopped before the update, "
                       f"{ckpt_path} holds the last good state")
    return train_loss


def mean_over_ranks(value, ddp):
    """The mean of a 0-d tensor over all ranks (the value itself on one process)."""
    if ddp:
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value


def evaluation_due(cfg, step, evaluated=None) -> bool:
    """Whether a run evaluates (and saves) after `step` updates: at every multiple of cfg.eval_interval and
    after the last step (cfg.max_iters), except at the step `evaluated` (None for none), whose evaluation
    is done already (the step a run resumed from)."""
    return step == cfg.max_iters or (step % cfg.eval_interval == 0 and step != evaluated)


def save_state(t: Trainer, step, rng, **fields):
    """Write the training state after `step` updates atomically to t.ckpt_path: weights, optimizer and scaler
    states, step, rng (one rng_states() per rank) and the caller's `fields` (configs, losses). resume() reads it."""
    save_checkpoint(t.ckpt_path, {"model": t.raw_model.state_dict(), "optimizer": t.optimizer.state_dict(),
                                  "scaler": t.scaler.state_dict(), "step": step, "rng": rng} | fields)


def saved_step(ckpt):
    """The number of updates a checkpoint holds (the S5 study's older ones keep it in ckpt["state"])."""
    return ckpt["step"] if "step" in ckpt else ckpt["state"]["step"]


def resume(t: Trainer, ckpt, path, rank=0, world_size=1, data_gen=None):
    """Continue the run of the checkpoint `ckpt` (read from `path`) as if it never stopped: the weights, the
    optimizer and scaler states and, where it holds them, this rank's RNG states and the data sampler
    `data_gen`'s. Returns its step. Raises RunError when the weights do not fit, or when another number of
    ranks wrote it (another world size cannot replay the same batches)."""
    if isinstance(t.raw_model, GPT):                  # the embedding tie mapped, a misfit named
        load_weights(t.raw_model, ckpt["model"], path)
    else:                                             # another module (the S5 study's LSTM): as saved
        t.raw_model.load_state_dict(ckpt["model"])
    if ckpt.get("gate_joined"):
        raise RunError(f"{path} was saved when the T²MLR gate's A was stored in two halves: its weights load "
                       f"(sample.py, evaluation, --init_from={path}), its optimizer state cannot resume")
    load_optimizer_state(t.optimizer, ckpt["optimizer"], t.raw_model, path)
    if "scaler" in ckpt:                              # (the S5 study's older checkpoints have none)
        t.scaler.load_state_dict(ckpt["scaler"])
    if "rng" in ckpt:
        if len(ckpt["rng"]) != world_size:
            raise RunError(f"{path} was written by {len(ckpt['rng'])} ranks, this run has {world_size}")
        set_rng_states(ckpt["rng"][rank], data_gen)
    return saved_step(ckpt)


@torch.no_grad()
def evaluate(model, batches, device, autocast, mode=None, tol=0.0):
    """Mean loss per token over `batches` (this rank's (inputs, targets)), summed over all ranks when
    distributed, so it does not depend on the world size. mode and tol: T²MLR's (GPT.forward)."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, device=device)             # (sum of token losses, number of tokens)
    for x, y in batches:
        with autocast:
            _, loss = model(x, y, mode=mode, tol=tol)
        totals[0] += loss.float() * y.numel()
        totals[1] += y.numel()
    if dist.is_initialized():
        dist.all_reduce(totals)
    model.train(was_training)
    return (totals[0] / totals[1]).item()
