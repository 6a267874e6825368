"""
The study's design: what is trained, on what, for how long, and from which initial weights. Nothing here
trains or reads a file; runs.py launches what make_grid lays out.

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
    from support.accounting.train_flops_per_token); each trained t2mlr model is evaluated exactly and with
    D = 1, 2, 4, 8, 16 Jacobi sweeps on the same windows (the Jacobi-vs-exact gap).

  One protocol for every arm: 4,096 tokens per step (16 x 256, no accumulation), AdamW (0.9, 0.95), weight
  decay 0.1, LR 2e-3 with 10% linear warmup and cosine to 2e-4 at the run's last step, grad clip 1, fp32.
  Curves: train.py's evaluation at 6 points on 64 fixed windows. Final loss: the whole val split (576
  windows of 256, 147,456 tokens), exact mode for T²MLR. Probes: 32 val windows.

  Pairing: seed s gives every arm the same data order (train.py seeds its sampler with TrainConfig.seed) and
  the same initial weights wherever names and shapes agree: each run starts from init.pt, which holds the
  seed's shared model (vanilla for MeSH, plain for T²MLR, exactly as train.py would initialise it) in
  every tensor of the same name and shape, and the arm's own seeded draws elsewhere (routers, gate). All
  tensors share one distribution (model.GPT.init_weights, identical unrolled depth), so no arm is favoured.

THE BUDGET (2.5 h on 2 CPU cores; the grid took 2.1 h). Measured on a 2-core machine, torch's 2 threads:
a 200-step MeSH run takes about 3 minutes with its evaluation and probes (~0.7 s per step of 4,096 tokens),
a T²MLR Jacobi step (D 16, b 4) about 4 s, a plain LLaMA step about 0.9 s. A first layout (5 seeds,
T²MLR at 120 steps, 67 runs) was measured at ~3.5 h and trimmed, after seed 1 of the K2 layout had run, to:

    MeSH:  10 arms x 3 seeds x 200 steps (0.82M tokens per run)                  30 runs  ~ 90 min
    T²MLR: 3 seeds x (plain 80 + t2mlr 80 + plain_224 179 + plain_flops 396 steps)  12 runs  ~ 50 min

  `python -m studies.reproduce --plan` prints the grid with estimates at FLOPS_PER_S = 125 GFLOP/s (the ETA
  corrects itself from the measured speed as the grid runs). Another job on the same 2 cores makes torch's 2
  threads per process thrash (2x slower per step than 1 thread at d 128); `--threads 1` is then the faster
  choice.

  Why 3 seeds: the 95% CI half-width of a paired difference is t(n-1) s_d / sqrt(n), 2.48 s_d at n = 3
  (s_d the std of the paired differences); pairing (same data order and initial weights) removes most of
  the seed-to-seed spread of single runs, and the output reports the half-widths reached.
"""

import functools
import json
import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from model import GPT, GPTConfig
from support.accounting import train_flops_per_token

# -----------------------------------------------------------------------------
# The grid: the protocol, each arm's model and train keys, the runs

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
    keys out_dir, init_from, data_dir, device, dtype, compile, progress are added when runs.py launches it)."""
    name: str
    study: str                 # "mesh" or "t2mlr"
    arm: str
    layout: str                # "K2", "K4"; "" for vanilla and the T²MLR study
    seed: int
    model: dict
    train: dict
    router_init: Optional[str] = None
    shared: dict = field(default_factory=dict)      # the model config whose seeded init the run shares

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
    """support.accounting.train_flops_per_token of a config's model, built on the meta device (no
    memory)."""
    return _flops_per_token(json.dumps(model_cfg, sort_keys=True))


@functools.lru_cache(maxsize=None)
def _flops_per_token(key):
    with torch.device("meta"):
        return train_flops_per_token(GPT(GPTConfig(**json.loads(key))))


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
    With p -> 1 the routing is one-hot and the model equals base / residual recursion (studies/tests/test_reproduce.py).
    The bias is β = ln(p/(1-p) · (B-1)) on the slot, 0 elsewhere: softmax weight exactly p at zero logits."""
    mesh, n_slots = model.mesh, model.cfg.n_slots
    n_steps = len(mesh.write_routers)
    if n_slots < n_steps + 1:
        raise ValueError(f"routing as base needs {n_steps + 1} slots, the model has {n_slots}")
    beta = math.log(p / (1 - p) * (n_slots - 1))
    for step in range(n_steps):
        slot = 1 if kind == "residual" or step == 0 else step + 1
        for router in (mesh.write_routers[step], mesh.read_routers[step]):
            router.bias.zero_()
            router.bias[slot] = beta


def initial_model(run):
    """The run's initial model: the seed's shared model (built as train.py builds it:
    torch.manual_seed(seed), then GPT(config)) in every tensor whose name and shape agree, the run's own
    seeded draws elsewhere, and the router bias of mesh_as_base."""
    torch.manual_seed(run.seed)
    model = GPT(GPTConfig(**run.model))
    if run.shared and run.shared != run.model:
        torch.manual_seed(run.seed)
        ref = GPT(GPTConfig(**run.shared)).state_dict()
        own = model.state_dict()
        model.load_state_dict(
            {k: ref[k] if k in ref and ref[k].shape == v.shape else v for k, v in own.items()}
        )
    if run.router_init:
        set_router_bias(model, run.router_init)
    return model

