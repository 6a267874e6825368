"""
The word problem of a group: the demonstration that recurrence in time carries a state past the training
length, and what depth does within it.

The input is a_1 … a_n, elements of a finite group G (one token each); the target at EVERY position t is
the running product s_t = a_1 · a_2 · … · a_t. The groups are permutation groups: Z2 (parity, as the
permutations of 2 points), S3, A5 (the even permutations of 5 points: the smallest non-solvable group) and
S5. A permutation p of {0..k-1} is the tuple of its images, p[i] = p(i); the product is composition as
functions, RIGHT factor first:

    (p · q)(i) = p(q(i)),   so  s_t = s_{t-1} · a_t  and  s_t(i) = a_1(a_2(… a_t(i) …)).

Token ids: the elements in lexicographic order of their tuples (the identity is id 0); inputs and targets
share the vocabulary of |G| ids. Training: words of n = 16, every position its own running product, under a
length curriculum (positions 1..2 first, one more whenever the loss falls below 0.3: Irie et al. 2026);
test: every position 1..64 of 512 fixed words of n = 64. A recurrent state needs one step per token
whatever n; a fixed-depth transformer must compose t elements in its layers (about 2^L in L layers;
NC¹-complete for A5 and S5), so beyond n = 16 it should fail and T²MLR should not.

    python -m studies.word_problem                       # the whole study, resumable, a stage at a time:
    python -m studies.word_problem --stage levers        #   the recipe's levers (A5, then S5; one seed)
    python -m studies.word_problem --stage main          #   three arms x four groups x three seeds
    python -m studies.word_problem --stage long          #   the LSTM at twice the steps (A5, S5)
    python -m studies.word_problem --stage longer        #   the three arms at four times the steps (S5)
    python -m studies.word_problem --stage depth         #   depth arms (S3, A5): frontier vs unrolled depth
    python -m studies.word_problem --stage depth --group A5   # a stage's runs of one group
    python -m studies.word_problem --report              # tables + figures of what finished (out/word_problem_report)
    python -m studies.word_problem --group A5 --arm t2mlr --seed 5 --out DIR    # one run: DIR/result.json
    python -m studies.word_problem --quick               # every stage at toy size, into out/word_problem_quick

Two processes started on one root share its runs (each run is locked while it trains). Each run writes
studies/results/word_problem/<run>.json when it finishes (skipped on relaunch; an unfinished run continues
from out/word_problem/<run>/ckpt.pt). Stage 1 times one T²MLR training step exact vs Jacobi D = T = 16 side
by side; the cheaper gradient-exact one trains T²MLR. The trainer, schedule, checkpoints and resume are
support/loop.py's, as for the S5 study.
"""

import argparse
import dataclasses
import itertools
import json
import math
import os
import sys
import time

import torch

from model import GPT, GPTConfig
from studies.common import (LSTMLM, advance_curriculum, curriculum_length, gate_values, lstm_hidden_for, open_run,
                            read_json, write_json)
from studies.reproduce.stats import mean_std, paired_stats, t_quantile
from support.checkpoints import rng_states
from support.compat import upgrade_config
from support.loop import evaluation_due, get_lr, make_trainer, optimizer_step, save_state
from support.process import keeps_process_state
from support.runtime import RunError
from train import TrainConfig

# -----------------------------------------------------------------------------
# The groups and the data generator

GROUP_DEGREE = {"Z2": 2, "S3": 3, "A5": 5, "S5": 5}        # permutations of this many points
GROUPS = tuple(GROUP_DEGREE)


def parity(p) -> int:
    """0 for an even permutation, 1 for an odd one (the parity of its number of inversions)."""
    return sum(p[i] > p[j] for i in range(len(p)) for j in range(i + 1, len(p))) % 2


def group_elements(name: str):
    """The elements of the group `name` as permutation tuples, in lexicographic order (identity first)."""
    if name not in GROUP_DEGREE:
        raise ValueError(f"group {name!r} is not one of {', '.join(GROUPS)}")
    perms = list(itertools.permutations(range(GROUP_DEGREE[name])))
    return [p for p in perms if parity(p) == 0] if name == "A5" else perms


def compose(p, q):
    """The product p · q = p ∘ q: (p · q)(i) = p(q(i)), q applied first."""
    return tuple(p[q[i]] for i in range(len(q)))


def multiplication_table(name: str) -> torch.Tensor:
    """(|G|, |G|) long tensor: table[i, j] = the id of element_i · element_j."""
    elements = group_elements(name)
    index = {p: i for i, p in enumerate(elements)}
    return torch.tensor([[index[compose(p, q)] for q in elements] for p in elements], dtype=torch.long)


def running_products(words: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """words (B, n) element ids -> (B, n) ids of s_t = a_1 · … · a_t (s_1 = a_1, s_t = s_{t-1} · a_t)."""
    states = torch.empty_like(words)
    s = words[:, 0]
    states[:, 0] = s
    for t in range(1, words.shape[1]):
        s = table[s, words[:, t]]
        states[:, t] = s
    return states


def make_batch(table: torch.Tensor, batch_size: int, n: int, seed: int):
    """batch_size words of n elements drawn i.i.d. uniformly (a generator seeded by `seed` alone) and their
    running products: (inputs (B, n), targets (B, n))."""
    g = torch.Generator().manual_seed(seed)
    words = torch.randint(table.shape[0], (batch_size, n), generator=g)
    return words, running_products(words, table)


def with_identity_start(words: torch.Tensor, states: torch.Tensor):
    """(B, n) words and targets -> (B, 1 + n), behind a start position that holds the identity (id 0), its
    target -1 (ignored by the loss): the products are unchanged. The depth arms need it: causal attention
    without positions (NoPE) or with relative ones (rotary) gives the words "a" and "a a" the same vector at
    their last position in every layer, so s_2 = a·a is out of reach (S3's position 2 stops at 0.85)."""
    e = words.new_zeros(words.shape[0], 1)
    return torch.cat([e, words], dim=1), torch.cat([e - 1, states], dim=1)


def batch_seed(group: str, seed: int, step: int) -> int:
    """The seed of training batch `step`: the same for every arm (same batches), a resumed run the same."""
    return (GROUPS.index(group) + 1) * 10_000_000_019 + seed * 1_000_003 + step


TEST_SEED, PROBE_SEED = 777_000, 888_000      # the fixed test set (n = 64) and the quick in-training probe


# -----------------------------------------------------------------------------
# The study's sizes (one CPU thread, ~80 minutes in all; QUICK: seconds)

# The study's recipe: a length curriculum (supervise positions 1..2, then one more whenever the training
# loss falls below 0.3), 256 sequences a step, LR 3e-3 for every arm (the rate a fixed-length pilot on S3
# chose for all three). The arms are the fixed-length study's sizes; A5 and S5 first.
CURRICULUM = {"start": 2, "threshold": 0.3}
# The fixed-length recipe (n = 16 from the first step, 32 sequences a step, 2,000 steps): it learns Z2 and
# S3 and not A5 or S5 (studies/word_problem.md); theta_trajectories below measures the gate under it.
FIXED_LENGTH = dict(steps=2000, batch_size=32, train_n=16, n_embd=64, n_layer=4, n_head=4, mlp_hidden=256,
                    lstm_layers=2, test_n=64)
FULL = dict(steps=2000, batch_size=256, train_n=16, test_n=64, test_examples=512, seeds=(0, 1, 2),
            lever_seed=100, groups=("A5", "S5", "Z2", "S3"), depth_groups=("S3", "A5"), n_embd=64, n_layer=4,
            n_head=4, mlp_hidden=256, lstm_layers=2, lr=3e-3, curriculum=CURRICULUM, eval_interval=250,
            timing_steps=8, fixed_length_json="studies/results/word_problem_fixed_length.json",
            depth_recipe={"steps": 1000, "batch_size": 128}, longer_group="S5")
QUICK = dict(FULL, steps=12, batch_size=8, test_examples=32, seeds=(0, 1), groups=("S3",), fixed_length_json=None,
             long_groups=("S3",), depth_seeds=(0,), longer_group="S3", longer_seeds=(0,),
             depth_groups=("S3",), n_embd=32, mlp_hidden=64, eval_interval=6, timing_steps=1,
             curriculum={"start": 2, "threshold": 3.0}, depth_recipe={},
             levers=("recipe", "fixed_b256", "S5_t2mlr_steps8000", "S5_t2mlr_s2_plain_state",   # one of each kind
                     "S5_t2mlr_s0_anneal4000"))
# A GPU config: wider models, 5x the steps, 4x the batch, every run on the annealed schedule (run_one: the
# peak LR until the curriculum is complete, then 2,500 steps of cosine). Not run here (no GPU was lent to this
# study); python -m studies.word_problem --gpu
GPU = dict(FULL, steps=10000, batch_size=1024, n_embd=128, mlp_hidden=512, eval_interval=1000,
           timing_steps=20, device="cuda", depth_recipe={}, anneal=2500)
# The levers of the recipe, measured one at a time on the LSTM, A5, one seed outside the test seeds:
# name -> what differs from the recipe: "batch", "steps" and "width" scale the recipe's words a step, steps
# and LSTM width; "fixed_b32" is the fixed-length recipe (n = 16, 32 a step). The S5_ levers run on S5 (a
# "group" change): a stricter threshold (the 14,400-entry table learned better before a third element is
# composed), four times the steps (also for the other two arms: an "arm" change), and width. The S5_t2mlr_s2
# levers run on test seed 2 ("seed"), where T²MLR's curriculum stalled at length 3 under four times the steps;
# each changes one thing of that run:
# - bptt: the gradient along the state chain R (recurrent_detach off, as the LSTM trains through time);
# - plain_state: R_t = h_t (recurrent_residual off; the paper's S5 configs merge R_t = s·(h_t + R_{t-1}));
# - lr1e-3: a third of the learning rate;
# - start4: the curriculum from length 4 (positions 3 and 4 compose three and four elements from step 1);
# - fixed: no curriculum (n = 16 from step 1: 14 such positions a word);
# - b512: 512 words a step;
# - steps16000: twice the steps again (8x the recipe's; the plateau ended late under 4x), then on the
#   other two test seeds (s0, s1), so that 8x is measured on all three; the S5_transformer levers give
#   the transformer the same 8x on the same seeds;
# - anneal4000 (S5_<arm>_s<seed>_anneal4000, every arm on the test seeds): the 8x runs with the annealed
#   schedule (annealed_lr): the peak LR held until the curriculum reaches 16, then 4,000 steps of cosine, and
#   the run ends there (at most 8x). Under the cosine the accuracy past 16 climbed only as the
#   LR annealed, thousands of steps after the curriculum was complete.
# "model" changes T²MLR's config fields.
LONGEST = 8          # the steps of the S5 levers on the three test seeds, as a multiple of the recipe's
ANNEAL = 4000        # the anneal levers' decay, in steps, once the curriculum is complete (at most LONGEST x)
LEVERS = {"recipe": {}, "fixed_b256": {"curriculum": None}, "fixed_b32": {"curriculum": None, "batch": 1 / 8},
          "curriculum_b32": {"batch": 1 / 8}, "curriculum_b512": {"batch": 2},
          "curriculum_lr1e-3": {"lr": 1e-3}, "curriculum_wide": {"width": 2}, "curriculum_steps4000": {"steps": 2},
          "S5_threshold0.1_steps4000": {"group": "S5", "curriculum": {"start": 2, "threshold": 0.1}, "steps": 2},
          "S5_steps8000": {"group": "S5", "steps": 4},
          "S5_t2mlr_steps8000": {"group": "S5", "arm": "t2mlr", "steps": 4},
          "S5_transformer_steps8000": {"group": "S5", "arm": "transformer", "steps": 4},
          "S5_wide_steps4000": {"group": "S5", "width": 2, "steps": 2},
          "S5_t2mlr_s2_bptt": {"group": "S5", "arm": "t2mlr", "steps": 4, "seed": 2,
                               "model": {"recurrent_detach": False}},
          "S5_t2mlr_s2_plain_state": {"group": "S5", "arm": "t2mlr", "steps": 4, "seed": 2,
                                      "model": {"recurrent_residual": False}},
          "S5_t2mlr_s2_lr1e-3": {"group": "S5", "arm": "t2mlr", "steps": 4, "seed": 2, "lr": 1e-3},
          "S5_t2mlr_s2_start4": {"group": "S5", "arm": "t2mlr", "steps": 4, "seed": 2,
                                 "curriculum": {"start": 4, "threshold": 0.3}},
          "S5_t2mlr_s2_fixed": {"group": "S5", "arm": "t2mlr", "steps": 4, "seed": 2, "curriculum": None},
          "S5_t2mlr_s2_b512": {"group": "S5", "arm": "t2mlr", "steps": 4, "seed": 2, "batch": 2},
          **{f"S5_t2mlr_s{seed}_steps16000": {"group": "S5", "arm": "t2mlr", "steps": LONGEST, "seed": seed}
             for seed in (2, 0, 1)},
          **{f"S5_transformer_s{seed}_steps16000": {"group": "S5", "arm": "transformer", "steps": LONGEST,
                                                    "seed": seed} for seed in (0, 1, 2)},
          **{f"S5_{arm}_s{seed}_anneal{ANNEAL}": {"group": "S5", "arm": arm, "steps": LONGEST, "seed": seed,
                                                 "anneal": ANNEAL} for arm in ("t2mlr", "transformer", "lstm")
             for seed in (2, 0, 1)}}

ARMS = ("transformer", "t2mlr", "lstm")
ARM_STYLE = {"transformer": ("C0", "-", 1.6), "t2mlr": ("C3", "-", 3.5), "lstm": ("C2", "--", 1.6)}  # T²MLR
# thick under the LSTM's dashes: where both are at 1.0 both stay visible
ARM_LABEL = {"transformer": "transformer (NoPE)", "t2mlr": "T²MLR (layers 1..2 in time)", "lstm": "LSTM"}
# The depth arms (MeSH paper §3.1-3.2 on the word problem): name -> (n_layer or layout, state_passing). The
# core "1+1RK+1" looped K times with each state passing, and vanilla stacks of the same unrolled depth K + 2.
LOOPS = (1, 2, 4, 8)
PASSINGS = ("base", "residual", "anchor", "mesh")
DEPTH_ARMS = {f"vanilla_L{K + 2}": (K + 2, None) for K in LOOPS} | {
    f"{passing}_K{K}": (f"1+1R{K}+1", passing) for passing in PASSINGS for K in LOOPS}
# the same function and initialisation as another arm: base K = 1 is the 3-layer stack, and at K = 1 the
# anchor h(0) is the loop's own input, so anchor is residual
DEPTH_ALIAS = {"base_K1": "vanilla_L3", "anchor_K1": "residual_K1"}
DEPTH_TRAINED = {name: shape for name, shape in DEPTH_ARMS.items() if name not in DEPTH_ALIAS}
DEPTH_ORDER = tuple(DEPTH_ARMS)
# the arms MeSH − base is measured on, trained first on every seed (K = 8 after them: the costliest)
PAIRED = {"vanilla_L3"} | {f"{p}_K{K}" for p in ("base", "mesh") for K in LOOPS}
DEPTH_COLOR = {"vanilla": "black", "base": "C2", "residual": "C1", "anchor": "C4", "mesh": "C3"}
DEPTH_LABEL = {"vanilla": "vanilla stack", "base": "base", "residual": "+residual", "anchor": "+anchor",
               "mesh": "+MeSH"}


def gpt_config(size, group, **fields) -> dict:
    """The GPTConfig fields of a tiny NoPE LLaMA-style model for `group` (the S5 configs' flavour)."""
    return dict(flavour="llama", vocab_size=len(group_elements(group)), block_size=size["test_n"],
                n_layer=size["n_layer"], n_embd=size["n_embd"], n_head=size["n_head"], n_kv_head=size["n_head"],
                mlp_hidden=size["mlp_hidden"], tie_embeddings=False, rope_pct=0.0) | fields


def t2mlr_fields(init: str) -> dict:
    """T²MLR on the middle layers 1..2 of 4, the S5 configs' gate and state update; init "mesh" (ours) or
    "normal_0.02" (every weight N(0, 0.02²), embeddings unscaled: the T²MLR code's)."""
    return dict(t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=16, jacobi_grad_sweeps=15,
                recurrent_residual=True, recurrent_detach=True, gate_bias_prob=0.5, gate_weight_gain=1.0,
                **init_fields(init))


def init_fields(init: str) -> dict:
    return dict(weight_init="normal_0.02", embed_scale=False) if init == "normal_0.02" else {}


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def gpt_params(fields) -> int:
    return count_params(GPT(GPTConfig(**fields)))


def matched_arms(size, group, init_t2mlr="mesh", init_transformer="mesh"):
    """The three arms' model specs for `group`, parameter-matched to T²MLR: the transformer's MLP width and
    the LSTM's width (s5_retrieval.lstm_hidden_for) chosen to come closest to T²MLR's count."""
    t2 = gpt_config(size, group, **t2mlr_fields(init_t2mlr))
    target = gpt_params(t2)
    base = gpt_config(size, group, **init_fields(init_transformer))
    per_unit = gpt_params(base | {"mlp_hidden": size["mlp_hidden"] + 1}) - gpt_params(base)
    hidden = size["mlp_hidden"] + round((target - gpt_params(base)) / per_unit)
    V = len(group_elements(group))
    return {"transformer": {"kind": "gpt", "config": base | {"mlp_hidden": hidden}},
            "t2mlr": {"kind": "gpt", "config": t2},
            "lstm": {"kind": "lstm", "vocab_size": V, "layers": size["lstm_layers"],
                     "hidden": lstm_hidden_for(target, V, size["lstm_layers"])}}


def build(model_spec):
    if model_spec["kind"] == "lstm":
        return LSTMLM(model_spec["vocab_size"], model_spec["hidden"], model_spec["layers"])
    return GPT(GPTConfig(**model_spec["config"]))


# -----------------------------------------------------------------------------
# One run: train through support/loop.py, then accuracy at every position of the test set

def annealed_lr(step, cfg, anneal_start, anneal_steps):
    """The LR of step `step` under the annealed schedule: cfg's linear warmup, then cfg.learning_rate held
    until step `anneal_start` (None: not yet begun), then a cosine down to cfg.min_lr at step anneal_start +
    anneal_steps - 1: a warmup-stable-decay schedule (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
    Training Beyond Fixed Training Durations")."""
    if anneal_start is None or step < anneal_start:
        return get_lr(min(step, cfg.warmup_iters), cfg)           # warmup, then the peak held
    decay = dataclasses.replace(cfg, warmup_iters=0, max_iters=anneal_steps, lr_decay_iters=None)
    return get_lr(step - anneal_start, decay)


def anneal_begins(state, spec, cfg, step) -> bool:
    """Whether the annealed schedule's decay begins at step `step`: once the curriculum has reached the
    training length, or when only spec["anneal"]["steps"] steps are left before cfg.max_iters; never
    inside the warmup."""
    full = curriculum_length(state, spec.get("curriculum"), spec["train_n"]) >= spec["train_n"]
    return (full or step >= cfg.max_iters - spec["anneal"]["steps"]) and step >= cfg.warmup_iters


def run_end(state, spec, cfg) -> int:
    """The step a run stops at: cfg.max_iters, or with spec["anneal"] the end of its decay once begun (at most
    cfg.max_iters: a decay longer than the run is cut there)."""
    if spec.get("anneal") and state.get("anneal_start") is not None:
        return min(cfg.max_iters, state["anneal_start"] + spec["anneal"]["steps"])
    return cfg.max_iters


def step_loss(model, x, y, train_mode):
    """The training loss; T²MLR with train_mode "exact" runs token by token with autograd."""
    if getattr(model, "gate", None) is not None:
        return model(x, y, mode=train_mode)[1]
    return model(x, y)[1]


@torch.no_grad()
def predictions(model, table, n, examples, seed, batch=256, identity_start=False):
    """(argmax ids, targets), each (examples, n) long on the CPU, for `examples` fixed words of length n
    (behind the identity with identity_start, its position dropped); T²MLR in eval mode runs the exact
    recurrence."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    words, states = make_batch(table, examples, n, seed)
    if identity_start:
        words, states = with_identity_start(words, states)
    pred = torch.cat([model(words[i:i + batch].to(device))[0].argmax(-1).cpu() for i in range(0, examples, batch)])
    model.train(was)
    return (pred[:, 1:], states[:, 1:]) if identity_start else (pred, states)


def accuracy_by_position(model, table, n, examples, seed, batch=256, identity_start=False):
    """Accuracy of argmax predictions at each position 1..n (a list of n floats) on the words of
    `predictions`."""
    pred, states = predictions(model, table, n, examples, seed, batch, identity_start)
    return (pred == states).float().mean(0).tolist()


def odd_elements(group: str) -> torch.Tensor:
    """(|G|,) bool: which element ids are odd permutations (none in A5)."""
    return torch.tensor([parity(p) == 1 for p in group_elements(group)])


def sign_accuracy(pred, states, odd) -> float:
    """The fraction of predictions with the target's sign (both even or both odd): the accuracy of s_t's
    image in G / A_n ≅ Z2. pred, states: ids of one shape; odd: odd_elements(group)."""
    return (odd[pred] == odd[states]).float().mean().item()


def run_json(paths, spec) -> str:
    """Where the study keeps run `spec`'s results: paths["runs"]/<name>.json."""
    return os.path.join(paths["runs"], spec["name"] + ".json")


def upgrade_spec(stored):
    """A stored run spec with its model config's renamed keys and values under their new names
    (support.compat), so a run made before a rename is still the same run."""
    model = stored.get("model")
    if not (isinstance(model, dict) and isinstance(model.get("config"), dict)):
        return stored
    return dict(stored, model=dict(model, config=upgrade_config(model["config"])))


def run_one(spec, paths, log=print, device="cpu", out_json=None, ckpt_dir=None):
    """Train and evaluate the run `spec` (a dict: name, group, seed, model, train, train_mode, train_n,
    test_n, test_examples, curriculum), or return its finished results. Resumable: a finished run (its
    JSON, out_json or paths["runs"]/<name>.json) is returned as is; an unfinished one continues from its
    checkpoint (ckpt_dir or paths["ckpt"]/<name>). A JSON or checkpoint made with another spec is refused
    (RunError). With spec["curriculum"] the batch of each step is the first `length` positions of the same
    words (curriculum_length: positions 1..length), so every arm sees the same words. With spec["anneal"]
    ({"steps": D}) the LR follows annealed_lr: held at its peak until the curriculum reaches the training
    length (anneal_begins), then D steps of cosine, and the run ends there (at most cfg.max_iters)."""
    out_json = out_json or run_json(paths, spec)
    if os.path.exists(out_json):
        done = read_json(out_json)
        if upgrade_spec(done["spec"]) != spec:
            raise RunError(f"{out_json} was made with another spec; delete it (and its checkpoint) to rerun")
        return done
    ckpt_dir = ckpt_dir or os.path.join(paths["ckpt"], spec["name"])
    ckpt_path = os.path.join(ckpt_dir, "ckpt.pt")
    cfg = TrainConfig(**spec["train"])
    table, odd = multiplication_table(spec["group"]), odd_elements(spec["group"])
    identity_start = spec.get("identity_start", False)   # the depth arms' words begin with the identity
    torch.manual_seed(cfg.seed)
    model = build(spec["model"]).to(device)

    def check(ckpt):
        if upgrade_spec(json.loads(ckpt["spec"])) != spec:
            raise RunError(f"{ckpt_path} was made with another spec; delete it to rerun")

    trainer, start, ckpt = open_run(model, cfg, ckpt_path, check, device)
    state = json.loads(ckpt["state"]) if ckpt else {"seconds": 0.0, "curve": []}
    os.makedirs(ckpt_dir, exist_ok=True)
    n_params = count_params(model)
    log(f"{spec['name']}: {n_params:,} parameters, steps {start}..{cfg.max_iters}")
    losses = []                       # the training losses since the last evaluation
    model.train()
    t0 = time.time() - state["seconds"]
    for step in range(start, cfg.max_iters + 1):
        end = run_end(state, spec, cfg)                      # cfg.max_iters, or the end of the anneal
        if evaluation_due(dataclasses.replace(cfg, max_iters=end), step, evaluated=start):   # the curve's
            # row, then the checkpoint
            pred, states = predictions(model, table, spec["test_n"], 128, PROBE_SEED,   # probe words, not the test's
                                       identity_start=identity_start)
            acc = (pred == states).float().mean(0).tolist()
            state["seconds"] = time.time() - t0
            inside, past = acc[:spec["train_n"]], acc[spec["train_n"]:]
            row = {"step": step, "acc_in": sum(inside) / len(inside)}
            if past:                                         # logged only: nothing is chosen by it
                row["acc_beyond"] = sum(past) / len(past)
            if losses:
                row["loss"] = sum(losses) / len(losses)
                losses.clear()
            if spec.get("curriculum"):                       # the newest position: its element, its sign
                row["length"] = L = curriculum_length(state, spec.get("curriculum"), spec["train_n"])
                row["acc_at_length"] = acc[L - 1]
                if odd.any():
                    row["sign_at_length"] = sign_accuracy(pred[:, L - 1], states[:, L - 1], odd)
            row |= {k: v for k, v in gate_values(model).items() if k == "theta_r"}
            state["curve"].append(row)
            eta = state["seconds"] / max(step, 1) * (end - step)        # at the mean step time so far
            log(f"  step {step}/{end}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k != "step")
                + f", {state['seconds']:.0f} s, ETA {eta / 60:.1f} min")
            save_state(trainer, step, [rng_states()], spec=json.dumps(spec), state=json.dumps(state))
        if step == end:
            break
        if spec.get("anneal") and state.get("anneal_start") is None and anneal_begins(state, spec, cfg, step):
            state["anneal_start"] = step
        lr = annealed_lr(step, cfg, state.get("anneal_start"), spec["anneal"]["steps"]) \
            if spec.get("anneal") else None                     # None: train.py's cosine (get_lr)
        n = curriculum_length(state, spec.get("curriculum"), spec["train_n"])   # the words' first n positions
        x, y = (t[:, :n] for t in
                make_batch(table, cfg.batch_size, spec["train_n"], batch_seed(spec["group"], cfg.seed, step)))
        x, y = (t.to(device) for t in (with_identity_start(x, y) if identity_start else (x, y)))
        loss, _, _ = optimizer_step(trainer, step, 1, lambda m, _: step_loss(m, x, y, spec["train_mode"]), lr=lr)
        losses.append(loss.item())
        state["steps_done"] = step + 1
        advance_curriculum(state, spec.get("curriculum"), spec["train_n"], losses[-1])
    acc = accuracy_by_position(model, table, spec["test_n"], spec["test_examples"], TEST_SEED,
                               identity_start=identity_start)
    results = {"spec": spec, "params": n_params, "train_seconds": state["seconds"], "steps": end,
               "acc_by_position": acc, "curve": state["curve"],
               "final_loss": next((r["loss"] for r in reversed(state["curve"]) if "loss" in r), None)}
    results["recipe"] = {"train": spec["train"], "curriculum": spec.get("curriculum"),
                         "train_mode": spec["train_mode"], "model": spec["model"], "anneal": spec.get("anneal")}
    if spec.get("curriculum"):
        results["curriculum_lengths"] = state.get("lengths", {})
    if spec.get("anneal"):
        results["anneal_start"] = state.get("anneal_start")
    write_json(out_json, results | gate_values(model))
    return results | gate_values(model)


# -----------------------------------------------------------------------------
# Stage 1: exact training vs Jacobi D >= T, one training step each, side by side in this process

def measure_step_times(size, group="S5", rounds=3):
    """Seconds per training step (forward, backward, AdamW) of the T²MLR arm on a (batch_size, train_n)
    batch: mode "exact" (token by token with autograd) and Jacobi with D = T sweeps, b = D - 1 (every sweep
    keeps its gradient: the exact gradient) and b = 4 (the configs' b: exact values, truncated gradient).
    Interleaved over `rounds`, the median kept."""
    T, device = size["train_n"], size.get("device", "cpu")
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fields = gpt_config(size, group, **t2mlr_fields("mesh"))
    variants = {"exact": ("exact", T - 1), "jacobi_D16_b15": ("jacobi", T - 1), "jacobi_D16_b4": ("jacobi", 4)}
    table = multiplication_table(group)
    times = {k: [] for k in variants}
    for r in range(rounds):
        for key, (mode, b) in variants.items():
            torch.manual_seed(0)
            model = GPT(GPTConfig(**fields | {"jacobi_sweeps": T, "jacobi_grad_sweeps": b})).to(device)
            model.train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for i in range(2 + size["timing_steps"]):
                if i == 2:
                    sync()
                    t0 = time.perf_counter()
                x, y = (t.to(device) for t in make_batch(table, size["batch_size"], T, i))
                model(x, y, mode=mode)[1].backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            sync()
            times[key].append((time.perf_counter() - t0) / size["timing_steps"])
    med = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    mode = "exact" if med["exact"] <= med["jacobi_D16_b15"] else "jacobi"
    return {"seconds_per_step": med, "all_rounds": times,
            "ratio_jacobi_b15_over_exact": med["jacobi_D16_b15"] / med["exact"],
            "ratio_jacobi_b4_over_exact": med["jacobi_D16_b4"] / med["exact"],
            "batch": [size["batch_size"], T], "group": group, "threads": torch.get_num_threads(),
            "chosen_train_mode": mode}


# -----------------------------------------------------------------------------
# The study

def train_spec(lr, seed, steps, batch_size, eval_interval) -> dict:
    """The TrainConfig fields of one run (train.py's schedule and AdamW, the study's own values)."""
    return dict(max_iters=steps, learning_rate=lr, min_lr=lr / 100, warmup_iters=max(1, steps // 20),
                lr_decay_iters=None, weight_decay=0.01, beta1=0.9, beta2=0.95, grad_clip=1.0,
                eval_interval=min(eval_interval, steps), batch_size=batch_size, seed=seed)


def spec_of(size, stage, group, arm, seed, model, lr, train_mode, steps=None, tag="", anneal=None, **changes):
    """One run of the recipe `size` (lr and steps None: the recipe's); `changes` (batch_size, curriculum,
    test_n) replace the recipe's; anneal (steps; None: size's "anneal", if any) gives the run the annealed
    schedule (run_one)."""
    anneal = anneal or size.get("anneal")
    changes |= {k: v for k, v in (("lr", lr), ("steps", steps)) if v is not None}
    recipe = {k: changes.get(k, size[k]) for k in ("lr", "batch_size", "curriculum", "steps")}
    spec = {"name": f"{stage}_{group}_{arm}{tag}_s{seed}", "stage": stage, "group": group, "arm": arm,
            "seed": seed, "model": model,
            "train": train_spec(recipe["lr"], seed, recipe["steps"], recipe["batch_size"], size["eval_interval"]),
            "curriculum": recipe["curriculum"], "train_mode": train_mode if arm == "t2mlr" else None,
            "train_n": size["train_n"], "test_n": changes.get("test_n", size["test_n"]),
            "test_examples": size["test_examples"]}
    return spec | {"anneal": {"steps": anneal}} if anneal else spec


def in_dist(r, train_n):
    return sum(r["acc_by_position"][:train_n]) / train_n


def beyond(r, train_n):
    """Mean accuracy over the positions past the training length (17..64 in the study)."""
    acc = r["acc_by_position"][train_n:]
    return sum(acc) / len(acc)


def lever_specs(size, train_mode="exact"):
    """The LSTM (or change["arm"]) on A5 (or change["group"]) under the recipe and under each lever changed
    alone (LEVERS, or those named in size["levers"]), one seed (change["seed"], else size["lever_seed"])."""
    specs = []
    for name, change in LEVERS.items():
        if name not in size.get("levers", LEVERS):
            continue
        group, arm = change.get("group", "A5"), change.get("arm", "lstm")
        model = matched_arms(size, group)[arm]
        if "model" in change:
            model = dict(model, config=model["config"] | change["model"])
        if "width" in change:
            model = dict(model, hidden=model["hidden"] * change["width"])
        changes = {k: v for k, v in change.items() if k == "curriculum"}
        changes |= {"batch_size": max(1, round(size["batch_size"] * change.get("batch", 1))),
                    "steps": size["steps"] * change.get("steps", 1)}
        seed = change.get("seed", size["lever_seed"])
        specs.append(spec_of(size, "lever", group, arm, seed, model, change.get("lr"), train_mode, tag=f"_{name}",
                             anneal=change.get("anneal"), **changes))
    return specs


def lever_name(spec) -> str:
    """The LEVERS name of a lever run: lever_<group>_<arm>_<name>_s<seed>."""
    return spec["name"][len(f"lever_{spec['group']}_{spec['arm']}_"):].rsplit("_s", 1)[0]


def arm_spec(size, group, arm, seed, train_mode, stage="main", steps=None, anneal=None):
    """One arm of the main comparison under the recipe (the CLI's single run; steps and anneal None: the
    recipe's)."""
    return spec_of(size, stage, group, arm, seed, matched_arms(size, group)[arm], None, train_mode, steps=steps,
                   anneal=anneal)


def main_specs(size, train_mode, seeds=None):
    """Group by group (A5 and S5 first), seed by seed, the three arms."""
    return [arm_spec(size, g, arm, seed, train_mode) for g in size["groups"] for seed in seeds or size["seeds"]
            for arm in ARMS]


def long_specs(size, seeds=None):
    """The LSTM at twice the recipe's steps, A5 then S5, seed by seed: what the steps lever buys it."""
    return [spec_of(size, "long", g, "lstm", seed, matched_arms(size, g)["lstm"], None, None, steps=2 * size["steps"])
            for g in size.get("long_groups", ("A5", "S5")) for seed in seeds or size["seeds"]]


LONGER = 4                                 # the longer stage's steps, as a multiple of the recipe's


def longer_specs(size, train_mode, seeds=None):
    """The three arms at four times the recipe's steps on size["longer_group"] (S5: the steps lever that
    learned it, LEVERS "S5_*steps8000", spent on the test seeds): T²MLR, the LSTM, the transformer, seed by
    seed."""
    group = size["longer_group"]
    return [spec_of(size, "longer", group, arm, seed, matched_arms(size, group)[arm], None, train_mode,
                    steps=LONGER * size["steps"])
            for arm in ("t2mlr", "lstm", "transformer") for seed in seeds or size.get("longer_seeds", size["seeds"])]


def depth_specs(size, seeds=None):
    """The depth arms (DEPTH_TRAINED) on each depth group, trained on n = 16 and tested there; size[
    "depth_recipe"] (steps, batch_size) replaces the recipe's (half of each in FULL: 18 arms a seed). Their
    words begin with the identity (with_identity_start). In order, per group: the arms MeSH − base is
    measured on (PAIRED), first seed first, then the other arms, first seed first."""
    seeds = seeds or size.get("depth_seeds", size["seeds"])
    specs = []
    for g in size["depth_groups"]:
        order = sorted(((s, a) for s in seeds for a in DEPTH_TRAINED),
                       key=lambda sa: (sa[1] not in PAIRED, sa[0] != seeds[0], sa[0], DEPTH_ORDER.index(sa[1])))
        for seed, arm in order:
            shape, passing = DEPTH_TRAINED[arm]
            fields = {"n_layer": shape} if passing is None else {"layout": shape, "state_passing": passing}
            model = {"kind": "gpt", "config": gpt_config(size, g) | fields}
            specs.append(spec_of(size, "depth", g, arm, seed, model, None, None, test_n=size["train_n"],
                                 **size["depth_recipe"]) | {"identity_start": True})
    return specs


def frontier(acc, level=0.9) -> int:
    """The last position up to which the accuracy stays >= level (0 when position 1 is below it)."""
    return next((t for t, a in enumerate(acc) if a < level), len(acc))


def t_interval(values):
    """(mean, low, high): the 95% Student-t interval of the mean (low = high = mean for one value)."""
    mean, sd = mean_std(values)
    if len(values) < 2:
        return mean, mean, mean
    half = t_quantile(0.975, len(values) - 1) * sd / math.sqrt(len(values))
    return mean, mean - half, mean + half


def aggregate(runs, arms, train_n):
    """{arm: {"seeds", "params", "mean", "lo", "hi" (per position), "summary", "frontier" (one per seed)}}
    over the runs found, seeds in the order of `runs`."""
    out = {}
    for arm in arms:
        rs = sorted((r for r in runs if r["spec"]["arm"] == arm), key=lambda r: r["spec"]["seed"])
        if not rs:
            continue
        n = min(len(r["acc_by_position"]) for r in rs)
        cols = [t_interval([r["acc_by_position"][t] for r in rs]) for t in range(n)]
        summary = {"in_dist_mean_1_16": t_interval([in_dist(r, train_n) for r in rs])}
        for t in sorted({train_n, 2 * train_n, 3 * train_n, 4 * train_n}):
            if t <= n:
                summary[f"pos_{t}"] = cols[t - 1]
        if n > train_n:
            summary[f"beyond_mean_{train_n + 1}_{n}"] = t_interval([beyond(r, train_n) for r in rs])
        out[arm] = {"seeds": [r["spec"]["seed"] for r in rs], "params": sorted({r["params"] for r in rs}),
                    "mean": [c[0] for c in cols], "lo": [c[1] for c in cols], "hi": [c[2] for c in cols],
                    "summary": summary, "frontier": [frontier(r["acc_by_position"]) for r in rs],
                    "train_seconds": [r["train_seconds"] for r in rs],
                    "final_loss": [r["final_loss"] for r in rs]}
        if "theta_r" in rs[0]:
            out[arm]["theta_r"] = [r["theta_r"] for r in rs]
    return out


def with_curves(agg, runs):
    """agg (aggregate's) with each arm's training curves added: "curves", one list of rows (step, acc_in,
    acc_beyond, loss, length) per seed, in the order of agg's seeds."""
    for arm, r in agg.items():
        by_seed = {run["spec"]["seed"]: run["curve"] for run in runs if run["spec"]["arm"] == arm}
        r["curves"] = [by_seed[seed] for seed in r["seeds"]]
    return agg


def load_runs(paths, stage):
    runs = []
    if os.path.isdir(paths["runs"]):
        for name in sorted(os.listdir(paths["runs"])):
            if name.startswith(stage + "_") and name.endswith(".json"):
                runs.append(read_json(os.path.join(paths["runs"], name)))
    return runs


def paired_difference(a, b):
    """a - b over the seeds both have ({seed: value} each): (mean, low, high, pairs) of the paired 95% t
    interval (low = high = mean for one pair), or None without a common seed."""
    if not set(a) & set(b):
        return None
    st = paired_stats(a, b)
    low, high = st["ci"] or (st["diff"], st["diff"])
    return st["diff"], low, high, st["n"]


def depth_summary(depth):
    """Per depth group: the frontier (mean over seeds [95% t]) of every arm, and MeSH − base paired by
    seed at each K (base K = 1 is the 3-layer stack)."""
    out = {}
    for g, arms in depth.items():
        by_seed = {arm: dict(zip(r["seeds"], r["frontier"])) for arm, r in arms.items()}
        out[g] = {"frontier": {arm: t_interval(r["frontier"]) for arm, r in arms.items()},
                  "mesh_minus_base": {f"K{K}": paired_difference(by_seed.get(f"mesh_K{K}", {}),
                                                                 by_seed.get(f"base_K{K}", {})) for K in LOOPS}}
    return out


def fixed_length_results(size, groups):
    """The fixed-length recipe's results (its committed JSON) of `groups`, for the figure's panels of the
    groups this study has not run; {} when there is none."""
    path = size.get("fixed_length_json")
    if not path or not os.path.exists(path):
        return {}
    results = read_json(path)["results"]
    return {g: results[g] for g in groups if results.get(g)}


def longest_runs(size, lever_runs):
    """The S5 levers at LONGEST times the recipe's steps on the test seeds (every arm so run): that recipe's
    3-seed results."""
    return [r for r in lever_runs if r["spec"]["group"] == "S5" and "anneal" not in r["spec"]
            and r["steps"] == LONGEST * size["steps"] and r["spec"]["seed"] in size["seeds"]]


def annealed_runs(size, lever_runs):
    """The S5 levers with the annealed schedule on the test seeds: that recipe's 3-seed results."""
    return [r for r in lever_runs if r["spec"]["group"] == "S5" and "anneal" in r["spec"]
            and r["spec"]["seed"] in size["seeds"]]


def report(size, paths, command, extra):
    """Assemble the JSON and the figures from the per-run results finished so far."""
    train_n = size["train_n"]
    main_runs, depth_runs, lever_runs, long_runs, longer_runs = (
        load_runs(paths, stage) for stage in ("main", "depth", "lever", "long", "longer"))
    results = {g: aggregate([r for r in main_runs if r["spec"]["group"] == g], ARMS, train_n)
               for g in size["groups"]}
    depth = {}
    for g in size["depth_groups"]:
        agg = aggregate([r for r in depth_runs if r["spec"]["group"] == g], DEPTH_TRAINED, train_n)
        for alias, target in DEPTH_ALIAS.items():
            if target in agg:
                agg[alias] = dict(agg[target], alias_of=target)
        depth[g] = {a: agg[a] for a in DEPTH_ORDER if a in agg}
    levers = {lever_name(r["spec"]):
              {"change": LEVERS.get(lever_name(r["spec"])),
               "acc_1_16": in_dist(r, train_n), "acc_17_64": beyond(r, train_n),
               "frontier": frontier(r["acc_by_position"]), "minutes": r["train_seconds"] / 60,
               "final_loss": r["final_loss"], "curriculum_lengths": r.get("curriculum_lengths"),
               "group": r["spec"]["group"], "arm": r["spec"]["arm"], "steps": r["steps"],
               "seed": r["spec"]["seed"], "acc_by_position": r["acc_by_position"]}
              for r in lever_runs}
    doc = {"command": command, "task": {
               "groups": {g: len(group_elements(g)) for g in GROUPS}, "train_n": train_n,
               "train_lengths": "n = 16; the curriculum supervises positions 1..L, L from 2 up to 16",
               "test_n": size["test_n"], "test_examples": size["test_examples"],
               "convention": "(p·q)(i) = p(q(i)); s_t = s_{t-1}·a_t; ids = lexicographic order, identity 0"},
           "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in size.items()},
           "finished_runs": {"levers": len(lever_runs), "main": len(main_runs), "depth": len(depth_runs),
                             "longer": len(longer_runs), "longer_expected": len(longer_specs(size, None)),
                             "levers_expected": len(size.get("levers", LEVERS)), "main_expected": len(main_specs(size, None)),
                             "depth_expected": len(depth_specs(size))},
           **extra, "levers": levers, "results": results,
           "results_lstm_twice_the_steps": {g: aggregate([r for r in long_runs if r["spec"]["group"] == g], ("lstm",), train_n)
                                            for g in ("A5", "S5")},
           "results_four_times_the_steps": {size["longer_group"]: with_curves(aggregate(longer_runs, ARMS, train_n),
                                                                                longer_runs)},
           "results_eight_times_the_steps": {"S5": aggregate(longest_runs(size, lever_runs), ARMS, train_n)},
           "results_annealed": {"S5": aggregate(annealed_runs(size, lever_runs), ARMS, train_n)},
           "depth": depth, "depth_summary": depth_summary(depth),
           "fixed_length": fixed_length_results(size, [g for g in GROUPS if not results.get(g)])}
    write_json(paths["json"], doc)
    written = [paths["json"], *plot_groups(doc, paths), *plot_schedules(doc, paths),
               *plot_depth_vs_time(doc, paths), *plot_curves(doc, paths)]
    return doc, written


# -----------------------------------------------------------------------------
# Figures

def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, paths, name):
    """Write the figure to paths["assets"]/name at 110 dpi and close it; returns the path."""
    fig.tight_layout()
    path = os.path.join(paths["assets"], name)
    os.makedirs(paths["assets"], exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _band(ax, r, label, color, style="-", lw=1.6):
    xs = list(range(1, 1 + len(r["mean"])))
    ax.plot(xs, r["mean"], linestyle=style, color=color, lw=lw, label=label)
    ax.fill_between(xs, [max(0.0, v) for v in r["lo"]], [min(1.0, v) for v in r["hi"]], color=color, alpha=0.2,
                    lw=0)                            # the interval, clipped to the possible accuracies


def seeds_label(r) -> str:
    """'1 seed', '3 seeds': the seeds of an aggregate (aggregate's "seeds")."""
    return f"{len(r['seeds'])} seed{'s' * (len(r['seeds']) > 1)}"


def plot_groups(doc, paths):
    """One figure, a panel per group: accuracy against position, one line per arm (mean over seeds, 95% t
    band), the training length shaded. Each group shows the recipe and the schedule that carried it: the
    annealed runs where there are some (S5), else the LSTM at twice the steps (A5); every schedule of S5 is
    in plot_schedules."""
    panels = {g: (arms, "") for g, arms in doc["results"].items() if arms}
    panels |= {g: (arms, ", fixed-length recipe") for g, arms in doc.get("fixed_length", {}).items()}
    groups = [g for g in GROUPS if g in panels]
    if not groups:
        return []
    plt, train_n = _plt(), doc["task"]["train_n"]
    cols = min(2, len(groups))
    rows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 3.8 * rows), squeeze=False)
    for ax, g in zip(axes.flat, groups):
        arms, recipe = panels[g]
        steps = doc["sizes"]["steps"]
        for arm, r in arms.items():
            _band(ax, r, f"{ARM_LABEL[arm]}, {steps:,} steps ({seeds_label(r)})", *ARM_STYLE[arm])
        annealed = doc.get("results_annealed", {}).get(g, {})
        for arm, r in annealed.items():                       # dash-dotted
            _band(ax, r, f"{ARM_LABEL[arm]}, annealed ({seeds_label(r)})", ARM_STYLE[arm][0], "-.", 2.2)
        long = doc.get("results_lstm_twice_the_steps", {}).get(g, {}).get("lstm")
        if long and not annealed:                             # the LSTM at twice the steps, dash-dotted
            _band(ax, long, f"LSTM, {2 * steps:,} steps ({seeds_label(long)})", "C2", "-.", 1.6)
        ax.axvspan(0.5, train_n + 0.5, color="grey", alpha=0.08, lw=0)
        ax.axvline(train_n + 0.5, color="black", ls=":", lw=1)
        ax.axhline(1 / doc["task"]["groups"][g], color="grey", ls="--", lw=1)
        ax.text(train_n + 1, 0.03, f"training length {train_n}", fontsize=8)
        ax.set(xlabel="position t (running product of t elements)", ylabel="accuracy of s_t",
               ylim=(-0.02, 1.02), xlim=(0.5, doc["task"]["test_n"] + 0.5),
               title=f"{g} (|G| = {doc['task']['groups'][g]}; dashed: chance{recipe})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center right")
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    return [_save(plt, fig, paths, "word_problem_groups.png")]


def plot_schedules(doc, paths):
    """The longer stage's group (S5), a panel per arm: accuracy against position under each schedule run
    on the test seeds (the recipe's steps, 2x for the LSTM, 4x, 8x, annealed; mean over seeds, 95% t band)."""
    g, steps = doc["sizes"].get("longer_group"), doc["sizes"]["steps"]
    schedules = [(f"{steps:,} steps", doc["results"].get(g, {})),
                 (f"{2 * steps:,} steps", doc.get("results_lstm_twice_the_steps", {}).get(g, {})),
                 (f"{LONGER * steps:,} steps", doc.get("results_four_times_the_steps", {}).get(g, {})),
                 (f"{LONGEST * steps:,} steps", doc.get("results_eight_times_the_steps", {}).get(g, {})),
                 (f"annealed (at most {LONGEST * steps:,} steps)", doc.get("results_annealed", {}).get(g, {}))]
    arms = [arm for arm in ARMS if any(arm in runs for _, runs in schedules)]
    if not arms:
        return []
    plt, train_n = _plt(), doc["task"]["train_n"]
    fig, axes = plt.subplots(1, len(arms), figsize=(5.2 * len(arms), 3.8), squeeze=False)
    colors = ("C7", "C8", "C0", "C1", "C3")                  # one colour per schedule, the same in every panel
    for ax, arm in zip(axes.flat, arms):
        for i, ((label, runs), color) in enumerate(zip(schedules, colors)):
            if arm in runs:
                r = runs[arm]
                minutes = sum(r["train_seconds"]) / len(r["train_seconds"]) / 60
                _band(ax, r, f"{label} ({seeds_label(r)}, {minutes:.0f} min a run)", color,
                      "--" if i == len(schedules) - 1 else "-", 2.0)   # dashed: the one below shows
        ax.axvspan(0.5, train_n + 0.5, color="grey", alpha=0.08, lw=0)
        ax.axhline(1 / doc["task"]["groups"][g], color="grey", ls="--", lw=1)
        ax.set(xlabel="position t", ylabel="accuracy of s_t", ylim=(-0.02, 1.02),
               xlim=(0.5, doc["task"]["test_n"] + 0.5), title=f"{g}: {ARM_LABEL[arm]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center right")
    return [_save(plt, fig, paths, "word_problem_schedules.png")]


def plot_curves(doc, paths):
    """The runs at four times the steps, a line per seed: the probe's accuracy past the training length
    (positions 17..64 of 128 probe words, not the test's) and the curriculum's length, against the step."""
    groups = {g: a for g, a in doc.get("results_four_times_the_steps", {}).items() if a}
    if not groups:
        return []
    plt = _plt()
    (g, arms), = groups.items()
    fig, (ax_b, ax_l) = plt.subplots(1, 2, figsize=(12, 3.8))
    for arm, r in arms.items():
        color, style, _ = ARM_STYLE[arm]
        for i, curve in enumerate(r["curves"]):
            label = f"{ARM_LABEL[arm]} ({seeds_label(r)})" if i == 0 else None
            steps = [row["step"] for row in curve]
            ax_b.plot(steps, [row.get("acc_beyond", float("nan")) for row in curve], style, color=color, lw=1.4,
                      label=label)
            ax_l.plot(steps, [row.get("length", float("nan")) for row in curve], style, color=color, lw=1.4,
                      label=label)
    train_n = doc["task"]["train_n"]
    ax_b.axhline(1 / doc["task"]["groups"][g], color="grey", ls="--", lw=1)          # chance
    ax_b.set(xlabel="training step", ylabel=f"accuracy, positions {train_n + 1}..{doc['task']['test_n']}",
             ylim=(-0.02, 1.02), title=f"{g}: past the training length while training (probe words)")
    ax_l.set(xlabel="training step", ylabel="curriculum length (positions trained)", ylim=(0, train_n + 1),
             title=f"{g}: the curriculum, {LONGER * doc['sizes']['steps']:,} steps")
    for ax in (ax_b, ax_l):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return [_save(plt, fig, paths, "word_problem_curves.png")]


def plot_depth_vs_time(doc, paths):
    """Left: what depth buys within the training length, the frontier (the last position with accuracy
    >= 0.9, n = 16) against unrolled depth, a line per state passing; right: what recurrence in time buys
    beyond it, the main arms' accuracy to n = 64. One row per depth group."""
    rows = [g for g, d in doc["depth"].items() if d]
    if not rows:
        return []
    plt = _plt()
    train_n = doc["task"]["train_n"]
    fig, axes = plt.subplots(len(rows), 2, figsize=(12, 3.8 * len(rows)), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1.5]})
    for (ax_d, ax_t), g in zip(axes, rows):
        arms = doc["depth"][g]
        for family in ("vanilla", *PASSINGS):
            points = [(unrolled_layers(a), t_interval(r["frontier"])) for a, r in arms.items()
                      if a.split("_")[0] == family]
            if points:
                xs, cis = zip(*sorted(points))
                ax_d.errorbar(xs, [c[0] for c in cis], yerr=[[c[0] - c[1] for c in cis], [c[2] - c[0] for c in cis]],
                              color=DEPTH_COLOR[family], marker="o", capsize=3, label=DEPTH_LABEL[family],
                              ls="--" if family == "mesh" else "-")
        ax_d.set(xlabel="unrolled depth (layer applications per token)", ylabel=f"{g}: frontier (position)",
                 ylim=(0, train_n + 0.5), title=f"depth: {g} within the training length (n = {train_n})")
        ax_d.set_xscale("log", base=2)
        ax_d.legend(fontsize=7)
        main, recipe = doc["results"].get(g), ""
        if not main:                                   # not run under the curriculum: the fixed-length runs
            main, recipe = doc.get("fixed_length", {}).get(g, {}), " (fixed-length recipe)"
        for arm, r in main.items():
            _band(ax_t, r, ARM_LABEL[arm], *ARM_STYLE[arm])
        ax_t.axvspan(0.5, train_n + 0.5, color="grey", alpha=0.08, lw=0)
        ax_t.axvline(train_n + 0.5, color="black", ls=":", lw=1)
        ax_t.axhline(1 / len(group_elements(g)), color="grey", ls="--", lw=1)
        ax_t.set(xlabel=f"position t (trained to {train_n}, tested to {doc['task']['test_n']})", ylim=(-0.02, 1.02),
                 title=f"time: {g} beyond the training length{recipe}")
        ax_t.legend(fontsize=7)
        for ax in (ax_d, ax_t):
            ax.grid(alpha=0.3)
    return [_save(plt, fig, paths, "word_problem_depth_vs_time.png")]


# -----------------------------------------------------------------------------

def study_paths(root=None, report_only=False):
    """Where a study reads and writes. The default root is the committed one (the runs in
    studies/results/word_problem, the figures beside them); a report of it alone goes to
    out/word_problem_report, so that reading the tables rewrites no tracked file."""
    if root is None and report_only:
        return dict(study_paths(), json="out/word_problem_report/word_problem.json",
                    assets="out/word_problem_report")
    if root is None:
        return {"runs": "studies/results/word_problem", "ckpt": "out/word_problem",
                "json": "studies/results/word_problem.json", "assets": "studies/results/word_problem"}
    return {"runs": os.path.join(root, "runs"), "ckpt": os.path.join(root, "ckpt"),
            "json": os.path.join(root, "word_problem.json"), "assets": root}


STAGES = ("levers", "main", "long", "longer", "depth")


def timing_of(size, paths, measure=True):
    """Stage 1, measured once and stored (paths["runs"]/timing.json): exact vs Jacobi training steps."""
    timing_path = os.path.join(paths["runs"], "timing.json")
    if os.path.exists(timing_path):
        return read_json(timing_path)
    if not measure:
        raise RunError(f"no {timing_path}: run the study first")
    timing = measure_step_times(size)
    write_json(timing_path, timing)
    return timing


def stage_specs(size, stage, train_mode):
    return {"levers": lambda: lever_specs(size, train_mode), "main": lambda: main_specs(size, train_mode),
            "long": lambda: long_specs(size), "longer": lambda: longer_specs(size, train_mode),
            "depth": lambda: depth_specs(size)}[stage]()


def run_locked(spec, paths, log, device):
    """run_one, unless another process holds the run's lock (then None): two study processes launched on
    one root share its runs. The lock (fcntl.flock) goes with the process, so a killed one leaves none."""
    import fcntl
    os.makedirs(paths["ckpt"], exist_ok=True)
    with open(os.path.join(paths["ckpt"], spec["name"] + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"{spec['name']}: another process trains it, skipped")
            return None
        return run_one(spec, paths, log, device)


def run_study(size, paths, command, report_only=False, stages=STAGES, log=print, group=None):
    """The stages in order (each run skipped when finished; with `group`, that group's runs alone), the
    report after each group that trained a run, and at the end. report_only: assemble what has finished,
    training nothing (the timing must exist)."""
    os.makedirs(paths["runs"], exist_ok=True)
    timing = timing_of(size, paths, measure=not report_only)
    s = timing["seconds_per_step"]
    log(f"T²MLR step: exact {s['exact'] * 1e3:.1f} ms, Jacobi D=16 b=15 {s['jacobi_D16_b15'] * 1e3:.1f} ms, "
        f"b=4 {s['jacobi_D16_b4'] * 1e3:.1f} ms -> train_mode {timing['chosen_train_mode']!r}")
    extra = {"timing": timing}
    if not report_only:
        t_start = time.time()
        for stage in stages:
            specs = [spec for spec in stage_specs(size, stage, timing["chosen_train_mode"])
                     if group in (None, spec["group"])]
            trained = False                                      # a run of this group trained here
            for i, spec in enumerate(specs):
                done_min = (time.time() - t_start) / 60
                eta = f", ETA {done_min / i * (len(specs) - i):.0f} min at the mean run so far" if i else ""
                log(f"[{stage} {i + 1}/{len(specs)}, {done_min:.1f} min{eta}]")
                trained |= not os.path.exists(run_json(paths, spec))
                run_locked(spec, paths, log, size.get("device", "cpu"))
                if trained and (i + 1 == len(specs) or spec["group"] != specs[i + 1]["group"]):
                    report(size, paths, command, extra)          # the figures after every group
                    trained = False
    return report(size, paths, command, extra)


def markdown_summary(doc) -> str:
    """The tables of studies/word_problem.md: the levers; per group and arm, accuracy (mean over seeds [95% t
    interval]) in distribution, beyond it and at positions 16..64; the depth arms' frontiers and MeSH − base."""
    fmt = lambda v: f"{v[0]:.3f} [{max(0.0, v[1]):.2f}, {min(1.0, v[2]):.2f}]"      # an accuracy
    fmt_position = lambda v: f"{v[0]:.1f} [{v[1]:.1f}, {v[2]:.1f}]"
    lines = ["| lever (one seed; the LSTM on A5 unless its name says S5 or an arm) | acc t = 1..16 | acc t = 17..64 | "
             "frontier | minutes |",
             "|---|---|---|---|---|"]
    for name, r in doc.get("levers", {}).items():
        lines.append(f"| {name} | {r['acc_1_16']:.3f} | {r['acc_17_64']:.3f} | {r['frontier']} | {r['minutes']:.1f} |")
    lines += ["", "| group | arm | params | seeds | acc t = 1..16 | acc t = 17..64 | t = 16 | t = 32 | t = 64 | "
              "minutes |", "|---|---|---|---|---|---|---|---|---|---|"]
    rows = [(g, ARM_LABEL[arm], r) for g, arms in doc["results"].items() for arm, r in arms.items()]
    rows += [(g, "LSTM, twice the steps", r["lstm"]) for g, r in doc.get("results_lstm_twice_the_steps", {}).items()
             if r]
    rows += [(g, f"{ARM_LABEL[arm]}, four times the steps", r)
             for g, arms in doc.get("results_four_times_the_steps", {}).items() for arm, r in arms.items()]
    rows += [(g, f"{ARM_LABEL[arm]}, eight times the steps", r)
             for g, arms in doc.get("results_eight_times_the_steps", {}).items() for arm, r in arms.items()]
    rows += [(g, f"{ARM_LABEL[arm]}, annealed once the curriculum is complete", r)
             for g, arms in doc.get("results_annealed", {}).items() for arm, r in arms.items()]
    for g, label, r in rows:
        s = r["summary"]
        lines.append(f"| {g} | {label} | {r['params'][0]:,} | {len(r['seeds'])} | "
                     + " | ".join(fmt(s[k]) if k in s else "–" for k in
                                  ("in_dist_mean_1_16", "beyond_mean_17_64", "pos_16", "pos_32", "pos_64"))
                     + f" | {sum(r['train_seconds']) / len(r['train_seconds']) / 60:.1f} |")
    for g, arms in doc["depth"].items():
        if not arms:
            continue
        summary = doc["depth_summary"][g]
        lines += ["", f"Depth arms, {g}, n = 16 (frontier: the last position with accuracy >= 0.9):", "",
                  "| arm | unrolled layers | params | seeds | frontier | acc t = 1..16 |", "|---|---|---|---|---|---|"]
        for arm, r in arms.items():
            lines.append(f"| {arm}{' (= ' + r['alias_of'] + ')' if 'alias_of' in r else ''} | {unrolled_layers(arm)} | "
                         f"{r['params'][0]:,} | {len(r['seeds'])} | {fmt_position(summary['frontier'][arm])} | "
                         f"{fmt(r['summary']['in_dist_mean_1_16'])} |")
        diffs = [f"K = {k[1:]}: {d[0]:+.2f} [{d[1]:+.2f}, {d[2]:+.2f}] ({d[3]} seed{'s' * (d[3] > 1)})"
                 for k, d in summary["mesh_minus_base"].items() if d]
        if diffs:
            lines += ["", "MeSH − base frontier, paired by seed: " + "; ".join(diffs)]
    return "\n".join(lines)


def unrolled_layers(arm) -> int:
    """Layer applications per token of a depth arm (GPTConfig.n_unrolled of its shape)."""
    shape, passing = DEPTH_ARMS[DEPTH_ALIAS.get(arm, arm)]
    if passing is None:
        return shape
    return GPTConfig(vocab_size=6, block_size=16, n_embd=16, n_head=1, flavour="llama", mlp_hidden=16,
                     layout=shape, state_passing=passing).n_unrolled


def single_run(args, size):
    """One arm, group and seed under the recipe (args.steps, args.anneal: its steps and annealed schedule
    instead) into args.out: result.json (acc_by_position, the recipe, the steps, the seconds) and ckpt.pt
    while it trains; resumable as the study's runs are."""
    timing = {"chosen_train_mode": "exact"}                 # the study measures it; exact is its choice on CPU
    spec = arm_spec(size, args.group, args.arm, args.seed, timing["chosen_train_mode"], stage="run",
                    steps=args.steps, anneal=args.anneal)
    out_json = os.path.join(args.out, "result.json")
    r = run_one(spec, None, device=size.get("device", "cpu"), out_json=out_json, ckpt_dir=args.out)
    print(f"{args.arm} on {args.group}, seed {args.seed}: accuracy t = 1..{size['train_n']} "
          f"{in_dist(r, size['train_n']):.3f}, t = {size['train_n'] + 1}..{size['test_n']} "
          f"{beyond(r, size['train_n']):.3f}, frontier {frontier(r['acc_by_position'])}, "
          f"{r['train_seconds'] / 60:.1f} min; wrote {out_json}")
    return r


class _Parser(argparse.ArgumentParser):
    def error(self, message):               # one line, as every other bad input
        raise RunError(f"{message} (python -m studies.word_problem --help)")


def parse_args(argv):
    p = _Parser(prog="python -m studies.word_problem", description="The word problem of a group.")
    p.add_argument("--quick", action="store_true", help="every stage at toy size, into out/word_problem_quick")
    p.add_argument("--gpu", action="store_true", help="the GPU config, into out/word_problem_gpu")
    p.add_argument("--report", action="store_true", help="the JSON and figures from the finished runs")
    p.add_argument("--root", help="the study's folder (default: studies/results/word_problem)")
    p.add_argument("--stage", choices=STAGES, action="append", help="run only this stage (repeatable)")
    p.add_argument("--group", choices=GROUPS, help="one run: the group; without --arm: the stages' runs of it")
    p.add_argument("--arm", choices=ARMS, help="one run: the arm")
    p.add_argument("--seed", type=int, default=0, help="one run: the seed (default 0)")
    p.add_argument("--out", help="one run: its folder (result.json, ckpt.pt)")
    p.add_argument("--steps", type=int, help="one run: its steps (default: the recipe's)")
    p.add_argument("--anneal", type=int, help="one run: the annealed schedule, this many steps of decay once "
                                              "the curriculum is complete (default: the recipe's cosine)")
    args = p.parse_args(argv)
    one = (args.group, args.arm, args.out)
    if (args.arm or args.out or args.steps or args.anneal) and not all(one):
        raise RunError("one run needs --group, --arm and --out (and optionally --seed, --steps, --anneal)")
    for name in ("steps", "anneal"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise RunError(f"--{name} {getattr(args, name)}: give a number of steps >= 1")
    if args.quick and args.gpu:
        raise RunError("--quick and --gpu are two sizes: give one")
    return args


@keeps_process_state
def main(argv):
    args = parse_args(argv)
    size = QUICK if args.quick else GPU if args.gpu else FULL
    if args.out:
        return single_run(args, size)
    root = args.root or ("out/word_problem_quick" if args.quick else "out/word_problem_gpu" if args.gpu else None)
    threads = os.environ.get("OMP_NUM_THREADS")
    command = " ".join(([f"OMP_NUM_THREADS={threads}"] if threads else []) + ["python -m studies.word_problem", *argv])
    doc, written = run_study(size, study_paths(root, args.report), command, args.report,
                             tuple(args.stage or STAGES), group=args.group)
    print("wrote " + ", ".join(written))
    print(markdown_summary(doc))


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    try:
        main(sys.argv[1:])
    except RunError as e:
        sys.exit(f"error: {e}")


# -----------------------------------------------------------------------------
# How fast the gate opens: θ_r against steps for both initialisations and gate LR multipliers

def theta_trajectories(group="S3", steps=300, lr=3e-3, seed=100, every=25, log=print):
    """T²MLR on `group` (the study's FULL size, exact training, the chosen lr; seed 100 is the pilot's, not a
    test seed) trained `steps` steps in four settings: init ours / the T²MLR code's, gate_lr_multiplier 1 / 10,
    through support/loop.py's optimizer step. Returns {setting: {"step": [...], "theta_r": [...], "accuracy":
    in-distribution accuracy at the end}}. The same batches for every setting (batch_seed); no checkpoints."""
    table, out = multiplication_table(group), {}
    for init in ("mesh", "normal_0.02"):
        for m in (1.0, 10.0):
            torch.manual_seed(seed)
            model = build(matched_arms(FIXED_LENGTH, group, init_t2mlr=init)["t2mlr"]).train()
            cfg = TrainConfig(max_iters=steps, learning_rate=lr, min_lr=lr / 100, warmup_iters=max(1, steps // 20),
                              weight_decay=0.01, gate_lr_multiplier=m)
            trainer = make_trainer(model, cfg, "cpu", torch.float32, ckpt_path="(not saved)")
            row = {"step": [], "theta_r": []}
            for step in range(steps):
                x, y = make_batch(table, FIXED_LENGTH["batch_size"], FIXED_LENGTH["train_n"],
                                  batch_seed(group, seed, step))
                optimizer_step(trainer, step, 1, lambda model, micro: step_loss(model, x, y, "exact"))
                if step % every == 0 or step == steps - 1:
                    row["step"].append(step)
                    row["theta_r"].append(model.gate.theta_r.item())
            acc = accuracy_by_position(model, table, FIXED_LENGTH["train_n"], 128, PROBE_SEED)
            row["accuracy"] = sum(acc) / len(acc)
            out[f"init {init}, gate lr x{m:g}"] = row
            log(f"{group} init {init}, gate lr x{m:g}: θ_r {row['theta_r'][-1]:.3f} at step {steps - 1}, "
                f"in-distribution accuracy {row['accuracy']:.3f}")
    return out
