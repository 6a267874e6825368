"""
The word problem of a group: the demonstration that recurrence in time carries a state past the training
length, and what depth does within it (issue 21, section 1).

The input is a_1 … a_n, elements of a finite group G (one token each); the target at EVERY position t is
the running product s_t = a_1 · a_2 · … · a_t. The groups are permutation groups: Z2 (parity, as the
permutations of 2 points), S3, A5 (the even permutations of 5 points: the smallest non-solvable group) and
S5. A permutation p of {0..k-1} is the tuple of its images, p[i] = p(i); the product is composition as
functions, RIGHT factor first:

    (p · q)(i) = p(q(i)),   so  s_t = s_{t-1} · a_t  and  s_t(i) = a_1(a_2(… a_t(i) …)).

Token ids: the elements in lexicographic order of their tuples (the identity is id 0); inputs and targets
share the vocabulary of |G| ids. Training: n = 16 fixed (every prefix 1..16 is a training position, since
each position is trained on its own running product); test: every position 1..64 of sequences of n = 64.
A recurrent state needs one step per token whatever n; a fixed-depth transformer must compose t elements in
its layers (about 2^L in L layers; NC¹-complete for A5 and S5), so beyond n = 16 it should fail and
T²MLR should not.

    python -m studies.word_problem            # the whole study (~80 min on one CPU thread), resumable
    python -m studies.word_problem --report   # figures + JSON from the per-run results finished so far
    python -m studies.word_problem --quick    # end to end at toy size, into out/word_problem_quick
    python -m studies.word_problem --gpu      # A5 and S5 at a GPU's budget, into out/word_problem_gpu

Stages, each run writing studies/results/word_problem/<run>.json when it finishes (skipped on relaunch;
an unfinished run continues from out/word_problem/<run>/ckpt.pt):
 1. timing: one T²MLR training step with mode="exact" vs Jacobi D = T = 16 (b = 15: gradient-exact;
    b = 4 as a reference), side by side; the cheaper gradient-exact one trains T²MLR;
 2. pilot (S3, one seed outside the test seeds, 500 steps): learning rate {1e-3, 3e-3} for every arm,
    then weight_init {"mesh", "reference" with embed_scale=False} for the two GPT arms at their LR;
    chosen by in-distribution accuracy, then training loss;
 3. main: transformer (NoPE), T²MLR (layers 1..2 of 4 recurrent in time), LSTM, parameter-matched,
    groups Z2, S3, A5, S5, seeds 0, 1, 2, the same batches (seeded by group, seed, step), steps, schedule;
 4. depth (S3 and Z2; n = 16): vanilla 3 layers, base recursion and MeSH "1+1RK+1" for K = 1, 2, 4
    (base K = 1 IS the vanilla 3-layer stack, the same function and initialisation: trained once), and a
    vanilla stack of 6 layers, the unrolled depth of K = 4.
The trainer, schedule, checkpoints and resume are support/loop.py's, as for the S5 study.
"""

import itertools
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch

from model import GPT, GPTConfig
from studies.s5_retrieval import LSTMLM, lstm_hidden_for
from support.checkpoints import load_checkpoint, rng_states
from support.loop import make_trainer, optimizer_step, resume, run_steps, save_state
from support.runtime import RunError

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


def batch_seed(group: str, seed: int, step: int) -> int:
    """The seed of training batch `step`: the same for every arm (same batches), a resumed run the same."""
    return (GROUPS.index(group) + 1) * 10_000_000_019 + seed * 1_000_003 + step


TEST_SEED, PROBE_SEED = 777_000, 888_000      # the fixed test set (n = 64) and the quick in-training probe


# -----------------------------------------------------------------------------
# The study's sizes (one CPU thread, ~80 minutes in all; QUICK: seconds)

@dataclass
class RunConfig:
    """What support/loop.py reads from a train config, plus the batch and the seed."""
    max_iters: int = 2000
    learning_rate: float = 1e-3
    min_lr: float = 1e-5
    warmup_iters: int = 100
    lr_decay_iters: Optional[int] = None
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_interval: int = 500
    batch_size: int = 32
    seed: int = 0


FULL = dict(steps=2000, pilot_steps=500, batch_size=32, train_n=16, test_n=64, test_examples=512,
            seeds=(0, 1, 2), pilot_seed=100, groups=GROUPS, depth_groups=("S3", "Z2"), pilot_group="S3",
            n_embd=64, n_layer=4, n_head=4, mlp_hidden=256, lstm_layers=2, lrs=(1e-3, 3e-3),
            eval_interval=500, timing_steps=8)
QUICK = dict(FULL, steps=12, pilot_steps=6, batch_size=8, test_examples=32, seeds=(0, 1), groups=("S3",),
             depth_groups=("S3",), pilot_group="S3", n_embd=32, mlp_hidden=64, lrs=(1e-3, 3e-3),
             eval_interval=6, timing_steps=1)
# A GPU config for the groups the CPU budget does not learn (A5, S5; see docs/word_problem.md): wider models,
# 10x the steps, 8x the batch. Not run here (no GPU in this session); python -m studies.word_problem --gpu
GPU = dict(FULL, steps=20000, pilot_steps=2000, batch_size=256, groups=("A5", "S5"), depth_groups=("A5",),
           pilot_group="A5", n_embd=128, mlp_hidden=512, eval_interval=2000, timing_steps=20, device="cuda")

ARMS = ("transformer", "t2mlr", "lstm")
ARM_STYLE = {"transformer": ("C0", "-", 1.6), "t2mlr": ("C3", "-", 3.5), "lstm": ("C2", "--", 1.6)}  # T²MLR
# thick under the LSTM's dashes: where both are at 1.0 both stay visible
ARM_LABEL = {"transformer": "transformer (NoPE)", "t2mlr": "T²MLR (layers 1..2 in time)", "lstm": "LSTM"}
# the depth arm: name -> (layout or n_layer, state_passing)
DEPTH_ARMS = {"vanilla_L3": (3, None), "base_K2": ("1+1R2+1", "base"), "base_K4": ("1+1R4+1", "base"),
              "mesh_K1": ("1+1R1+1", "mesh"), "mesh_K2": ("1+1R2+1", "mesh"), "mesh_K4": ("1+1R4+1", "mesh"),
              "vanilla_L6": (6, None)}
DEPTH_ALIAS = {"base_K1": "vanilla_L3"}       # "1+1R1+1" with base passing is the 3-layer stack itself
DEPTH_ORDER = ("vanilla_L3", "base_K1", "base_K2", "base_K4", "mesh_K1", "mesh_K2", "mesh_K4", "vanilla_L6")
DEPTH_COLOR = {"vanilla_L3": "C0", "mesh_K1": "C0", "base_K2": "C2", "mesh_K2": "C2", "base_K4": "C3",
               "mesh_K4": "C3", "vanilla_L6": "black"}
DEPTH_LABEL = {"vanilla_L3": "vanilla 3 layers", "base_K1": "base 1+1R1+1 (= vanilla 3)",
               "base_K2": "base 1+1R2+1", "base_K4": "base 1+1R4+1", "mesh_K1": "MeSH 1+1R1+1",
               "mesh_K2": "MeSH 1+1R2+1", "mesh_K4": "MeSH 1+1R4+1", "vanilla_L6": "vanilla 6 layers"}


def gpt_config(size, group, **fields) -> dict:
    """The GPTConfig fields of a tiny NoPE LLaMA-style model for `group` (the S5 configs' flavour)."""
    return dict(flavour="llama", vocab_size=len(group_elements(group)), block_size=size["test_n"],
                n_layer=size["n_layer"], n_embd=size["n_embd"], n_head=size["n_head"], n_kv_head=size["n_head"],
                mlp_hidden=size["mlp_hidden"], tie_embeddings=False, rope_pct=0.0) | fields


def t2mlr_fields(init: str) -> dict:
    """T²MLR on the middle layers 1..2 of 4, the S5 configs' gate and state update; init "mesh" (ours) or
    "reference" (every weight N(0, 0.02²), embeddings unscaled: the T²MLR reference's)."""
    return dict(t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=16, jacobi_grad_sweeps=15,
                recurrent_residual=True, recurrent_detach=True, gate_bias_prob=0.5, gate_weight_gain=1.0,
                **init_fields(init))


def init_fields(init: str) -> dict:
    return dict(weight_init="reference", embed_scale=False) if init == "reference" else {}


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

def step_loss(model, x, y, train_mode):
    """The training loss; T²MLR with train_mode "exact" runs token by token with autograd."""
    if getattr(model, "gate", None) is not None:
        return model(x, y, mode=train_mode)[1]
    return model(x, y)[1]


@torch.no_grad()
def accuracy_by_position(model, table, n, examples, seed, batch=256):
    """Accuracy of argmax predictions at each position 1..n (a list of n floats) on `examples` fixed words
    of length n; T²MLR in eval mode runs the exact recurrence."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    words, states = (t.to(device) for t in make_batch(table, examples, n, seed))
    right = torch.zeros(n, device=device)
    for i in range(0, examples, batch):
        logits, _ = model(words[i:i + batch])
        right += (logits.argmax(-1) == states[i:i + batch]).float().sum(0)
    model.train(was)
    return (right / examples).cpu().tolist()


def run_one(spec, paths, log=print, device="cpu"):
    """Train and evaluate the run `spec` (a dict: name, group, seed, model, train, train_mode, sizes), or
    return its finished results. Resumable: a finished run (its JSON) is returned as is; an unfinished one
    continues from its checkpoint. A JSON or checkpoint made with another spec is refused (RunError)."""
    out_json = os.path.join(paths["runs"], spec["name"] + ".json")
    if os.path.exists(out_json):
        with open(out_json) as f:
            done = json.load(f)
        if done["spec"] != spec:
            raise RunError(f"{out_json} was made with another spec; delete it (and its checkpoint) to rerun")
        return done
    ckpt_dir = os.path.join(paths["ckpt"], spec["name"])
    ckpt_path = os.path.join(ckpt_dir, "ckpt.pt")
    cfg = RunConfig(**spec["train"])
    table = multiplication_table(spec["group"])
    torch.manual_seed(cfg.seed)
    model = build(spec["model"]).to(device)
    trainer = make_trainer(model, cfg, device, torch.float32, ckpt_path)
    start, state = 0, {"seconds": 0.0, "curve": []}
    if os.path.exists(ckpt_path):
        ckpt = load_checkpoint(ckpt_path)
        if json.loads(ckpt["spec"]) != spec:
            raise RunError(f"{ckpt_path} was made with another spec; delete it to rerun")
        start = resume(trainer, ckpt, ckpt_path)
        state = json.loads(ckpt["state"])
    os.makedirs(ckpt_dir, exist_ok=True)
    n_params = count_params(model)
    log(f"{spec['name']}: {n_params:,} parameters, steps {start}..{cfg.max_iters}")
    losses = []

    def train_step(step):
        x, y = (t.to(device) for t in
                make_batch(table, cfg.batch_size, spec["train_n"], batch_seed(spec["group"], cfg.seed, step)))
        loss, _, _ = optimizer_step(trainer, step, 1, lambda m, _: step_loss(m, x, y, spec["train_mode"]))
        losses.append(loss.item())

    def evaluate_and_save(step):
        acc = accuracy_by_position(model, table, spec["train_n"], 128, PROBE_SEED)
        state["seconds"] = time.time() - t0
        row = {"step": step, "acc_in": sum(acc) / len(acc)}
        if losses:
            row["loss"] = sum(losses) / len(losses)
            losses.clear()
        if getattr(model, "gate", None) is not None:
            row["theta_r"] = model.gate.theta_r.item()
        state["curve"].append(row)
        log(f"  step {step}: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k != "step")
            + f", {state['seconds']:.0f} s")
        save_state(trainer, step, [rng_states()], spec=json.dumps(spec), state=json.dumps(state))

    model.train()
    t0 = time.time() - state["seconds"]
    run_steps(cfg, start, start, train_step, evaluate_and_save)
    acc = accuracy_by_position(model, table, spec["test_n"], spec["test_examples"], TEST_SEED)
    results = {"spec": spec, "params": n_params, "train_seconds": state["seconds"],
               "acc_by_position": acc, "curve": state["curve"],
               "final_loss": next((r["loss"] for r in reversed(state["curve"]) if "loss" in r), None)}
    if getattr(model, "gate", None) is not None:
        results["theta_r"], results["theta_x"] = model.gate.theta_r.item(), model.gate.theta_x.item()
    os.makedirs(paths["runs"], exist_ok=True)
    with open(out_json + ".tmp", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(out_json + ".tmp", out_json)
    return results


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

def train_spec(size, lr, seed, steps):
    return asdict(RunConfig(max_iters=steps, learning_rate=lr, min_lr=lr / 100, warmup_iters=max(1, steps // 20),
                            eval_interval=min(size["eval_interval"], steps), batch_size=size["batch_size"],
                            seed=seed))


def spec_of(size, stage, group, arm, seed, model, lr, train_mode, steps=None, tag=""):
    return {"name": f"{stage}_{group}_{arm}{tag}_s{seed}", "stage": stage, "group": group, "arm": arm,
            "seed": seed, "model": model, "train": train_spec(size, lr, seed, steps or size["steps"]),
            "train_mode": train_mode if arm == "t2mlr" else None, "train_n": size["train_n"],
            "test_n": size["test_n"] if stage != "pilot" else size["train_n"],
            "test_examples": size["test_examples"]}


def in_dist(r, train_n):
    return sum(r["acc_by_position"][:train_n]) / train_n


def pilot(size, paths, train_mode, log=print):
    """Stage 2: the learning rate of every arm (the same candidates), then the GPT arms' initialisation."""
    g, seed, steps, device = size["pilot_group"], size["pilot_seed"], size["pilot_steps"], size.get("device", "cpu")
    key = lambda r: (-round(in_dist(r, size["train_n"]), 2), r["final_loss"])   # accuracy, then loss

    def trial(arm, lr, init):
        model = matched_arms(size, g, init, init)[arm]
        tag = f"_lr{lr:g}" + (f"_{init}" if arm != "lstm" else "")
        r = run_one(spec_of(size, "pilot", g, arm, seed, model, lr, train_mode, steps, tag), paths, log, device)
        row = {"arm": arm, "lr": lr, "init": init if arm != "lstm" else None,
               "acc_in": in_dist(r, size["train_n"]), "final_loss": r["final_loss"]}
        if row not in tried:
            tried.append(row)
        return r

    tried, chosen = [], {}
    for arm in ARMS:
        runs = [(lr, trial(arm, lr, "mesh")) for lr in size["lrs"]]
        chosen[arm] = {"lr": min(runs, key=lambda p: key(p[1]))[0], "init": "mesh" if arm != "lstm" else None}
    for arm in ("transformer", "t2mlr"):
        runs = [(init, trial(arm, chosen[arm]["lr"], init)) for init in ("mesh", "reference")]
        chosen[arm]["init"] = min(runs, key=lambda p: key(p[1]))[0]
    return {"group": g, "seed": seed, "steps": steps, "tried": tried, "chosen": chosen,
            "rule": "highest in-distribution accuracy (rounded to 0.01), then lowest final training loss"}


def main_specs(size, chosen, train_mode, seeds=None):
    specs = []
    for seed in seeds or size["seeds"]:
        for g in size["groups"]:
            arms = matched_arms(size, g, chosen["t2mlr"]["init"], chosen["transformer"]["init"])
            specs += [spec_of(size, "main", g, arm, seed, arms[arm], chosen[arm]["lr"], train_mode) for arm in ARMS]
    return specs


def depth_specs(size, chosen, seeds=None):
    specs = []
    lr, init = chosen["transformer"]["lr"], chosen["transformer"]["init"]
    for seed in seeds or size["seeds"]:
        for g in size["depth_groups"]:
            for arm, (shape, passing) in DEPTH_ARMS.items():
                fields = {"n_layer": shape} if passing is None else {"layout": shape, "state_passing": passing}
                model = {"kind": "gpt", "config": gpt_config(size, g, **init_fields(init)) | fields}
                specs.append(spec_of(size, "depth", g, arm, seed, model, lr, None) | {"test_n": size["train_n"]})
    return specs


def t_interval(values):
    """(mean, low, high): the 95% Student-t interval of the mean (low = high = mean for one value)."""
    from scipy import stats
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def aggregate(runs, arms, train_n, test_n):
    """{arm: {"seeds", "params", "mean", "lo", "hi" (per position), "summary"}} over the runs found."""
    out = {}
    for arm in arms:
        rs = [r for r in runs if r["spec"]["arm"] == arm]
        if not rs:
            continue
        n = min(len(r["acc_by_position"]) for r in rs)
        cols = [t_interval([r["acc_by_position"][t] for r in rs]) for t in range(n)]
        summary = {"in_dist_mean_1_16": t_interval([sum(r["acc_by_position"][:train_n]) / train_n for r in rs])}
        for t in sorted({train_n, 2 * train_n, 3 * train_n, 4 * train_n}):
            if t <= n:
                summary[f"pos_{t}"] = cols[t - 1]
        if n > train_n:
            summary[f"beyond_mean_{train_n + 1}_{n}"] = t_interval(
                [sum(r["acc_by_position"][train_n:n]) / (n - train_n) for r in rs])
        out[arm] = {"seeds": [r["spec"]["seed"] for r in rs], "params": sorted({r["params"] for r in rs}),
                    "mean": [c[0] for c in cols], "lo": [c[1] for c in cols], "hi": [c[2] for c in cols],
                    "summary": summary, "train_seconds": [r["train_seconds"] for r in rs],
                    "final_loss": [r["final_loss"] for r in rs]}
        if "theta_r" in rs[0]:
            out[arm]["theta_r"] = [r["theta_r"] for r in rs]
    return out


def load_runs(paths, stage):
    runs = []
    if os.path.isdir(paths["runs"]):
        for name in sorted(os.listdir(paths["runs"])):
            if name.startswith(stage + "_") and name.endswith(".json"):
                with open(os.path.join(paths["runs"], name)) as f:
                    runs.append(json.load(f))
    return runs


def report(size, paths, command, extra):
    """Assemble the JSON and the figures from the per-run results finished so far."""
    main_runs, depth_runs = load_runs(paths, "main"), load_runs(paths, "depth")
    results = {g: aggregate([r for r in main_runs if r["spec"]["group"] == g], ARMS, size["train_n"],
                            size["test_n"]) for g in size["groups"]}
    depth = {}
    for g in size["depth_groups"]:
        agg = aggregate([r for r in depth_runs if r["spec"]["group"] == g], DEPTH_ARMS, size["train_n"],
                        size["train_n"])
        for alias, target in DEPTH_ALIAS.items():
            if target in agg:
                agg[alias] = dict(agg[target], alias_of=target)
        depth[g] = {a: agg[a] for a in DEPTH_ORDER if a in agg}
    expected = len(main_specs(size, extra["pilot"]["chosen"], extra["timing"]["chosen_train_mode"])) \
        if "pilot" in extra else None
    doc = {"command": command, "task": {
               "groups": {g: len(group_elements(g)) for g in size["groups"]}, "train_n": size["train_n"],
               "train_lengths": "fixed n = 16 (every position 1..16 trained on its running product)",
               "test_n": size["test_n"], "test_examples": size["test_examples"],
               "convention": "(p·q)(i) = p(q(i)); s_t = s_{t-1}·a_t; ids = lexicographic order, identity 0"},
           "sizes": {k: list(v) if isinstance(v, tuple) else v for k, v in size.items()},
           "finished_runs": {"main": len(main_runs), "depth": len(depth_runs), "main_expected": expected,
                             "depth_expected": len(depth_specs(size, extra["pilot"]["chosen"]))
                             if "pilot" in extra else None},
           **extra, "results": results, "depth": depth}
    os.makedirs(os.path.dirname(paths["json"]) or ".", exist_ok=True)
    with open(paths["json"] + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(paths["json"] + ".tmp", paths["json"])
    written = [paths["json"]] + plot_groups(doc, paths) + plot_depth_vs_time(doc, paths)
    return doc, written


# -----------------------------------------------------------------------------
# Figures

def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _band(ax, r, label, color, style="-", lw=1.6):
    xs = list(range(1, 1 + len(r["mean"])))
    ax.plot(xs, r["mean"], style, color=color, lw=lw, label=label)
    ax.fill_between(xs, [max(0.0, v) for v in r["lo"]], [min(1.0, v) for v in r["hi"]], color=color, alpha=0.2,
                    lw=0)                            # the interval, clipped to the possible accuracies


def plot_groups(doc, paths):
    """One figure per group: accuracy against position, one line per arm (mean over seeds, 95% t band)."""
    plt, written = _plt(), []
    train_n = doc["task"]["train_n"]
    for g, arms in doc["results"].items():
        if not arms:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.6))
        for arm, r in arms.items():
            seeds = len(r["seeds"])
            _band(ax, r, f"{ARM_LABEL[arm]}, {r['params'][0]:,} params ({seeds} seed{'s' * (seeds > 1)})",
                  *ARM_STYLE[arm])
        ax.axvspan(0.5, train_n + 0.5, color="grey", alpha=0.08, lw=0)
        ax.axvline(train_n + 0.5, color="black", ls=":", lw=1)
        ax.axhline(1 / doc["task"]["groups"][g], color="grey", ls="--", lw=1)
        ax.text(train_n + 1, 0.03, f"training length {train_n}", fontsize=8)
        ax.set(xlabel="position t (running product of t elements)", ylabel="accuracy of s_t",
               ylim=(-0.02, 1.02), xlim=(0.5, doc["task"]["test_n"] + 0.5),
               title=f"The word problem of {g} (|G| = {doc['task']['groups'][g]}; dashed: chance)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
        fig.tight_layout()
        path = os.path.join(paths["assets"], f"word_problem_{g}.png")
        os.makedirs(paths["assets"], exist_ok=True)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def plot_depth_vs_time(doc, paths):
    """Left: depth within the training length (the depth arm at n = 16); right: recurrence in time beyond it
    (the main arms to n = 64), one row per depth group."""
    rows = [g for g, d in doc["depth"].items() if d]
    if not rows:
        return []
    plt = _plt()
    train_n = doc["task"]["train_n"]
    fig, axes = plt.subplots(len(rows), 2, figsize=(12, 3.6 * len(rows)), squeeze=False,
                             gridspec_kw={"width_ratios": [1, 1.6]})
    for (ax_d, ax_t), g in zip(axes, rows):
        for arm, r in doc["depth"][g].items():
            if "alias_of" not in r:          # colour by unrolled depth, MeSH dashed
                _band(ax_d, r, DEPTH_LABEL[arm] + (" (= base K=1)" if arm == "vanilla_L3" else ""),
                      DEPTH_COLOR[arm], "--" if arm.startswith("mesh") else "-")
        ax_d.set(xlabel="position t (n = 16, in distribution)", ylabel=f"{g}: accuracy of s_t",
                 ylim=(-0.02, 1.02), title=f"depth: {g} within the training length")
        ax_d.axhline(1 / len(group_elements(g)), color="grey", ls="--", lw=1)
        ax_d.legend(fontsize=7)
        for arm, r in doc["results"].get(g, {}).items():
            _band(ax_t, r, ARM_LABEL[arm], *ARM_STYLE[arm])
        ax_t.axvspan(0.5, train_n + 0.5, color="grey", alpha=0.08, lw=0)
        ax_t.axvline(train_n + 0.5, color="black", ls=":", lw=1)
        ax_t.text(train_n + 1, 0.03, f"training length {train_n}", fontsize=8)
        ax_t.axhline(1 / len(group_elements(g)), color="grey", ls="--", lw=1)
        ax_t.set(xlabel="position t (trained to 16, tested to 64)", ylim=(-0.02, 1.02),
                 title=f"time: {g} beyond the training length")
        ax_t.legend(fontsize=7)
        for ax in (ax_d, ax_t):
            ax.grid(alpha=0.3)
    fig.tight_layout()
    path = os.path.join(paths["assets"], "word_problem_depth_vs_time.png")
    os.makedirs(paths["assets"], exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [path]


# -----------------------------------------------------------------------------

def study_paths(root=None):
    if root is None:
        return {"runs": "studies/results/word_problem", "ckpt": "out/word_problem",
                "json": "studies/results/word_problem.json", "assets": "assets"}
    return {"runs": os.path.join(root, "runs"), "ckpt": os.path.join(root, "ckpt"),
            "json": os.path.join(root, "word_problem.json"), "assets": root}


def run_study(size, paths, command, report_only=False, log=print):
    """Every stage in order (each run skipped when finished), then the report. report_only: assemble what
    has finished, training nothing (the timing and pilot must exist)."""
    os.makedirs(paths["runs"], exist_ok=True)
    timing_path = os.path.join(paths["runs"], "timing.json")
    if os.path.exists(timing_path):
        with open(timing_path) as f:
            timing = json.load(f)
    elif report_only:
        raise RunError(f"no {timing_path}: run the study first")
    else:
        timing = measure_step_times(size)
        with open(timing_path, "w") as f:
            json.dump(timing, f, indent=1)
    s = timing["seconds_per_step"]
    log(f"T²MLR step: exact {s['exact'] * 1e3:.1f} ms, Jacobi D=16 b=15 {s['jacobi_D16_b15'] * 1e3:.1f} ms, "
        f"b=4 {s['jacobi_D16_b4'] * 1e3:.1f} ms -> train_mode {timing['chosen_train_mode']!r}")
    mode = timing["chosen_train_mode"]
    if report_only:
        pilot_doc = pilot(size, paths, mode, log=lambda *_: None) if _pilot_done(size, paths) else None
        if pilot_doc is None:
            raise RunError("the pilot has not finished: run the study first")
    else:
        pilot_doc = pilot(size, paths, mode, log)
    log(f"pilot chose {pilot_doc['chosen']}")
    extra = {"timing": timing, "pilot": pilot_doc}
    if not report_only:
        # seed by seed, the main runs then the depth runs: a stopped study has balanced partial results
        specs = [[*main_specs(size, pilot_doc["chosen"], mode, [seed]), *depth_specs(size, pilot_doc["chosen"], [seed])]
                 for seed in size["seeds"]]
        t_start, total, i = time.time(), sum(map(len, specs)), 0
        for seed_specs in specs:
            for spec in seed_specs:
                i += 1
                log(f"[{i}/{total}, {(time.time() - t_start) / 60:.1f} min]")
                run_one(spec, paths, log, size.get("device", "cpu"))
            report(size, paths, command, extra)           # the figures after every seed, for the impatient
    return report(size, paths, command, extra)


def _pilot_done(size, paths):
    n = len(ARMS) * len(size["lrs"]) + 2
    return len(load_runs(paths, "pilot")) >= n


def markdown_summary(doc) -> str:
    """The tables of docs/word_problem.md: per group and arm, accuracy (mean over seeds [95% t interval]) in
    distribution and at positions 32, 48, 64; the depth arm at positions 4, 8, 16 and over 1..16."""
    fmt = lambda v: f"{v[0]:.3f} [{max(0.0, v[1]):.2f}, {min(1.0, v[2]):.2f}]"
    lines = ["| group | arm | params | seeds | mean acc, t = 1..16 | t = 16 | t = 32 | t = 48 | t = 64 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g, arms in doc["results"].items():
        for arm, r in arms.items():
            s = r["summary"]
            lines.append(f"| {g} | {ARM_LABEL[arm]} | {r['params'][0]:,} | {len(r['seeds'])} | "
                         + " | ".join(fmt(s[k]) if k in s else "–" for k in
                                      ("in_dist_mean_1_16", "pos_16", "pos_32", "pos_48", "pos_64")) + " |")
    for g, arms in doc["depth"].items():
        if not arms:
            continue
        lines += ["", f"Depth arm, {g}, n = 16:", "",
                  "| arm | unrolled layers | params | seeds | mean acc, t = 1..16 | t = 4 | t = 8 | t = 16 |",
                  "|---|---|---|---|---|---|---|---|"]
        for arm, r in arms.items():
            s, m, lo, hi = r["summary"], r["mean"], r["lo"], r["hi"]
            at = lambda t: fmt((m[t - 1], lo[t - 1], hi[t - 1]))
            lines.append(f"| {DEPTH_LABEL[arm]} | {unrolled_layers(arm)} | {r['params'][0]:,} | {len(r['seeds'])} | "
                         f"{fmt(s['in_dist_mean_1_16'])} | {at(4)} | {at(8)} | {at(16)} |")
    return "\n".join(lines)


def unrolled_layers(arm) -> int:
    """Layer applications per token of a depth arm (GPTConfig.n_unrolled of its shape)."""
    shape, passing = DEPTH_ARMS[DEPTH_ALIAS.get(arm, arm)]
    if passing is None:
        return shape
    return GPTConfig(vocab_size=6, block_size=16, n_embd=16, n_head=1, flavour="llama", mlp_hidden=16,
                     layout=shape, state_passing=passing).n_unrolled


def main(argv):
    quick, gpu, report_only = "--quick" in argv, "--gpu" in argv, "--report" in argv
    root = next((a.split("=", 1)[1] for a in argv if a.startswith("--root=")), None)
    unknown = [a for a in argv if a not in ("--quick", "--gpu", "--report") and not a.startswith("--root=")]
    if unknown or (quick and gpu):
        raise RunError(f"unknown arguments {unknown or argv}: the study takes one of --quick, --gpu, and "
                       f"--report, --root=DIR")
    size = QUICK if quick else GPU if gpu else FULL
    if root is None and (quick or gpu):
        root = "out/word_problem_quick" if quick else "out/word_problem_gpu"
    threads = os.environ.get("OMP_NUM_THREADS")
    command = " ".join(([f"OMP_NUM_THREADS={threads}"] if threads else []) + ["python -m studies.word_problem", *argv])
    doc, written = run_study(size, study_paths(root), command, report_only)
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

@dataclass
class ThetaConfig(RunConfig):
    """RunConfig plus the gate's learning-rate multiplier (support/loop.make_trainer reads it)."""
    gate_lr_multiplier: float = 1.0


def theta_trajectories(group="S3", steps=300, lr=3e-3, seed=100, every=25, log=print):
    """T²MLR on `group` (the study's FULL size, exact training, the chosen lr; seed 100 is the pilot's, not a
    test seed) trained `steps` steps in four settings: init ours / the reference's, gate_lr_multiplier 1 / 10,
    through support/loop.py's optimizer step. Returns {setting: {"step": [...], "theta_r": [...], "accuracy":
    in-distribution accuracy at the end}}. The same batches for every setting (batch_seed); no checkpoints."""
    table, out = multiplication_table(group), {}
    for init in ("mesh", "reference"):
        for m in (1.0, 10.0):
            torch.manual_seed(seed)
            model = build(matched_arms(FULL, group, init_t2mlr=init)["t2mlr"]).train()
            cfg = ThetaConfig(max_iters=steps, learning_rate=lr, min_lr=lr / 100, warmup_iters=max(1, steps // 20),
                              gate_lr_multiplier=m)
            trainer = make_trainer(model, cfg, "cpu", torch.float32, ckpt_path="(not saved)")
            row = {"step": [], "theta_r": []}
            for step in range(steps):
                x, y = make_batch(table, FULL["batch_size"], FULL["train_n"], batch_seed(group, seed, step))
                optimizer_step(trainer, step, 1, lambda model, micro: step_loss(model, x, y, "exact"))
                if step % every == 0 or step == steps - 1:
                    row["step"].append(step)
                    row["theta_r"].append(model.gate.theta_r.item())
            acc = accuracy_by_position(model, table, FULL["train_n"], 128, PROBE_SEED)
            row["accuracy"] = sum(acc) / len(acc)
            out[f"init {init}, gate lr x{m:g}"] = row
            log(f"{group} init {init}, gate lr x{m:g}: θ_r {row['theta_r'][-1]:.3f} at step {steps - 1}, "
                f"in-distribution accuracy {row['accuracy']:.3f}")
    return out
