"""
Reproduce both papers' findings at laptop scale, with paired seeds and 95% confidence intervals.

    python prepare_data.py --input ../shared/data/fineweb_edu/*.jsonl --tokenizer byte --name fineweb_byte
    python reproduce.py --plan          # the grid, with the estimated minutes of every run; runs nothing
    python reproduce.py                 # the whole study (2.1 h measured on 2 CPU cores); resumable
    python reproduce.py --max_minutes 60   # run for at most an hour, then assemble what is done
    python reproduce.py --quick         # every path end to end at toy size, in under 2 minutes (CI)
    python reproduce.py plot out/tiny_base out/tiny_mesh --out curves.png   # curves of any train.py runs
    python reproduce.py starts out/reproduce/t2mlr_t2mlr_s*/ckpt.pt   # Jacobi gap, zero and plain starts

Everything is trained by train.py (`train.main(argv)`, in this process) and probed with probe.py; this file
only lays out the grid, pairs the seeds, collects the numbers and draws them.

THE STUDY (byte tokens of the FineWeb sample, val loss in bits per byte = nats per token / ln 2; the val
split's 20 EOT tokens count as bytes)

  MeSH (paper Table 1 and §4.1): GPT-NeoX layers, d 128, 4 heads, context 256, unrolled depth 8 everywhere.
    layout K2 = 2+2R2+2: vanilla (8 layers), base, residual, anchor, anchor*, mesh, mesh_as_base
    layout K4 = 2+1R4+2: base, anchor, mesh (the vanilla model above is the same compute)
    mesh_as_base is MeSH whose routers start biased (weight ROUTER_P on one slot) so that the model starts
    as base recursion (to test whether the router initialisation explains MeSH's results); everything
    else equals mesh, its router weights too.
  T²MLR: LLaMA layers, d 128, 8 layers, layers 2..5 recurrent, Jacobi D = 16 sweeps (the gradient through the
    final one and b = 4 before it).
    plain (equal steps), t2mlr, plain_224 (plain given 2.24x the steps: the paper's "a baseline given 2.24x
    the epochs overtakes T²MLR"), plain_flops (plain given t2mlr's training FLOPs: steps x F_t2mlr / F_plain,
    from GPT.train_flops_per_token); each trained t2mlr model is evaluated exactly and with D = 1, 2, 4, 8, 16
    Jacobi sweeps on the same windows (the Jacobi-vs-exact gap).

  One protocol for every arm: 4,096 tokens per step (16 x 256, no accumulation), AdamW (0.9, 0.95), weight
  decay 0.1, LR 2e-3 with 10% linear warmup and cosine to 2e-4 at the run's last step, grad clip 1, fp32.
  Curves: train.py's evaluation at 6 points on 64 fixed windows. Final loss: the whole val split (576
  windows of 256, 147,456 tokens), exact mode for T²MLR. Probes: 32 val windows.

  Pairing: seed s gives every arm the same data order (train.py seeds its sampler with TrainConfig.seed) and
  the same initial weights wherever names and shapes agree: each run starts from init.pt, which holds the
  seed's reference model (vanilla for MeSH, plain for T²MLR, exactly as train.py would initialise it) in
  every tensor of the same name and shape, and the arm's own seeded draws elsewhere (routers, gate). All
  tensors share one distribution (model.GPT.init_weights, identical unrolled depth), so no arm is favoured.

THE BUDGET (2.5 h on 2 CPU cores; the grid took 2.1 h). Measured on a 2-core machine, torch's 2 threads:
a 200-step MeSH run takes about 3 minutes with its evaluation and probes (~0.7 s per step of 4,096 tokens),
a T²MLR Jacobi step (D 16, b 4) about 4 s, a plain LLaMA step about 0.9 s. A first layout (5 seeds,
T²MLR at 120 steps, 67 runs) was measured at ~3.5 h and trimmed, after seed 1 of the K2 layout had run, to:

    MeSH:  10 arms x 3 seeds x 200 steps (0.82M tokens per run)                  30 runs  ~ 90 min
    T²MLR: 3 seeds x (plain 80 + t2mlr 80 + plain_224 179 + plain_flops 396 steps)  12 runs  ~ 50 min

  `python reproduce.py --plan` prints the grid with estimates at FLOPS_PER_S = 125 GFLOP/s (the ETA corrects
  itself from the measured speed as the grid runs). Another job on the same 2 cores makes torch's 2 threads
  per process thrash (2x slower per step than 1 thread at d 128); `--threads 1` is then the faster choice.

  Why 3 seeds: the 95% CI half-width of a paired difference is t(n-1) s_d / sqrt(n), 2.48 s_d at n = 3
  (s_d the std of the paired differences); pairing (same data order and initial weights) removes most of
  the seed-to-seed spread of single runs, and the output reports
  the half-widths reached.

RESUMING, also across sessions and fresh clones: every finished run writes results/reproduce/<run>.json
(its config, seed, curves, final losses, probe numbers; small, meant to be committed). A run whose JSON exists
is skipped (after checking that its config is this grid's: a changed protocol is an error, not a silent
mix). A run with a checkpoint in out/reproduce/<run>/ continues from it (train.py --init_from=resume, bit for
bit). A run with neither starts from scratch. So a later session on a fresh clone, without out/, re-runs only
the runs that had not finished. At the end (and after --max_minutes) results/reproduce.json,
results/reproduce.md (the tables) and the figures under assets/ are assembled from the JSONs.
"""

import argparse
import contextlib
import functools
import json
import math
import os
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from studies import probe
import train
from model import GPT, GPTConfig


# -----------------------------------------------------------------------------
# Statistics: paired differences with Student-t confidence intervals (no scipy needed)

def t_two_sided(t, df):
    """P(|T| < t) for Student's t with integer df >= 1 degrees of freedom, exactly (Abramowitz & Stegun
    26.7.3-4): with θ = atan(t / sqrt(df)),
        df odd:  (2/π) (θ + sinθ cosθ [1 + (2/3) cos²θ + (2·4)/(3·5) cos⁴θ + ... up to cos^(df-3)θ])
                 (df = 1: 2θ/π)
        df even: sinθ [1 + (1/2) cos²θ + (1·3)/(2·4) cos⁴θ + ... up to cos^(df-2)θ]"""
    if df < 1 or df != int(df):
        raise ValueError(f"df = {df} must be an integer >= 1")
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    term = total = 1.0
    if df % 2:
        if df == 1:
            return 2 * theta / math.pi
        for k in range(1, (df - 1) // 2):
            term *= c * c * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + s * c * total)
    for k in range(1, df // 2):
        term *= c * c * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(p, df):
    """The p-quantile (p in (0.5, 1)) of Student's t with df degrees of freedom, by bisection on t_two_sided
    to 1e-12: t_quantile(0.975, 2) = 4.3027, the multiplier of a two-sided 95% interval from 3 values."""
    if not 0.5 < p < 1:
        raise ValueError(f"p = {p} must be in (0.5, 1)")
    target, lo, hi = 2 * p - 1, 0.0, 1.0
    while t_two_sided(hi, df) < target:
        hi *= 2
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(mid, df) < target else (lo, mid)
    return (lo + hi) / 2


def mean_std(values):
    """(mean, sample std with n - 1; 0 for one value) of a list of numbers."""
    n = len(values)
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0


def paired_stats(arm, baseline, level=0.95):
    """Compare an arm with its baseline over paired seeds.

    arm, baseline: {seed: value}; only the seeds in both count (pairs). Returns a dict: n, seeds, mean and std
    (sample std, n - 1) of each side, the paired differences' mean diff = mean(arm - baseline) and std, the
    Student-t multiplier t = t_{(1+level)/2, n-1}, the interval ci = diff ± t · std / sqrt(n), its half_width,
    and excludes_zero. With fewer than 2 pairs the interval is None. Nothing here depends on the values'
    meaning: it is the textbook paired t interval."""
    seeds = sorted(set(arm) & set(baseline))
    n = len(seeds)
    if n == 0:
        raise ValueError("no seed is in both arm and baseline")
    a, b = [arm[s] for s in seeds], [baseline[s] for s in seeds]
    d = [x - y for x, y in zip(a, b)]
    (ma, sa), (mb, sb), (md, sd) = mean_std(a), mean_std(b), mean_std(d)
    out = {"n": n, "seeds": seeds, "mean": ma, "std": sa, "baseline_mean": mb, "baseline_std": sb,
           "diff": md, "diff_std": sd, "t": None, "ci": None, "half_width": None, "excludes_zero": None}
    if n >= 2:
        t = t_quantile((1 + level) / 2, n - 1)
        half = t * sd / math.sqrt(n)
        out.update(
            t=t, ci=[md - half, md + half], half_width=half, excludes_zero=md - half > 0 or md + half < 0
        )
    return out


def verdict(stats, expected_sign):
    """'reproduced' when the interval excludes 0 on the paper's side (expected_sign -1: arm below baseline,
    +1: above), 'not reproduced' when it excludes 0 on the other side, else 'not resolvable at this scale'
    (also with fewer than 2 pairs)."""
    if stats is None or stats["ci"] is None or not stats["excludes_zero"]:
        return "not resolvable at this scale"
    return "reproduced" if (stats["diff"] > 0) == (expected_sign > 0) else "not reproduced"


# -----------------------------------------------------------------------------
# The grid

ROUTER_P = 0.95          # mesh_as_base: the routers put this weight on one slot at init (logits aside)
PAPER_EPOCHS = 2.24      # T²MLR paper: a baseline given 2.24x the epochs (here steps) overtakes T²MLR
# The T²MLR paper's Jacobi-vs-exact gap, 0.005, is a validation loss in nats per token of its BPE tokenizer. A
# GPT-2 BPE token of this FineWeb sample is 4.53 bytes (4,759,651 tokens for 21,551,930 byte tokens, each
# count with one EOT per document), so the same gap is 0.005 / 4.53 = 0.0011 nats per byte.
GAP_MARGIN_NATS_PER_BYTE = 0.005 / 4.53
# planning speed on 2 idle cores, fp32 (see the docstring); recalibrated while running
FLOPS_PER_S = 125e9
LN2 = math.log(2)


@dataclass(frozen=True)
class Protocol:
    """Everything the runs of one grid share. FULL is the study, QUICK the toy grid of --quick."""
    name: str
    n_embd: int = 128
    n_head: int = 4
    block_size: int = 256
    vocab_size: int = 320              # bytes + EOT = 257, padded to a multiple of 64
    mlp_hidden: int = 512              # llama (SwiGLU) width; neox uses 4 d
    batch_size: int = 16
    total_batch_size: int = 4096
    learning_rate: float = 2e-3
    min_lr: float = 2e-4
    warmup_frac: float = 0.1
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    mesh_steps: int = 200
    t2mlr_steps: int = 80
    mesh_seeds: int = 3
    t2mlr_seeds: int = 3
    layouts: tuple = (("K2", "2+2R2+2"), ("K4", "2+1R4+2"))
    mesh_arms: tuple = (
        ("K2", ("vanilla", "base", "residual", "anchor", "anchor_star", "mesh", "mesh_as_base")),
        ("K4", ("base", "anchor", "mesh")),
    )
    l_start: int = 2
    l_end: int = 5
    jacobi_sweeps: int = 16
    jacobi_grad_sweeps: int = 4
    evals: int = 5                     # evaluation intervals per run: 6 curve points
    eval_iters: int = 4                # curve windows = eval_iters x batch_size
    final_windows: Optional[int] = None  # None: the whole val split
    gap_windows: int = 64
    gap_depths: tuple = (1, 2, 4, 8, 16)
    probe_seqs: int = 32


FULL = Protocol("full")
QUICK = Protocol(
    "quick",
    n_embd=32,
    n_head=2,
    block_size=32,
    mlp_hidden=64,
    batch_size=4,
    total_batch_size=128,
    mesh_steps=4,
    t2mlr_steps=3,
    mesh_seeds=2,
    t2mlr_seeds=2,
    eval_iters=2,
    evals=2,
    final_windows=16,
    gap_windows=8,
    probe_seqs=8,
)


@dataclass
class Run:
    """One training run of the grid. model / train: the GPTConfig and TrainConfig keys it sets (the system
    keys out_dir, init_from, data_dir, device, dtype, compile, progress are added when it is launched)."""
    name: str
    study: str                 # "mesh" or "t2mlr"
    arm: str
    layout: str                # "K2", "K4"; "" for vanilla and the T²MLR study
    seed: int
    model: dict
    train: dict
    router_init: Optional[str] = None
    reference: dict = field(default_factory=dict)   # the model config whose seeded init the run shares

    @property
    def steps(self):
        return self.train["max_iters"]

    def fingerprint(self):
        """What must be equal for a stored result to count as this run (JSON-normalised)."""
        return json.loads(
            json.dumps(
                {
                    "model": self.model,
                    "train": self.train,
                    "router_init": self.router_init,
                    "router_p": ROUTER_P if self.router_init else None,
                }
            )
        )


def neox_model(pr, layout="", state_passing="base"):
    cfg = {"flavour": "neox", "vocab_size": pr.vocab_size, "block_size": pr.block_size, "n_embd": pr.n_embd,
           "n_head": pr.n_head}
    return cfg | ({"layout": layout, "state_passing": state_passing} if layout else {"n_layer": 8})


def llama_model(pr, t2mlr=False):
    cfg = {"flavour": "llama", "vocab_size": pr.vocab_size, "block_size": pr.block_size, "n_layer": 8,
           "n_embd": pr.n_embd, "n_head": pr.n_head, "n_kv_head": pr.n_head, "mlp_hidden": pr.mlp_hidden}
    if t2mlr:
        cfg |= {"t2mlr": True, "l_start": pr.l_start, "l_end": pr.l_end, "jacobi_sweeps": pr.jacobi_sweeps,
                "jacobi_grad_sweeps": pr.jacobi_grad_sweeps}
    return cfg


def train_keys(pr, steps, seed):
    """The TrainConfig keys of a run of `steps` steps: the one protocol, the schedule scaled to the run."""
    return {
        "max_iters": steps,
        "lr_decay_iters": steps,
        "warmup_iters": max(1, round(pr.warmup_frac * steps)),
        "eval_interval": max(1, steps // pr.evals),
        "eval_iters": pr.eval_iters,
        "log_interval": max(1, steps // 20),
        "total_batch_size": pr.total_batch_size,
        "batch_size": pr.batch_size,
        "learning_rate": pr.learning_rate,
        "min_lr": pr.min_lr,
        "weight_decay": pr.weight_decay,
        "beta1": 0.9,
        "beta2": 0.95,
        "grad_clip": pr.grad_clip,
        "seed": seed,
        "val_mode": "exact",
    }


def flops_per_token(model_cfg):
    """GPT.train_flops_per_token of a config, built on the meta device (no memory)."""
    return _flops_per_token(json.dumps(model_cfg, sort_keys=True))


@functools.lru_cache(maxsize=None)
def _flops_per_token(key):
    with torch.device("meta"):
        return GPT(GPTConfig(**json.loads(key))).train_flops_per_token()


def flops_steps(pr):
    """Steps of plain_flops: the plain model given the training FLOPs of t2mlr's t2mlr_steps steps."""
    ratio = flops_per_token(llama_model(pr, True)) / flops_per_token(llama_model(pr))
    return round(pr.t2mlr_steps * ratio)


def make_grid(pr):
    """Every run of the study, seeds outermost (seed 1 of both studies, then seed 2, ...), so an interrupted
    grid has whole seeds of both studies done."""
    vanilla, plain, t2 = neox_model(pr), llama_model(pr), llama_model(pr, True)
    long_steps = flops_steps(pr)
    runs = []
    for seed in range(1, max(pr.mesh_seeds, pr.t2mlr_seeds) + 1):
        for layout_name, layout in pr.layouts if seed <= pr.mesh_seeds else ():
            for arm in dict(pr.mesh_arms)[layout_name]:
                if arm == "vanilla":
                    name, model, lay = f"mesh_vanilla_s{seed}", vanilla, ""
                else:
                    mode = "mesh" if arm.startswith("mesh") else arm
                    name, model, lay = (
                        f"mesh_{layout_name}_{arm}_s{seed}",
                        neox_model(pr, layout, mode),
                        layout_name,
                    )
                runs.append(Run(name, "mesh", arm, lay, seed, model, train_keys(pr, pr.mesh_steps, seed),
                                "base" if arm == "mesh_as_base" else None, vanilla))
        for arm, model, steps in (("plain", plain, pr.t2mlr_steps), ("t2mlr", t2, pr.t2mlr_steps),
                                  ("plain_224", plain, round(PAPER_EPOCHS * pr.t2mlr_steps)),
                                  ("plain_flops", plain, long_steps)) if seed <= pr.t2mlr_seeds else ():
            runs.append(
                Run(
                    f"t2mlr_{arm}_s{seed}",
                    "t2mlr",
                    arm,
                    "",
                    seed,
                    model,
                    train_keys(pr, steps, seed),
                    None,
                    plain,
                )
            )
    return runs


# -----------------------------------------------------------------------------
# Initial weights: paired across arms, and the router-initialisation arm

@torch.no_grad()
def set_router_bias(model, kind, p=ROUTER_P):
    """Bias MeSH's routers so that at init each step puts weight p on one slot, write and read alike (the
    other B-1 slots share 1 - p), which makes the model start near one of MeSH's special cases:
      kind 'base':     the transitional step writes and reads slot 1 (h(0) ≈ h_pre), loop t writes and reads
                       the fresh slot t+2 (h(t+1) ≈ f_core(h(t)));
      kind 'residual': every step writes and reads slot 1 (h(t+1) ≈ h(t) + f_core(h(t))).
    With p -> 1 the routing is one-hot and the model equals base / residual recursion (test_reproduce.py).
    The bias is β = ln(p/(1-p) · (B-1)) on the slot, 0 elsewhere: softmax weight exactly p at zero logits."""
    mesh = model.mesh
    n_steps = len(mesh.write_routers)
    if mesh.n_slots < n_steps + 1:
        raise ValueError(f"routing as base needs {n_steps + 1} slots, the model has {mesh.n_slots}")
    beta = math.log(p / (1 - p) * (mesh.n_slots - 1))
    for step in range(n_steps):
        slot = 1 if kind == "residual" or step == 0 else step + 1
        for router in (mesh.write_routers[step], mesh.read_routers[step]):
            router.bias.zero_()
            router.bias[slot] = beta


def initial_model(run):
    """The run's initial model: the seed's reference model (built as train.py builds it:
    torch.manual_seed(seed), then GPT(config)) in every tensor whose name and shape agree, the run's own
    seeded draws elsewhere, and the router bias of mesh_as_base."""
    torch.manual_seed(run.seed)
    model = GPT(GPTConfig(**run.model))
    if run.reference and run.reference != run.model:
        torch.manual_seed(run.seed)
        ref = GPT(GPTConfig(**run.reference)).state_dict()
        own = model.state_dict()
        model.load_state_dict(
            {k: ref[k] if k in ref and ref[k].shape == v.shape else v for k, v in own.items()}
        )
    if run.router_init:
        set_router_bias(model, run.router_init)
    return model


# -----------------------------------------------------------------------------
# Training one run (resumable) and summarising it

SYSTEM = {"device", "dtype", "compile", "progress", "out_dir", "init_from", "data_dir"}


def launch_argv(run, out_dir, data_dir, device, init_from):
    keys = (
        run.model
        | run.train
        | {
            "out_dir": out_dir,
            "data_dir": data_dir,
            "dataset": os.path.basename(data_dir),
            "device": device,
            "dtype": "float32",
            "compile": False,
            "progress": False,
            "init_from": init_from,
        }
    )
    return [f"--{k}={v!r}" for k, v in keys.items()]


def checkpoint_step(run, ckpt_path):
    """The step of the run's checkpoint; RunError if the checkpoint holds another run's settings."""
    ckpt = train.load_checkpoint(ckpt_path)
    model_diff = [k for k, v in run.model.items() if ckpt["model_config"].get(k) != v]
    train_diff = [k for k, v in run.train.items() if k != "max_iters" and ckpt["train_config"].get(k) != v]
    if model_diff or train_diff:
        raise train.RunError(
            f"{ckpt_path} holds a run with other settings ({', '.join(model_diff + train_diff)}); "
            f"delete its folder or pass another --out_dir"
        )
    return ckpt["step"]


def train_run(run, out_dir, data_dir, device, stop_at=None):
    """Train `run` into out_dir: continue its checkpoint if there is one, else start from init.pt. stop_at:
    end after that many steps on the run's own schedule (as if interrupted; for tests). Returns 'trained',
    'resumed' or 'complete' (the checkpoint had finished already). train.py's output goes to
    out_dir/train.log."""
    os.makedirs(out_dir, exist_ok=True)
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    if os.path.exists(ckpt_path):
        step = checkpoint_step(run, ckpt_path)
        if step >= (run.steps if stop_at is None else stop_at):
            return "complete"
        argv, status = launch_argv(run, out_dir, data_dir, device, "resume"), "resumed"
    else:
        init_path = os.path.join(out_dir, "init.pt")
        train.save_checkpoint(init_path, {"model": initial_model(run).state_dict()})
        argv, status = launch_argv(run, out_dir, data_dir, device, init_path), "trained"
    if stop_at is not None:
        argv.append(f"--max_iters={stop_at}")
    with open(os.path.join(out_dir, "train.log"), "a") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        train.main(argv)
    return status


def read_log(out_dir):
    """(headers, {step: val_loss}, {step: train loss}) from out_dir/log.jsonl; later rows of a step win (a
    resumed run may repeat an evaluation). headers: the rows that hold model_config and train_config (one per
    launch)."""
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.isfile(path):
        raise train.RunError(f"no {path}: not an out_dir of train.py")
    headers, val, loss = [], {}, {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if "model_config" in row:
                headers.append(row)
            elif "val_loss" in row:
                val[row["step"]] = row["val_loss"]
            elif "loss" in row:
                loss[row["step"]] = row["loss"]
    if not headers:
        raise train.RunError(f"{path} has no header row with model_config")
    return headers, dict(sorted(val.items())), dict(sorted(loss.items()))


def rounded(x, digits=6):
    """x with every float rounded to `digits` significant digits (small, diffable JSON)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v, digits) for v in x]
    return x


def block_layers(model, name):
    """The layers a probe unit name stands for: prelude, core<t>, coda, layer<i>."""
    p, c, _, _ = model.cfg.depth
    layers = list(model.layers)
    if name == "prelude":
        return layers[:p]
    if name.startswith("core"):
        return layers[p:p + c]
    if name == "coda":
        return layers[p + c:]
    return [layers[int(name.removeprefix("layer"))]]


@torch.no_grad()
def scale_probe(model, seqs, batch_size=8):
    """What a difference in state scale does to the skew diagnostic (vanilla and recursive models).

    For every state: its RMS. For every unit (probe.depth_probe's: prelude, core loops, coda): the RMS of its
    input h and of its update f(h) - h, the paper's relative update 2‖f(h)−h‖/(‖f(h)‖+‖h‖), and the same
    measure with the unit applied to its input rescaled to RMS 1 per sequence (skew_unit). The relative
    update divides by state norms, and a pre-norm unit's update barely depends on its input's scale, so a
    model with smaller states shows a larger skew for the same update; skew_unit compares units at one
    scale. Means over sequences."""
    model.eval()
    states, per_block = {}, {}
    for i in range(0, len(seqs), batch_size):
        blocks, st = probe.depth_probe(model, seqs[i:i + batch_size])
        for name, h in st.items():
            states.setdefault(name, []).append(h.double().pow(2).mean(dim=(1, 2)).sqrt())
        for name, h, f_h in blocks:
            rms = h.double().pow(2).mean(dim=(1, 2)).sqrt()
            unit = h / rms.to(h.dtype)[:, None, None]
            f_unit = model.run_layers(unit, block_layers(model, name), 0)
            row = per_block.setdefault(name, {"rms_in": [], "rms_update": [], "skew": [], "skew_unit": []})
            row["rms_in"].append(rms)
            row["rms_update"].append((f_h - h).double().pow(2).mean(dim=(1, 2)).sqrt())
            row["skew"].append(probe.relative_update(h, f_h))
            row["skew_unit"].append(probe.relative_update(unit, f_unit))
    mean = lambda v: torch.cat(v).mean().item()
    out = {"state_rms": {k: mean(v) for k, v in states.items()}, "blocks": list(per_block)}
    for key in ("rms_in", "rms_update", "skew", "skew_unit"):
        out[key] = [mean(per_block[b][key]) for b in per_block]
    return out


def diagnostics(result, scale):
    """The per-run numbers the §4 claims are tested on (recursive models), from run_probe's and scale_probe's
    results: the last core loop's relative update (paper's form and at unit RMS) and its ratio to the first
    loop's, the mean RBF CKA between consecutive loop states h(t), h(t+1), the mean effective rank of the loop
    outputs h(1..K), and h(0)'s RMS."""
    blocks = result["skew"]["blocks"]
    cores = [i for i, b in enumerate(blocks) if b.startswith("core")]
    skew, unit = result["skew"]["mean"], scale["skew_unit"]
    names = result["cka"]["states"]
    loop_states = [n for n in names if re.fullmatch(r"h\(\d+\)", n)]             # h(0) .. h(K)
    idx = [names.index(n) for n in loop_states]
    rbf = result["cka"]["rbf"]
    erank = result["spectra"]["effective_rank"]
    return {"skew_last": skew[cores[-1]], "skew_unit_last": unit[cores[-1]],
            "skew_last_over_first": skew[cores[-1]] / skew[cores[0]],
            "skew_unit_last_over_first": unit[cores[-1]] / unit[cores[0]],
            "cka_consecutive": sum(rbf[a][b] for a, b in zip(idx, idx[1:])) / (len(idx) - 1),
            "erank_loops": sum(erank[n][0] for n in loop_states[1:]) / (len(loop_states) - 1),
            "rms_h0": scale["state_rms"]["h(0)"]}


def compact_probe(result):
    """probe.run_probe's result without the per-cell stds (kept small for the JSON)."""
    sp = result["spectra"]
    return {
        "skew": result["skew"],
        "cka": {k: result["cka"][k] for k in ("states", "rbf", "linear")},
        "spectra": {
            "states": sp["states"],
            "ratio_mean": sp["ratio_mean"],
            "effective_rank": sp["effective_rank"],
        },
    }


def summarize(run, out_dir, data_dir, pr):
    """The run's summary: config, curves (val loss in nats per token, as train.py logs it), final val loss
    over the val split, and for MeSH-study recursive models the probe numbers and scale diagnostics (trained
    and at init), for T²MLR the exact and Jacobi losses at every depth of the gap table."""
    headers, val, loss = read_log(out_dir)
    model, ckpt = train.load_model(os.path.join(out_dir, "ckpt.pt"), "cpu")
    T = model.cfg.block_size
    meta = train.load_meta(data_dir, T)
    val_path, dtype = os.path.join(data_dir, "val.bin"), meta["dtype"]
    n_final = pr.final_windows or (meta["val_tokens"] - 1) // T
    exact = "exact" if model.cfg.t2mlr else None
    evaluate = lambda starts, mode: train.evaluate(model, val_path, dtype, starts, pr.batch_size, T, "cpu",
                                                   contextlib.nullcontext(), mode)
    final = evaluate(train.val_starts(meta["val_tokens"], T, n_final), exact)
    fpt = model.train_flops_per_token()
    out = {
        "name": run.name,
        "study": run.study,
        "arm": run.arm,
        "layout": run.layout,
        "seed": run.seed,
        "config": run.fingerprint(),
        "data": {k: meta[k] for k in ("tokenizer", "train_tokens", "val_tokens")},
        "params": model.param_counts(),
        "flops_per_token": fpt,
        "tokens_per_step": pr.total_batch_size,
        "steps": run.steps,
        "curve": {
            "step": list(val),
            "val_loss": list(val.values()),
            "windows": pr.eval_iters * pr.batch_size,
        },
        "train_curve": {"step": list(loss), "loss": list(loss.values())},
        "final": {
            "val_loss": final,
            "val_bpb": final / LN2,
            "windows": n_final,
            "tokens": n_final * T,
            "mode": exact or "plain",
        },
    }
    if run.study == "mesh" and model.cfg.layout:
        seqs, _, _ = probe.validation_sequences(ckpt, pr.probe_seqs, T, data_dir)
        result = probe.run_probe(model, seqs, top=32)
        scale = scale_probe(model, seqs)
        out["probe"] = compact_probe(result)
        out["scale"] = {"trained": scale, "init": scale_probe(initial_model(run).eval(), seqs)}
        out["diagnostics"] = diagnostics(result, scale)
    if model.cfg.t2mlr:
        starts = train.val_starts(meta["val_tokens"], T, pr.gap_windows)
        gap = {"depths": list(pr.gap_depths), "windows": pr.gap_windows, "exact": evaluate(starts, "exact"),
               "jacobi": []}
        trained_d = model.cfg.jacobi_sweeps
        for d in pr.gap_depths:
            model.cfg.jacobi_sweeps = d               # the sweeps only; b is irrelevant without gradients
            gap["jacobi"].append(evaluate(starts, "jacobi"))
        model.cfg.jacobi_sweeps = trained_d
        out["jacobi_gap"] = gap
    return rounded(out)


# -----------------------------------------------------------------------------
# Cost estimates and progress

def est_seconds(run, pr, val_tokens, rate=FLOPS_PER_S):
    """Rough seconds for a run: its training FLOPs, plus evaluation (a forward is a third of a training step;
    T²MLR's exact token-by-token pass and the Jacobi depths are counted as plain forwards with factors), at
    `rate` FLOP/s, plus 5 s for loading and probing."""
    fpt = flops_per_token(run.model)
    T = pr.block_size
    plain_fwd = flops_per_token({k: v for k, v in run.model.items() if k not in ("t2mlr", "l_start", "l_end",
                                 "jacobi_sweeps", "jacobi_grad_sweeps")}) / 3
    curve_tokens = (pr.evals + 1) * pr.eval_iters * pr.batch_size * T
    final_tokens = (pr.final_windows * T) if pr.final_windows else val_tokens
    flops = run.steps * pr.total_batch_size * fpt
    if run.model.get("t2mlr"):
        # token-by-token middle layers: per-op overhead (README bench)
        exact_factor = 4.0
        sweeps = sum((8 - 4 + d * 4) / 8 for d in pr.gap_depths)
        flops += plain_fwd * ((curve_tokens + final_tokens + pr.gap_windows * T) * exact_factor
                              + pr.gap_windows * T * sweeps)
    else:
        flops += plain_fwd * (curve_tokens + final_tokens)
    return flops / rate + 5


def hms(seconds):
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Prints the grid's progress and ETA: at every run's start and end, and every `every` seconds while a run
    trains (from its log.jsonl). The speed is calibrated on what this session has done so far."""

    def __init__(self, runs, estimates, console, every=30.0):
        self.runs, self.est, self.console, self.every = runs, estimates, console, every
        self.total = sum(estimates.values())
        self.done = 0.0              # estimated seconds of the runs finished (or skipped)
        self.session_est = 0.0       # ... of the work this session did itself
        self.t0 = time.time()
        self.stop = threading.Event()
        self.thread = None

    def eta(self, extra_done=0.0):
        elapsed = time.time() - self.t0
        worked = self.session_est + extra_done
        speed = elapsed / worked if worked > 0 and elapsed > 30 else 1.0    # measured s per estimated s
        return (
            100 * (self.done + extra_done) / self.total,
            elapsed,
            (self.total - self.done - extra_done) * speed,
        )

    def say(self, text, extra_done=0.0):
        pct, elapsed, eta = self.eta(extra_done)
        print(
            f"{text}  | grid {pct:5.1f}%, elapsed {hms(elapsed)}, ETA {hms(eta)}",
            file=self.console,
            flush=True,
        )

    def skip(self, run):
        self.done += self.est[run.name]

    def start(self, i, run, out_dir):
        prefix = f"[{i + 1}/{len(self.runs)}] {run.name}"
        self.say(f"{prefix}: {run.steps} steps (est. {self.est[run.name] / 60:.1f} min)")
        self.stop.clear()

        def watch():
            last = None
            while not self.stop.wait(self.every):
                try:
                    _, val, loss = read_log(out_dir)
                except (train.RunError, OSError, ValueError):
                    continue
                step = max(list(loss) + list(val) + [0])
                if step != last:
                    last = step
                    frac = min(1.0, step / max(1, run.steps))
                    vl = f", val {list(val.values())[-1] / LN2:.3f} bpb" if val else ""
                    self.say(f"{prefix}: step {step}/{run.steps}{vl}", frac * self.est[run.name])

        self.thread = threading.Thread(target=watch, daemon=True)
        self.thread.start()

    def end(self, i, run, summary, status):
        self.stop.set()
        self.thread.join()
        self.done += self.est[run.name]
        self.session_est += self.est[run.name]
        self.say(
            f"[{i + 1}/{len(self.runs)}] {run.name}: {status}, final val {summary['final']['val_bpb']:.4f} "
            "bpb"
        )


# -----------------------------------------------------------------------------
# Assembling: tables, claims, resolution

# MeSH paper Table 1 (160M, Pile perplexity): the claims below compare against these.
MESH_PAPER_PPL = {"vanilla": 11.31, "base": 11.79, "anchor": 11.63, "mesh": 11.37}


def by_seed(summaries, value):
    """{seed: value(summary)} over a list of summaries."""
    return {s["seed"]: value(s) for s in summaries}


def arm_runs(summaries, study, arm, layout=""):
    return [s for s in summaries.values() if s["study"] == study and s["arm"] == arm and
            (s["layout"] == layout or arm == "vanilla")]


def final_bpb(s):
    return s["final"]["val_bpb"]


def compare(summaries, study, arm, base, layout="", value=final_bpb):
    """paired_stats of arm against base, or None when either has no run yet."""
    a, b = arm_runs(summaries, study, arm, layout), arm_runs(summaries, study, base, layout)
    if not a or not b or not set(by_seed(a, value)) & set(by_seed(b, value)):
        return None
    return paired_stats(by_seed(a, value), by_seed(b, value))


def claim(cid, text, paper, stats, expected_sign, unit="bits/byte", note=""):
    return {"id": cid, "claim": text, "paper": paper, "ours": stats, "unit": unit,
            "verdict": verdict(stats, expected_sign) if expected_sign else None, "note": note}


def paper_delta(a, b):
    """The paper's Δ between two arms in nats per token and relative to b's loss."""
    d = math.log(MESH_PAPER_PPL[a]) - math.log(MESH_PAPER_PPL[b])
    rel = 100 * d / math.log(MESH_PAPER_PPL[b])
    return (
        f"ppl {MESH_PAPER_PPL[a]} vs {MESH_PAPER_PPL[b]}: Δ {d:+.4f} nats/token ({rel:+.2f}% of {b}'s loss)"
    )


def jacobi_gap(d_index):
    """value(summary) = Jacobi-minus-exact val loss (nats) at the d_index-th depth."""
    return lambda s: s["jacobi_gap"]["jacobi"][d_index] - s["jacobi_gap"]["exact"]


def crossover(summaries):
    """Where plain_flops' curve first reaches t2mlr's final val loss (the same curve windows, same seed), by
    linear interpolation in FLOPs: as a multiple of t2mlr's training FLOPs and of the equal-steps plain run's.
    Indicative only: plain_flops is then mid-schedule (its LR not yet annealed), so a run that ended there
    would do better. {seed: {...}} plus the means; None where plain_flops never got there."""
    per_seed = {}
    for t2 in arm_runs(summaries, "t2mlr", "t2mlr"):
        long = [s for s in arm_runs(summaries, "t2mlr", "plain_flops") if s["seed"] == t2["seed"]]
        short = [s for s in arm_runs(summaries, "t2mlr", "plain") if s["seed"] == t2["seed"]]
        if not long:
            continue
        target, long = t2["curve"]["val_loss"][-1], long[0]
        per_step = long["flops_per_token"] * long["tokens_per_step"]
        pts = list(zip(long["curve"]["step"], long["curve"]["val_loss"]))
        at = None
        for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
            if v0 <= target:
                at = s0
                break
            if v1 <= target:
                at = s0 + (s1 - s0) * (v0 - target) / (v0 - v1)
                break
        t2_flops = t2["steps"] * t2["flops_per_token"] * t2["tokens_per_step"]
        plain_flops = (
            short[0]["steps"] * short[0]["flops_per_token"] * short[0]["tokens_per_step"] if short else None
        )
        per_seed[t2["seed"]] = None if at is None else {
            "step": at, "of_t2mlr_flops": at * per_step / t2_flops,
            "of_plain_flops": at * per_step / plain_flops if plain_flops else None}
    found = [v for v in per_seed.values() if v]
    mean = lambda k: sum(v[k] for v in found) / len(found) if found and all(v[k] for v in found) else None
    return {"per_seed": per_seed, "n_reached": len(found), "mean_of_t2mlr_flops": mean("of_t2mlr_flops"),
            "mean_of_plain_flops": mean("of_plain_flops")}


def assemble(pr, summaries):
    """Tables (mean ± std per arm, paired Δ to the baseline with 95% CI), the claims with verdicts, the
    resolution reached, all from the run summaries."""
    tables = {"mesh": {}, "t2mlr": {}, "jacobi_gap": {}, "scale": {}}
    claims, half_widths = [], {"mesh": [], "t2mlr": []}
    for layout_name, layout in pr.layouts:
        rows = {}
        for arm in ["vanilla"] + [a for a in dict(pr.mesh_arms)[layout_name] if a != "vanilla"]:
            runs = arm_runs(summaries, "mesh", arm, layout_name)
            if not runs:
                continue
            m, s = mean_std([final_bpb(r) for r in runs])
            st = compare(summaries, "mesh", arm, "base", layout_name) if arm != "base" else None
            rows[arm] = {"n": len(runs), "mean_bpb": m, "std_bpb": s, "vs_base": st}
            if st and st["half_width"] is not None:
                half_widths["mesh"].append(st["half_width"])
            if arm != "vanilla":
                tables["scale"].setdefault(layout_name, {})[arm] = {
                    when: {k: mean_std([r["scale"][when]["state_rms"][k] for r in runs])[0]
                           for k in runs[0]["scale"][when]["state_rms"]} for when in ("init", "trained")}
        tables["mesh"][layout_name] = {"layout": layout, "baseline": "base", "arms": rows}
        c = lambda a, b, v=final_bpb: compare(summaries, "mesh", a, b, layout_name, v)
        tag = f"{layout_name} ({layout})"
        claims += [
            claim(
                f"mesh-{layout_name}-1",
                f"{tag}: plain recursion (base) lags vanilla",
                paper_delta("base", "vanilla"),
                c("base", "vanilla"),
                +1,
            ),
            claim(
                f"mesh-{layout_name}-2",
                f"{tag}: +anchor improves on base",
                paper_delta("anchor", "base"),
                c("anchor", "base"),
                -1,
            ),
            claim(
                f"mesh-{layout_name}-3",
                f"{tag}: MeSH improves on base",
                paper_delta("mesh", "base"),
                c("mesh", "base"),
                -1,
            ),
            claim(
                f"mesh-{layout_name}-4",
                f"{tag}: MeSH improves on +anchor",
                paper_delta("mesh", "anchor"),
                c("mesh", "anchor"),
                -1,
            ),
            claim(
                f"mesh-{layout_name}-5",
                f"{tag}: MeSH closes most of base's gap to vanilla (Δ mesh - vanilla)",
                paper_delta("mesh", "vanilla"),
                c("mesh", "vanilla"),
                0,
                note="no mechanical verdict: read beside claims 1 and 3",
            ),
        ]
        if "mesh_as_base" in dict(pr.mesh_arms)[layout_name]:
            claims.append(
                claim(
                    f"mesh-{layout_name}-6",
                    f"{tag}: routers initialised as base (mesh_as_base) vs mesh",
                    "not in the paper",
                    c("mesh_as_base", "mesh"),
                    0,
                    note="does the router initialisation explain MeSH vs base? no paper claim",
                )
            )
        diag = lambda key: (lambda s: s["diagnostics"][key])
        paper4 = "MeSH paper §4.1, Fig. 1 (qualitative)"
        claims += [
            claim(
                f"diag-{layout_name}-1a",
                f"{tag}: later loops do more under MeSH than base: relative update of the "
                "last loop (paper's form, divides by state norms)",
                paper4,
                c("mesh", "base", diag("skew_last")),
                +1,
                unit="relative update",
            ),
            claim(
                f"diag-{layout_name}-1b",
                f"{tag}: the same, scale-free: the last loop's update over the first "
                "loop's, each loop's core applied to its input at unit RMS",
                paper4,
                c("mesh", "base", diag("skew_unit_last_over_first")),
                +1,
                unit="ratio",
            ),
            claim(
                f"diag-{layout_name}-2",
                f"{tag}: MeSH's consecutive loop states are less similar (RBF CKA)",
                paper4,
                c("mesh", "base", diag("cka_consecutive")),
                -1,
                unit="CKA",
            ),
            claim(
                f"diag-{layout_name}-3",
                f"{tag}: MeSH's loop states have higher effective rank",
                paper4,
                c("mesh", "base", diag("erank_loops")),
                +1,
                unit="effective rank",
            ),
        ]
    rows = {}
    for arm in ("plain", "t2mlr", "plain_224", "plain_flops"):
        runs = arm_runs(summaries, "t2mlr", arm)
        if runs:
            m, s = mean_std([final_bpb(r) for r in runs])
            st = compare(summaries, "t2mlr", arm, "plain") if arm != "plain" else None
            rows[arm] = {
                "n": len(runs),
                "steps": runs[0]["steps"],
                "mean_bpb": m,
                "std_bpb": s,
                "vs_plain": st,
            }
            if st and st["half_width"] is not None:
                half_widths["t2mlr"].append(st["half_width"])
    equal_flops = compare(summaries, "t2mlr", "plain_flops", "t2mlr")
    paper_epochs = compare(summaries, "t2mlr", "plain_224", "t2mlr")
    if equal_flops and equal_flops["half_width"] is not None:
        half_widths["t2mlr"].append(equal_flops["half_width"])
    tables["t2mlr"] = {"baseline": "plain", "arms": rows, "plain_flops_vs_t2mlr": equal_flops,
                       "plain_224_vs_t2mlr": paper_epochs,
                       "crossover": crossover(summaries)}
    t2 = arm_runs(summaries, "t2mlr", "t2mlr")
    gap16 = None
    if t2:
        for i, d in enumerate(pr.gap_depths):
            gaps = by_seed(t2, jacobi_gap(i))
            m, s = mean_std(list(gaps.values()))
            exact = by_seed(t2, lambda r: r["jacobi_gap"]["exact"])
            st = paired_stats(by_seed(t2, lambda r: r["jacobi_gap"]["jacobi"][i]), exact)
            tables["jacobi_gap"][str(d)] = {
                "mean_nats": m,
                "std_nats": s,
                "mean_bits": m / LN2,
                "stats_nats": st,
            }
            if d == pr.jacobi_sweeps:
                gap16 = st
    claims += [
        claim(
            "t2mlr-1",
            "T²MLR beats plain at equal steps",
            "T²MLR below plain at equal steps",
            compare(summaries, "t2mlr", "t2mlr", "plain"),
            -1,
        ),
        claim(
            "t2mlr-2",
            f"a plain baseline given {PAPER_EPOCHS}x the steps overtakes T²MLR (Δ plain_224 - t2mlr)",
            f"a baseline given {PAPER_EPOCHS}x the epochs overtakes T²MLR",
            paper_epochs,
            -1,
        ),
        claim(
            "t2mlr-2b",
            f"at equal training FLOPs (plain x{flops_steps(pr) / pr.t2mlr_steps:.2f} steps, Δ plain_flops "
            "- t2mlr)",
            "not in the paper",
            equal_flops,
            0,
            note="our question; no paper claim, so no mechanical verdict",
        ),
        claim(
            "t2mlr-3",
            f"Jacobi training (D = {pr.jacobi_sweeps}) and exact evaluation agree (Δ Jacobi - exact)",
            f"within 0.005 nats/token = {GAP_MARGIN_NATS_PER_BYTE:.4f} nats/byte",
            gap16,
            0,
            unit="nats/byte",
            note=f"verdict: reproduced if the 95% CI lies inside ±{GAP_MARGIN_NATS_PER_BYTE:.4f}, "
            "not reproduced if it lies outside",
        ),
    ]
    c3 = claims[-1]
    if gap16 and gap16["ci"]:
        lo, hi = gap16["ci"]
        m = GAP_MARGIN_NATS_PER_BYTE
        c3["verdict"] = ("reproduced" if -m < lo and hi < m else
                         "not reproduced" if lo > m or hi < -m else "not resolvable at this scale")
    resolution = {
        study: (
            {"min": min(h), "median": sorted(h)[len(h) // 2], "max": max(h), "n_comparisons": len(h)}
            if h
            else None
        )
        for study, h in half_widths.items()
    }
    return tables, claims, resolution


def fmt_stats(st, digits=4, percent=False):
    """'Δ [lo, hi] (n pairs)', and with percent=True Δ as a % of the baseline's mean as well."""
    if st is None:
        return "—"
    pct = f", {100 * st['diff'] / st['baseline_mean']:+.2f}%" if percent and st["baseline_mean"] else ""
    if st["ci"] is None:
        return f"{st['diff']:+.{digits}f} (n = 1{pct})"
    low, high = st['ci']
    return f"{st['diff']:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}] (n = {st['n']}{pct})"


def markdown(pr, tables, claims, resolution):
    """The tables and claims as markdown (results/reproduce.md), for the README."""
    lines = ["## MeSH study: final val loss (bits/byte), mean ± std over seeds; paired Δ to base, 95% CI", ""]
    for layout_name, t in tables["mesh"].items():
        lines += [f"### {layout_name}: {t['layout']}", "", "| arm | n | bits/byte | Δ to base [95% CI] |",
                  "|---|---|---|---|"]
        for arm, r in t["arms"].items():
            lines.append(f"| {arm} | {r['n']} | {r['mean_bpb']:.4f} ± {r['std_bpb']:.4f} | "
                         f"{fmt_stats(r['vs_base'])} |")
        lines.append("")
    t = tables["t2mlr"]
    lines += ["## T²MLR study: final val loss (bits/byte, exact mode); paired Δ to plain, 95% CI", "",
              "| arm | steps | n | bits/byte | Δ to plain [95% CI] |", "|---|---|---|---|---|"]
    for arm, r in t["arms"].items():
        lines.append(f"| {arm} | {r['steps']} | {r['n']} | {r['mean_bpb']:.4f} ± {r['std_bpb']:.4f} | "
                     f"{fmt_stats(r['vs_plain'])} |")
    cr = t["crossover"]
    lines += [
        "",
        f"Equal FLOPs, Δ plain_flops − t2mlr: {fmt_stats(t['plain_flops_vs_t2mlr'])} bits/byte; "
        f"{PAPER_EPOCHS}x steps, Δ plain_224 − t2mlr: {fmt_stats(t['plain_224_vs_t2mlr'])} bits/byte",
        "",
        f"plain_flops reaches t2mlr's final loss (curve windows) in {cr['n_reached']} of "
        f"{len(cr['per_seed'])} "
        "seeds"
        + (
            f", on average at {cr['mean_of_t2mlr_flops']:.2f}x t2mlr's training FLOPs = "
            f"{cr['mean_of_plain_flops']:.2f}x the equal-steps plain run's (mid-schedule: indicative)"
            if cr["mean_of_plain_flops"]
            else ""
        ),
        "",
        "## Jacobi − exact val loss of the trained T²MLR models (nats/byte), mean ± std [95% CI]",
        "",
        "| D | gap (nats) | 95% CI | gap (bits) |",
        "|---|---|---|---|",
    ]
    for d, g in tables["jacobi_gap"].items():
        ci = g["stats_nats"]["ci"]
        lines.append(f"| {d} | {g['mean_nats']:+.5f} ± {g['std_nats']:.5f} | "
                     + (f"[{ci[0]:+.5f}, {ci[1]:+.5f}]" if ci else "—") + f" | {g['mean_bits']:+.5f} |")
    lines += ["", "## State RMS (mean over seeds and val windows): at init → trained", ""]
    for layout_name, arms in tables["scale"].items():
        states = list(next(iter(arms.values()))["trained"])
        lines += [
            f"### {layout_name}",
            "",
            "| arm | " + " | ".join(states) + " |",
            "|---" * (len(states) + 1) + "|",
        ]
        for arm, sc in arms.items():
            cells = " | ".join(f"{sc['init'][k]:.2f} → {sc['trained'][k]:.2f}" for k in states)
            lines.append(f"| {arm} | {cells} |")
        lines.append("")
    lines += ["## Claims", "", "| id | claim | paper | ours: Δ [95% CI] | verdict |", "|---|---|---|---|---|"]
    for c in claims:
        lines.append(
            f"| {c['id']} | {c['claim']} | {c['paper']} | {fmt_stats(c['ours'], percent=True)} {c['unit']} | "
            f"{c['verdict'] or '—'}{' (' + c['note'] + ')' if c['note'] else ''} |"
        )
    lines += ["", "## Resolution reached (half-width of the paired 95% CIs, bits/byte)", ""]
    for study, r in resolution.items():
        lines.append(f"- {study}: " + (f"{r['min']:.4f} – {r['max']:.4f}, median {r['median']:.4f} "
                                       f"({r['n_comparisons']} comparisons)" if r else "none yet"))
    return "\n".join(lines) + "\n"


# -----------------------------------------------------------------------------
# Figures

def plt_module():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_curves(series, path, title, ylabel):
    """Two panels, val loss against steps and against training FLOPs. series: dicts with label, steps,
    values, flops_per_step and optionally lo/hi (a band)."""
    plt = plt_module()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for k, s in enumerate(series):
        color = plt.get_cmap("tab10")(k % 10)
        for ax, scale in zip(axes, (1.0, s["flops_per_step"])):
            x = [st * scale for st in s["steps"]]
            ax.plot(x, s["values"], marker="o", ms=3, color=color, label=s["label"])
            if "lo" in s:
                ax.fill_between(x, s["lo"], s["hi"], color=color, alpha=0.15)
    axes[0].set_xlabel("optimizer step")
    axes[1].set_xlabel("training FLOPs")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    finals = [v for s in series for v in s["values"][1:]]
    if finals:                       # the first evaluation (untrained, ~8 bits) would flatten everything else
        lo, hi = min(finals), max(finals)
        for ax in axes:
            ax.set_ylim(lo - 0.05 * (hi - lo + 1e-9), hi + 0.3 * (hi - lo + 1e-9))
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=1, fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.05 + 0.035 * len(series), 1, 1))       # room below the panels for the legend
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def seed_band(runs):
    """Mean, min and max over seeds of the val curve (bits/byte) of runs with equal evaluation steps."""
    steps = runs[0]["curve"]["step"]
    vals = [[v / LN2 for v in r["curve"]["val_loss"]] for r in runs if r["curve"]["step"] == steps]
    cols = list(zip(*vals))
    return {
        "steps": steps,
        "values": [sum(c) / len(c) for c in cols],
        "lo": [min(c) for c in cols],
        "hi": [max(c) for c in cols],
        "flops_per_step": runs[0]["flops_per_token"] * runs[0]["tokens_per_step"],
    }


def plot_deltas(pr, tables, path):
    """Forest plot: every arm's paired Δ to its baseline with the 95% CI, both studies."""
    plt = plt_module()
    rows = []
    for layout_name, t in tables["mesh"].items():
        rows += [
            (f"{layout_name} {arm} − base", r["vs_base"]) for arm, r in t["arms"].items() if r["vs_base"]
        ]
    t = tables["t2mlr"]
    rows += [(f"{arm} − plain", r["vs_plain"]) for arm, r in t["arms"].items() if r["vs_plain"]]
    if t["plain_224_vs_t2mlr"]:
        rows.append((f"plain_224 − t2mlr ({PAPER_EPOCHS}x steps)", t["plain_224_vs_t2mlr"]))
    if t["plain_flops_vs_t2mlr"]:
        rows.append(("plain_flops − t2mlr (equal FLOPs)", t["plain_flops_vs_t2mlr"]))
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.2))
    for i, (label, st) in enumerate(reversed(rows)):
        lo, hi = st["ci"] if st["ci"] else (st["diff"], st["diff"])
        color = "tab:gray" if not st["excludes_zero"] else ("tab:green" if st["diff"] < 0 else "tab:red")
        ax.plot([lo, hi], [i, i], color=color, lw=2)
        ax.plot([st["diff"]], [i], "o", color=color)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)], fontsize=8)
    ax.set_xlabel("paired Δ final val loss (bits/byte), 95% CI")
    ax.set_title(
        f"{pr.mesh_seeds} / {pr.t2mlr_seeds} paired seeds (MeSH / T²MLR); green: lower, red: higher, "
        "gray: 0 inside the CI",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_diagnostics(pr, summaries, path):
    """MeSH §4 side by side: for every layout, a row each of (a) relative update per unit (the paper's form
    and at unit state RMS, mean ± std over seeds, with the input RMS as dots), (b) RBF CKA between states,
    (c) singular-value spectra with effective ranks; one column per arm (base, anchor, mesh, mesh_as_base)."""
    plt = plt_module()
    arms = ["base", "anchor", "mesh", "mesh_as_base"]
    layouts = [(ln, lay) for ln, lay in pr.layouts if any(arm_runs(summaries, "mesh", a, ln) for a in arms)]
    fig, axes = plt.subplots(3 * len(layouts), len(arms), figsize=(4.2 * len(arms), 3.3 * 3 * len(layouts)),
                             squeeze=False)
    legend_done = False
    for li, (ln, lay) in enumerate(layouts):
        for ai, arm in enumerate(arms):
            runs = arm_runs(summaries, "mesh", arm, ln)
            ax_s, ax_c, ax_p = (axes[3 * li + r][ai] for r in range(3))
            if not runs:
                for ax in (ax_s, ax_c, ax_p):
                    ax.axis("off")
                continue
            name = f"{ln} {lay}, {arm} ({len(runs)} seeds)"
            blocks = runs[0]["scale"]["trained"]["blocks"]
            xs = range(len(blocks))
            for j, (key, label, color) in enumerate((("skew", "paper's form", "tab:blue"),
                                                     ("skew_unit", "at unit state RMS", "tab:orange"))):
                m = [mean_std([r["scale"]["trained"][key][b] for r in runs]) for b in xs]
                ax_s.bar([x + (j - 0.5) * 0.38 for x in xs], [v[0] for v in m], 0.38, yerr=[v[1] for v in m],
                         capsize=2, color=color, label=label)
            twin = ax_s.twin = ax_s.twinx()
            twin.plot(xs, [mean_std([r["scale"]["trained"]["rms_in"][b] for r in runs])[0] for b in xs], "k.",
                      label="input RMS")
            twin.set_ylabel("input RMS (dots)", fontsize=7)
            ax_s.set_xticks(list(xs), blocks, fontsize=7)
            ax_s.set_ylabel("relative update", fontsize=7)
            ax_s.set_title(f"(a) {name}", fontsize=8)
            if not legend_done:
                ax_s.legend(fontsize=6)
                legend_done = True
            states = runs[0]["probe"]["cka"]["states"]
            cka = torch.tensor([r["probe"]["cka"]["rbf"] for r in runs]).mean(0)
            ax_c.imshow(cka, vmin=0, vmax=1, cmap="viridis")
            ax_c.set_xticks(range(len(states)), states, rotation=45, ha="right", fontsize=6)
            ax_c.set_yticks(range(len(states)), states, fontsize=6)
            for i in range(len(states)):
                for j in range(len(states)):
                    ax_c.text(j, i, f"{cka[i, j]:.2f}", ha="center", va="center", fontsize=5,
                              color="black" if cka[i, j] > 0.6 else "white")
            ax_c.set_title(f"(b) RBF CKA, {name}", fontsize=8)
            cmap = plt.get_cmap("viridis")
            for k, st in enumerate(states):
                ratio = torch.tensor([r["probe"]["spectra"]["ratio_mean"][st] for r in runs]).mean(0)
                erank = mean_std([r["probe"]["spectra"]["effective_rank"][st][0] for r in runs])[0]
                ax_p.plot(ratio, color=cmap(k / max(1, len(states) - 1)), label=f"{st} ({erank:.1f})")
            ax_p.set_yscale("log")
            ax_p.set_ylim(1e-3, 1.5)
            ax_p.set_xlabel("index i", fontsize=7)
            ax_p.set_ylabel("σ_i / σ_0", fontsize=7)
            ax_p.set_title(f"(c) spectra (effective rank), {name}", fontsize=8)
            ax_p.legend(fontsize=5, ncol=2)
    for li in range(len(layouts)):      # one scale per layout row, so the arms compare at a glance
        row = [axes[3 * li][ai] for ai in range(len(arms)) if axes[3 * li][ai].axison]
        top = max(ax.get_ylim()[1] for ax in row)
        twins = [ax.twin for ax in row]
        rms_top = max(t.get_ylim()[1] for t in twins)
        for ax, t in zip(row, twins):
            ax.set_ylim(0, top)
            t.set_ylim(0, rms_top)
    fig.suptitle(f"MeSH §4 diagnostics of the trained models, {pr.probe_seqs} val windows x {pr.block_size} "
                 f"tokens, means over seeds", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def figures(pr, summaries, tables, assets, prefix):
    """Every figure of the study that the finished runs allow; returns their paths."""
    os.makedirs(assets, exist_ok=True)
    paths = []
    for ln, lay in pr.layouts:
        series = []
        for arm in ["vanilla"] + [a for a in dict(pr.mesh_arms)[ln] if a != "vanilla"]:
            runs = arm_runs(summaries, "mesh", arm, ln)
            if runs:
                series.append({"label": f"{arm} ({len(runs)} seeds)", **seed_band(runs)})
        if series:
            paths.append(
                plot_curves(
                    series,
                    os.path.join(assets, f"{prefix}_mesh_{ln}_curves.png"),
                    f"MeSH study, {ln} = {lay} (vanilla: 8 layers); mean and range over seeds",
                    "val loss (bits/byte)",
                )
            )
    series = []
    for arm in ("plain", "t2mlr", "plain_224", "plain_flops"):
        runs = arm_runs(summaries, "t2mlr", arm)
        if runs:
            series.append(
                {"label": f"{arm}, {runs[0]['steps']} steps ({len(runs)} seeds)", **seed_band(runs)}
            )
    if series:
        paths.append(
            plot_curves(
                series,
                os.path.join(assets, f"{prefix}_t2mlr_curves.png"),
                "T²MLR study: equal steps (left) and equal training FLOPs (right); exact val loss, "
                "mean and range over seeds",
                "val loss (bits/byte)",
            )
        )
    if (
        any(r.get("vs_base") for t in tables["mesh"].values() for r in t["arms"].values())
        or tables["t2mlr"]["arms"]
    ):
        paths.append(plot_deltas(pr, tables, os.path.join(assets, f"{prefix}_deltas.png")))
    if any(s.get("probe") for s in summaries.values()):
        paths.append(plot_diagnostics(pr, summaries, os.path.join(assets, f"{prefix}_diagnostics.png")))
    return paths


# -----------------------------------------------------------------------------
# `reproduce.py plot OUT_DIR ...`: val-loss curves of any train.py runs

def describe_run(model_cfg, train_cfg):
    """A short legend entry from a run's configs: the variant (probe.describe) and its steps."""
    return f"{probe.describe(GPTConfig(**model_cfg))}, {train_cfg['max_iters']} steps"


def plot_main(argv):
    p = argparse.ArgumentParser(
        prog="reproduce.py plot",
        description="Val-loss curves against steps and training FLOPs of train.py out_dirs.",
    )
    p.add_argument("out_dirs", nargs="+", help="folders written by train.py (each with log.jsonl)")
    p.add_argument("--out", default="curves.png", help="the figure to write (default curves.png)")
    p.add_argument("--nats", action="store_true", help="nats per token instead of bits per token")
    args = p.parse_args(argv)
    series, configs = [], []
    for d in args.out_dirs:
        headers, val, _ = read_log(d)
        if not val:
            raise train.RunError(f"{d}/log.jsonl has no evaluation yet")
        mc, tc = headers[-1]["model_config"], headers[-1]["train_config"]
        configs.append((mc, tc))
        scale = 1.0 if args.nats else 1 / LN2
        series.append({"label": f"{os.path.basename(os.path.normpath(d))}: {describe_run(mc, tc)}",
                       "steps": list(val), "values": [v * scale for v in val.values()],
                       "flops_per_step": flops_per_token(mc) * tc["total_batch_size"]})
    # keys that differ between the runs go into the legend too
    keys = sorted(
        {
            k
            for mc, tc in configs
            for k in (mc | tc)
            if k not in SYSTEM and len({json.dumps((c[0] | c[1]).get(k)) for c in configs}) > 1
        }
        - {"max_iters", "lr_decay_iters"}
    )
    for s, (mc, tc) in zip(series, configs):
        used = [k for k in keys if not (k == "n_layer" and mc.get("layout"))]    # a layout overrides n_layer
        extra = ", ".join(f"{k}={(mc | tc).get(k)}" for k in used[:4])
        s["label"] += f" [{extra}]" if extra else ""
    unit = "nats/token" if args.nats else "bits/token"
    path = plot_curves(series, args.out, "val loss of " + ", ".join(args.out_dirs), f"val loss ({unit})")
    print(f"wrote {path}")
    return path


def starts_main(argv):
    """`reproduce.py starts CKPT ...`: the Jacobi-minus-exact val loss of trained T²MLR checkpoints at
    D = 1, 2, 4, 8, 16 from both starts, jacobi_init "zero" (ours) and "plain" (the reference's warm start),
    on the same val windows. Prints a table and writes the numbers to --out (JSON)."""
    p = argparse.ArgumentParser(prog="reproduce.py starts", description=starts_main.__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+", help="ckpt.pt files of trained T²MLR models")
    p.add_argument("--data_dir", default="data/fineweb_byte", help="the data the models were trained on")
    p.add_argument("--windows", type=int, default=64, help="val windows (default 64, as the gap table)")
    p.add_argument("--out", default="results/jacobi_starts.json")
    args = p.parse_args(argv)
    rows = []
    for path in args.checkpoints:
        model, ckpt = train.load_model(path, "cpu")
        if not model.cfg.t2mlr:
            raise train.RunError(f"{path} is not a T²MLR model")
        T = model.cfg.block_size
        meta = train.load_meta(args.data_dir, T)
        starts = train.val_starts(meta["val_tokens"], T, args.windows)
        loss = lambda mode: train.evaluate(
            model,
            os.path.join(args.data_dir, "val.bin"),
            meta["dtype"],
            starts,
            16,
            T,
            "cpu",
            contextlib.nullcontext(),
            mode,
        )
        row = {
            "checkpoint": path,
            "exact": loss("exact"),
            "depths": [1, 2, 4, 8, 16],
            "zero": [],
            "plain": [],
        }
        for D in row["depths"]:
            model.cfg.jacobi_sweeps = D
            for init in ("zero", "plain"):
                model.cfg.jacobi_init = init
                row[init].append(loss("jacobi") - row["exact"])
        rows.append(row)
        print(f"{path}: exact {row['exact']:.5f} nats/byte; Jacobi - exact, zero / plain start: " + ", ".join(
            f"D {d}: {z:+.6f} / {q:+.6f}" for d, z, q in zip(row["depths"], row["zero"], row["plain"])))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    write_json(args.out, {"windows": args.windows, "data_dir": args.data_dir, "runs": rows})
    print(f"wrote {args.out}")
    return rows


def tolerance_run(out_dir, data_dir):
    """One train.py run of the jacobi_tol comparison: its seed, the median step time and mean middle-layer
    passes over the logged steps, the wall-clock (out_dir/done, written by the runner, when present), and
    the exact val loss of its final checkpoint on the whole val split (nats/byte)."""
    headers, _, _ = read_log(out_dir)                     # checks that out_dir is a train.py run
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        # the step rows (of a step logged twice by a resumed run, the last)
        steps = list({r["step"]: r for r in map(json.loads, f) if "loss" in r}.values())
    model, ckpt = train.load_model(os.path.join(out_dir, "ckpt.pt"), "cpu")
    T = model.cfg.block_size
    meta = train.load_meta(data_dir, T)
    windows = (meta["val_tokens"] - 1) // T
    final = train.evaluate(model, os.path.join(data_dir, "val.bin"), meta["dtype"],
                           train.val_starts(meta["val_tokens"], T, windows), 16, T, "cpu",
                           contextlib.nullcontext(), "exact")
    done = os.path.join(out_dir, "done")
    wall = json.load(open(done))["wall_s"] if os.path.isfile(done) else None
    ms = sorted(r["ms"] for r in steps)
    return {"out_dir": out_dir, "seed": headers[-1]["train_config"]["seed"],
            "jacobi_tol": model.cfg.jacobi_tol,
            "steps": ckpt["step"], "wall_s": wall, "median_step_ms": ms[len(ms) // 2],
            "mean_passes": sum(r["jacobi_passes"] for r in steps) / len(steps),
            "passes_by_step": {r["step"]: r["jacobi_passes"] for r in steps},
            "final_exact_val_loss": final, "final_windows": windows}


def tolerance_summary(fixed, tol):
    """Pair the runs by seed: lists of tolerance_run dicts -> {seeds, per-seed (tol - fixed) val-loss
    differences and wall / step-time / passes ratios, the seed spread of each arm, and the verdict}: the
    tolerance is a win only if it is faster and its mean val-loss difference lies within the fixed arm's
    seed spread (max - min over seeds)."""
    by_seed = lambda runs: {r["seed"]: r for r in runs}
    f, t = by_seed(fixed), by_seed(tol)
    seeds = sorted(set(f) & set(t))
    if not seeds:
        raise ValueError("no seed has both a fixed-D and a tolerance run")
    ratio = lambda key: [t[s][key] / f[s][key] for s in seeds if f[s][key] and t[s][key]]
    val = lambda runs: [runs[s]["final_exact_val_loss"] for s in seeds]
    diff = [t[s]["final_exact_val_loss"] - f[s]["final_exact_val_loss"] for s in seeds]
    spread = max(val(f)) - min(val(f))
    wall = ratio("wall_s") or ratio("median_step_ms")
    out = {"seeds": seeds, "val_loss_diff": diff, "val_loss_diff_mean": sum(diff) / len(diff),
           "fixed_val_loss": mean_std(val(f)), "tol_val_loss": mean_std(val(t)), "fixed_seed_spread": spread,
           "wall_ratio": ratio("wall_s"), "step_ms_ratio": ratio("median_step_ms"),
           "passes": {"fixed": [f[s]["mean_passes"] for s in seeds],
                      "tol": [t[s]["mean_passes"] for s in seeds]}}
    out["win"] = bool(sum(wall) / len(wall) < 1 and abs(out["val_loss_diff_mean"]) <= spread)
    return out


def tolerance_main(argv):
    """`reproduce.py tolerance --fixed DIR ... --tol DIR ...`: fixed-D Jacobi training against jacobi_tol,
    paired by seed (train.py runs of the same config): wall-clock, mean middle-layer passes and the exact
    val loss of each final checkpoint on the whole val split. Prints a table, writes --out (JSON)."""
    p = argparse.ArgumentParser(prog="reproduce.py tolerance",
                                description=tolerance_main.__doc__.split("\n\n")[0])
    p.add_argument("--fixed", nargs="+", required=True, help="out_dirs of the fixed-D runs")
    p.add_argument("--tol", nargs="+", required=True, help="out_dirs of the jacobi_tol runs")
    p.add_argument("--data_dir", default="data/pydoc", help="the data the runs were trained on")
    p.add_argument("--out", default="results/jacobi_tol.json")
    args = p.parse_args(argv)
    fixed = [tolerance_run(d, args.data_dir) for d in args.fixed]
    tol = [tolerance_run(d, args.data_dir) for d in args.tol]
    summary = tolerance_summary(fixed, tol)
    for r in fixed + tol:
        print(f"{r['out_dir']}: seed {r['seed']}, tol {r['jacobi_tol']:g}, wall {r['wall_s']} s, median step "
              f"{r['median_step_ms']:.0f} ms, mean passes {r['mean_passes']:.2f}, final exact val "
              f"{r['final_exact_val_loss']:.4f} nats/byte ({r['final_windows']} windows)")
    diffs = ", ".join(f"{d:+.4f}" for d in summary["val_loss_diff"])
    print(f"tol - fixed val loss per seed: {diffs} (the fixed arm's seed spread "
          f"{summary['fixed_seed_spread']:.4f}); wall ratio {summary['wall_ratio']}; win: {summary['win']}")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    write_json(args.out, {"command": "python reproduce.py tolerance " + " ".join(argv),
                          "data_dir": args.data_dir, "fixed": fixed, "tol": tol, "summary": summary})
    print(f"wrote {args.out}")
    return summary


# -----------------------------------------------------------------------------
# The study's command line

def load_summary(path, run):
    """The stored summary of `run`, or None; RunError if it was made under another protocol."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    if summary.get("config") != run.fingerprint():
        old, new = summary.get("config", {}), run.fingerprint()
        diff = [f"{part}.{k}" for part in ("model", "train") for k in set(old.get(part, {})) | set(new[part])
                if old.get(part, {}).get(k) != new[part].get(k)] or ["router settings"]
        raise train.RunError(
            f"{path} was made with other settings ({', '.join(sorted(diff))}); delete it to re-run, "
            f"or pass another --results folder"
        )
    return summary


def write_json(path, obj):
    """obj as indented JSON with every list of numbers on one line (small and diffable), written
    atomically."""
    text = re.sub(r"\[\s*([-+0-9.eE,\s]+?)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]",
                  json.dumps(obj, indent=1))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def study_main(argv):
    p = argparse.ArgumentParser(
        description="Reproduce the MeSH and T²MLR papers' findings at laptop scale "
        "(see the docstring). `reproduce.py plot ...` draws curves of any runs."
    )
    p.add_argument(
        "--quick", action="store_true", help="toy grid, every path end to end in under 2 minutes (CI)"
    )
    p.add_argument("--plan", action="store_true", help="print the grid and its estimated time, run nothing")
    p.add_argument("--data_dir", default="data/fineweb_byte",
                   help="byte-token data (prepare_data.py, see the docstring)")
    p.add_argument(
        "--out_dir", default=None, help="checkpoints; default out/reproduce (quick: out/reproduce_quick)"
    )
    p.add_argument(
        "--results",
        default=None,
        help="folder for reproduce/<run>.json, reproduce.json and reproduce.md;"
        " default results (quick: OUT_DIR/results)",
    )
    p.add_argument("--assets", default=None, help="figures; default assets (quick: OUT_DIR/assets)")
    p.add_argument("--device", default="cpu", help="training device (evaluation and probes run on the CPU)")
    p.add_argument(
        "--only", default=None, help="run only the runs whose name matches this regular expression"
    )
    p.add_argument("--max_minutes", type=float, default=None, help="start no run that would end after this")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads; default torch's (quick: 1, fastest at " "toy size and immune to a busy machine)",
    )
    for key in ("mesh_steps", "t2mlr_steps", "mesh_seeds", "t2mlr_seeds"):
        p.add_argument(f"--{key}", type=int, default=None, help=f"override the protocol's {key}")
    args = p.parse_args(argv)
    pr = QUICK if args.quick else FULL
    threads = args.threads or (1 if args.quick else None)
    if threads:
        torch.set_num_threads(threads)
    overrides = {k: getattr(args, k) for k in ("mesh_steps", "t2mlr_steps", "mesh_seeds", "t2mlr_seeds")
                 if getattr(args, k) is not None}
    if overrides:
        pr = Protocol(**(asdict(pr) | overrides | {"name": pr.name + "*"}))
    out_root = args.out_dir or ("out/reproduce_quick" if args.quick else "out/reproduce")
    results = args.results or (os.path.join(out_root, "results") if args.quick else "results")
    assets = args.assets or (os.path.join(out_root, "assets") if args.quick else "assets")
    prefix = "reproduce_quick" if args.quick else "reproduce"
    runs = make_grid(pr)
    meta = train.load_meta(args.data_dir, pr.block_size)
    if meta["tokenizer"] != "byte":
        raise train.RunError(f"{args.data_dir} holds {meta['tokenizer']} tokens; the study is on byte tokens")
    estimates = {r.name: est_seconds(r, pr, meta["val_tokens"]) for r in runs}
    selected = [r for r in runs if not args.only or re.search(args.only, r.name)]
    if args.plan:
        print(f"{'run':34s} {'steps':>6s} {'GFLOP/step':>10s} {'est. min':>8s}")
        for r in selected:
            print(f"{r.name:34s} {r.steps:6d} {flops_per_token(r.model) * pr.total_batch_size / 1e9:10.1f} "
                  f"{estimates[r.name] / 60:8.2f}")
        for study in ("mesh", "t2mlr"):
            tot = sum(estimates[r.name] for r in selected if r.study == study)
            print(f"{study}: {sum(r.study == study for r in selected)} runs, {tot / 60:.0f} min")
        print(f"total: {len(selected)} runs, {sum(estimates[r.name] for r in selected) / 60:.0f} min at "
              f"{FLOPS_PER_S / 1e9:.0f} GFLOP/s")
        return None

    summary_dir = os.path.join(results, "reproduce")
    os.makedirs(summary_dir, exist_ok=True)
    console = sys.stdout
    progress = Progress(selected, {r.name: estimates[r.name] for r in selected}, console)
    summaries, t_start = {}, time.time()
    print(
        f"reproduce ({pr.name}): {len(selected)} runs, est. {progress.total / 60:.0f} min on 2 idle CPU "
        "cores; "
        f"data {args.data_dir}, checkpoints {out_root}, results {summary_dir}",
        flush=True,
    )
    stopped = False
    for r in runs:                       # the stored results of every run of the grid, --only or not
        s = load_summary(os.path.join(summary_dir, f"{r.name}.json"), r)
        if s is not None:
            summaries[r.name] = s
    for i, run in enumerate(selected):
        if run.name in summaries:
            progress.skip(run)
            print(f"[{i + 1}/{len(selected)}] {run.name}: done earlier, skipped", file=console, flush=True)
            continue
        _, elapsed, _ = progress.eta()
        if args.max_minutes is not None and elapsed + estimates[run.name] * (
                elapsed / progress.session_est if progress.session_est else 1.0) > 60 * args.max_minutes:
            print(
                f"--max_minutes {args.max_minutes}: stopping before {run.name}; run again to continue",
                flush=True,
            )
            stopped = True
            break
        out_dir = os.path.join(out_root, run.name)
        t0 = time.time()
        progress.start(i, run, out_dir)
        try:
            status = train_run(run, out_dir, args.data_dir, args.device)
            summary = summarize(run, out_dir, args.data_dir, pr)
        except BaseException as e:
            progress.stop.set()
            if isinstance(e, KeyboardInterrupt):
                print(f"\ninterrupted: {run.name} continues from its last checkpoint next time", file=console)
            else:
                print(f"{run.name} failed; its log: {os.path.join(out_dir, 'train.log')}", file=console)
            raise
        summary["wall_s"] = round(time.time() - t0, 1)
        summary["status"] = status
        write_json(os.path.join(summary_dir, f"{run.name}.json"), summary)
        if os.path.exists(os.path.join(out_dir, "init.pt")):
            os.remove(os.path.join(out_dir, "init.pt"))
        summaries[run.name] = summary
        progress.end(i, run, summary, status)

    tables, claims, resolution = assemble(pr, summaries)
    try:
        paths = figures(pr, summaries, tables, assets, prefix)
    except ImportError:
        paths = []
        print("figures skipped: pip install matplotlib", flush=True)
    data = {k: meta[k] for k in ("tokenizer", "train_tokens", "val_tokens", "sources") if k in meta}
    report = {
        "protocol": asdict(pr),
        "data": data | {"data_dir": args.data_dir},
        "environment": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpus": os.cpu_count(),
        },
        "complete": len(summaries) == len(runs),
        "n_runs": len(runs),
        "n_done": len(summaries),
        "wall_s_runs": round(sum(s.get("wall_s", 0) for s in summaries.values()), 1),
        "wall_s_this_session": round(time.time() - t_start, 1),
        "resolution_bpb": resolution,
        "tables": tables,
        "claims": claims,
        "figures": paths,
        "runs": summaries,
    }
    write_json(os.path.join(results, "reproduce.json"), rounded(report))
    with open(os.path.join(results, "reproduce.md"), "w") as f:
        f.write(markdown(pr, tables, claims, resolution))
    print(markdown(pr, tables, claims, resolution), flush=True)
    print(f"wrote {os.path.join(results, 'reproduce.json')}, {os.path.join(results, 'reproduce.md')}"
          + "".join(f", {p}" for p in paths) + (" (partial: run again to continue)" if stopped or
                                                len(summaries) < len(runs) else ""), flush=True)
    return report


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["plot"]:
        return plot_main(argv[1:])
    if argv[:1] == ["starts"]:
        return starts_main(argv[1:])
    if argv[:1] == ["tolerance"]:
        return tolerance_main(argv[1:])
    return study_main(argv)


if __name__ == "__main__":
    try:
        main()
    except train.RunError as e:
        sys.exit(f"error: {e}")
    except train.ConfigError as e:
        sys.exit(f"error: {e}")
