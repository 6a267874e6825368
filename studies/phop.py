"""
p-hop induction: a task a looped core must loop to solve, so that the state passings between loops
(base, anchor, MeSH) can be told apart.

The task (Sanford, Hsu & Telgarsky 2024, "Transformers, parallel computation, and logarithmic depth";
used for looped models by Saunshi et al. 2025, "Reasoning with latent thoughts"). For a word X of n
letters, 0-indexed, hop(i) is the position right after the last earlier occurrence of X[i]: the
largest j <= i with X[j-1] = X[i], or 0 if X[i] has not occurred before. The target at position i is
X[hop^p(i)]. One hop is an induction step (one attention layer that finds the previous occurrence,
fed by one that copies the previous letter), and hop^p composes p of them by doubling, so about
log2 p compositions are needed: depth, looped or unique, is what solves it. Only positions whose
chain does not end at position 0 are scored (the `scored` mask; at p = 4, n = 64 and 4 letters,
about 20% end there).

The model: the MeSH paper's recursive layout "1+1RK+1" (one prelude layer, one core layer looped K
times, one coda layer), so the loops alone give the depth; the state passings are model.py's
(MeSH §3.1-3.2). Vanilla stacks of L distinct layers give the depth-without-sharing context.

    python -m studies.phop --arm base --K 4 --p 4 --n 64 --seed 0 --steps 6000 --out studies/results/phop
    python -m studies.phop --plan              # every run of the study, in the order the workers take them
    python -m studies.phop --worker            # run the plan's unfinished runs (two workers share it)
    python -m studies.phop --report            # tables + figures of what finished (studies/results/phop)

One run evaluates every 100 steps on fixed scored positions (the same for every arm), records the first
step at >= 0.9 ("steps to learn") and stops once two evaluations in a row are >= 0.99; it writes
DIR/<run>.json with the commit of the code it ran. It is resumable: out/phop/<run>.pt holds its state at
the last evaluation, and the same command continues from there (same batches: batch s is drawn from
a generator seeded by (seed, s) alone).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from model import GPT, GPTConfig
from support.checkpoints import load_checkpoint, save_checkpoint
from support.loop import configure_optimizers

ARMS = ("base", "anchor", "mesh", "vanilla")     # the state passings compared, and flat stacks
ALPHABET = 4                                      # letters of X (the vocabulary)
EVAL_WORDS, EVAL_SEED = 512, 987_654_321         # the fixed evaluation words, the same for every run
LEARNED, HELD = 0.9, 0.99                         # "learned" threshold; stop once two evals hold HELD


# -----------------------------------------------------------------------------
# The task

def hop_positions(X: torch.Tensor) -> torch.Tensor:
    """X (B, n) letters -> hop (B, n): hop(i) = 1 + the last k < i with X[k] = X[i], or 0 if none."""
    B, n = X.shape
    same = X[:, :, None] == X[:, None, :]                       # (B, i, k): X[i] = X[k]
    earlier = torch.ones(n, n, dtype=torch.bool, device=X.device).tril(diagonal=-1)   # k < i
    k = torch.arange(n, device=X.device)
    last = torch.where(same & earlier, k, -1).amax(dim=-1)      # (B, n), -1 where X[i] is new
    return last + 1


def hop_targets(X: torch.Tensor, p: int):
    """X (B, n) letters -> (targets (B, n), scored (B, n) bool): targets[b, i] = X[b, hop^p(i)], and
    scored where that chain does not end at position 0 (hop^p(i) != 0)."""
    hop = hop_positions(X)
    position = torch.arange(X.shape[1], device=X.device).expand_as(X)
    for _ in range(p):
        position = hop.gather(1, position)
    return X.gather(1, position), position != 0


def make_batch(batch_size: int, n: int, p: int, seed: int):
    """batch_size words of n uniform letters (a generator seeded by `seed` alone) -> (X (B, n), targets
    (B, n) with -1 at the unscored positions, which the loss ignores)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randint(ALPHABET, (batch_size, n), generator=g)
    targets, scored = hop_targets(X, p)
    return X, torch.where(scored, targets, -1)


def batch_seed(seed: int, step: int) -> int:
    """The seed of training batch `step` of seed `seed`: the same for every arm (paired), and on resume."""
    return 1_000_003 * (seed + 1) + step


# -----------------------------------------------------------------------------
# The models

def model_config(arm: str, K: int, layers: int, n: int, width: int) -> GPTConfig:
    """The GPTConfig of an arm: "1+1RK+1" with the arm's state passing, or a vanilla stack of `layers`."""
    if arm not in ARMS:
        raise ValueError(f"arm {arm!r} is not one of {', '.join(ARMS)}")
    shape = dict(n_layer=layers) if arm == "vanilla" else dict(layout=f"1+1R{K}+1", state_passing=arm)
    return GPTConfig(vocab_size=ALPHABET, block_size=n, n_head=4, n_embd=width, rope_pct=1.0, **shape)


def with_loops(model: GPT, K_test: int) -> GPT:
    """A copy of a recursive `model` that runs its core K_test times (loops at test time). The layers are
    shared as trained; MeSH's slot count stays as trained, step s uses the router trained at step
    min(s, K): a loop past the trained K reuses loop K's routers (the last ones, trained to feed the
    coda), a shorter run stops after its own first K_test loops."""
    cfg = model.cfg
    P, n_core, K, Q = cfg.depth
    layout = f"{P}+{n_core}R{K_test}+{Q}"
    fields = {f: getattr(cfg, f) for f in cfg.__dataclass_fields__} | dict(layout=layout)
    if cfg.state_passing == "mesh":
        fields["mesh_slots"] = model.mesh.n_slots
    test = GPT(GPTConfig(**fields))
    state = dict(model.state_dict())
    for kind in ("write_routers", "read_routers"):
        for s in range(K_test + 1):
            for w in ("weight", "bias"):
                key = f"mesh.{kind}.{s}.{w}"
                if cfg.state_passing == "mesh":
                    state[key] = model.state_dict()[f"mesh.{kind}.{min(s, K)}.{w}"]
        for s in range(K_test + 1, K + 1):
            state.pop(f"mesh.{kind}.{s}.weight", None)
            state.pop(f"mesh.{kind}.{s}.bias", None)
    test.load_state_dict(state)
    return test.eval()


@torch.no_grad()
def accuracy(model, X, targets) -> float:
    """The fraction of scored positions (targets != -1) whose argmax prediction is the target."""
    logits, _ = model(X)
    scored = targets != -1
    return (logits.argmax(-1)[scored] == targets[scored]).float().mean().item()


def eval_set(n: int, p: int):
    """The fixed evaluation words: EVAL_WORDS words from EVAL_SEED, the same for every arm and seed."""
    return make_batch(EVAL_WORDS, n, p, EVAL_SEED)


# -----------------------------------------------------------------------------
# One run

def run_name(arm, K, layers, p, n, seed) -> str:
    depth = f"L{layers}" if arm == "vanilla" else f"K{K}"
    return f"{arm}_{depth}_p{p}_n{n}_s{seed}"


def steps_to_learn(history, max_steps: int):
    """(first evaluated step with accuracy >= LEARNED, learned?) from history [(step, acc), ...]; a run
    that never reached it counts at max_steps, learned False."""
    for step, acc in history:
        if acc >= LEARNED:
            return step, True
    return max_steps, False


def held(history) -> bool:
    """Whether the last two evaluations are both >= HELD: the run has learned and holds it."""
    return len(history) >= 2 and all(acc >= HELD for _, acc in history[-2:])


def git_commit() -> str:
    """The commit of the code this run imports (the worktree it runs from), '+dirty' if changed."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(arm, K, layers, p, n, seed, steps, out, width=64, batch_size=64, lr=1e-3, eval_every=100,
        ckpt_dir="out/phop", log=print):
    """Train one run (AdamW, linear warmup of 100 steps then a constant LR, clip 1.0) until it holds
    HELD or reaches `steps`, evaluating every `eval_every` steps; resumes from ckpt_dir/<run>.pt (kept
    afterwards: the probes read it). Writes and returns out/<run>.json's dict."""
    name = run_name(arm, K, layers, p, n, seed)
    json_path, ckpt_path = os.path.join(out, name + ".json"), os.path.join(ckpt_dir, name + ".pt")
    os.makedirs(out, exist_ok=True)
    os.makedirs(ckpt_dir, exist_ok=True)
    torch.manual_seed(seed)
    model = GPT(model_config(arm, K, layers, n, width))
    opt = configure_optimizers(model, 0.1, lr, (0.9, 0.95), "cpu")
    spec = dict(arm=arm, K=K if arm != "vanilla" else None, layers=layers if arm == "vanilla" else None,
                p=p, n=n, seed=seed, max_steps=steps, width=width, batch_size=batch_size, lr=lr,
                eval_every=eval_every, layout=model.cfg.layout or f"vanilla {layers}")
    step, history, seconds = 0, [], 0.0
    if os.path.exists(ckpt_path):
        ckpt = load_checkpoint(ckpt_path)
        if ckpt["spec"] != spec:
            raise SystemExit(f"{ckpt_path} holds another run ({ckpt['spec']}); delete it or change --out")
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        step, history, seconds = ckpt["step"], [tuple(h) for h in ckpt["history"]], ckpt["seconds"]
        log(f"{name}: resumed at step {step}")
    X_eval, y_eval = eval_set(n, p)
    t0 = time.time() - seconds
    while True:
        if step % eval_every == 0 and (not history or history[-1][0] != step):
            model.eval()
            history.append((step, accuracy(model, X_eval, y_eval)))
            model.train()
            elapsed = time.time() - t0
            eta = elapsed / max(step, 1) * (steps - step)
            log(f"{name}: step {step}/{steps} acc {history[-1][1]:.3f} | {elapsed / 60:.1f} min, "
                f"at most {eta / 60:.1f} min left")
            save_checkpoint(ckpt_path, dict(model=model.state_dict(), optimizer=opt.state_dict(),
                                            step=step, history=history, seconds=elapsed, spec=spec))
        if step >= steps or held(history):
            break
        X, y = make_batch(batch_size, n, p, batch_seed(seed, step))
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / 100)
        _, loss = model(X, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
    learn_step, learned = steps_to_learn(history, steps)
    doc = dict(spec, name=name, commit=git_commit(), steps_to_learn=learn_step, learned=learned,
               final_accuracy=history[-1][1], steps_run=step, minutes=(time.time() - t0) / 60,
               history=history, params=sum(q.numel() for q in model.parameters()))
    if arm in ("base", "anchor", "mesh"):
        model.eval()
        doc["test_time_K"] = {str(k): accuracy(with_loops(model, k), X_eval, y_eval)
                              for k in TEST_KS}
    with open(json_path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(json_path + ".tmp", json_path)
    log(f"{name}: steps to learn {learn_step} ({'learned' if learned else 'never learned'}), final "
        f"accuracy {doc['final_accuracy']:.3f}, {doc['minutes']:.1f} min -> {json_path}")
    return doc


TEST_KS = (1, 2, 3, 4, 6, 8, 12)     # loops at test time (K'), for the models trained at K = 4 (and 2)


# -----------------------------------------------------------------------------
# The plan: every run of the study, and the workers that share it

P, N, STEPS = 4, 64, 6000                        # the calibrated task (see the docs page) and the cap
CALIBRATION_SEEDS, TEST_SEEDS = (100, 101), (0, 1, 2, 3, 4)


def plan():
    """The study's runs as (arm, K, layers, seed), calibration first, then seed by seed so that every
    finished seed is paired across arms: base/anchor/mesh at K = 2, 4 (5 seeds); base K = 1 (the
    3-layer stack) and vanilla stacks of 4 and 6 layers (3 seeds)."""
    runs = [("base", 4, None, s) for s in CALIBRATION_SEEDS] + [("base", 1, None, s) for s in CALIBRATION_SEEDS]
    for seed in TEST_SEEDS:
        runs += [(arm, K, None, seed) for K in (4, 2) for arm in ("base", "mesh", "anchor")]
        if seed < 3:
            runs += [("base", 1, None, seed), ("vanilla", None, 4, seed), ("vanilla", None, 6, seed)]
    return runs


def worker(out, log=print):
    """Run the plan's unfinished runs in order; a run being trained by another worker (its .lock names
    a live process) is skipped."""
    for arm, K, layers, seed in plan():
        name = run_name(arm, K, layers, P, N, seed)
        if os.path.exists(os.path.join(out, name + ".json")):
            continue
        lock = os.path.join(out, name + ".lock")
        os.makedirs(out, exist_ok=True)
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pid = int(open(lock).read() or 0)
            if pid and os.path.exists(f"/proc/{pid}"):
                continue
            os.remove(lock)                               # a dead worker's lock
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        try:
            run(arm, K, layers, P, N, seed, STEPS, out, log=log)
        finally:
            os.remove(lock)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arm", choices=ARMS)
    ap.add_argument("--K", type=int, default=4, help="loops of the core (recursive arms)")
    ap.add_argument("--layers", type=int, default=3, help="layers of a vanilla stack")
    ap.add_argument("--p", type=int, default=P)
    ap.add_argument("--n", type=int, default=N)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--out", default="studies/results/phop")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (two workers: 1 each)")
    ap.add_argument("--plan", action="store_true", help="print the study's runs")
    ap.add_argument("--worker", action="store_true", help="run the plan's unfinished runs")
    ap.add_argument("--report", action="store_true", help="tables and figures of the finished runs")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    for name, value, low in (("K", args.K, 1), ("layers", args.layers, 1), ("p", args.p, 1),
                             ("n", args.n, 2), ("steps", args.steps, 1)):
        if value < low:
            ap.error(f"--{name} {value} must be >= {low}")
    if args.plan:
        for r in plan():
            print(run_name(*r[:3], P, N, r[3]))
    elif args.worker:
        worker(args.out)
    elif args.report:
        from studies.phop_report import report
        report(args.out)
    elif args.arm is None:
        ap.error("give --arm (one run), --plan, --worker or --report")
    else:
        run(args.arm, args.K, args.layers, args.p, args.n, args.seed, args.steps, args.out)


if __name__ == "__main__":
    main()
