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

    python -m studies.phop --arm base --K 4 --p 6 --n 64 --seed 0 --steps 6000 --out studies/results/phop
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
import time
from dataclasses import replace

import torch

from model import GPT, GPTConfig
from studies.common import git_commit
from studies.reproduce.stats import paired_stats
from support.checkpoints import load_checkpoint, save_checkpoint
from support.loop import LOOPS_SAMPLERS, configure_optimizers, draw_loops
from support.process import keeps_process_state

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


def run(arm, K, layers, p, n, seed, steps, out, width=64, batch_size=64, lr=1e-3, eval_every=100,
        ckpt_dir="out/phop", log=print, loops_sampler="fixed"):
    """Train one run (AdamW, linear warmup of 100 steps then a constant LR, clip 1.0) until it holds
    HELD or reaches `steps`, evaluating every `eval_every` steps; resumes from ckpt_dir/<run>.pt (kept
    afterwards: the probes read it). Writes and returns out/<run>.json's dict. loops_sampler other than
    "fixed": random-depth training (support.loop.draw_loops, mean K, capped at MAX_LOOPS; the stopping
    rule is measured at K, as for fixed depth); the run's name ends in _<sampler>."""
    name = run_name(arm, K, layers, p, n, seed) + ("" if loops_sampler == "fixed" else f"_{loops_sampler}")
    json_path, ckpt_path = os.path.join(out, name + ".json"), os.path.join(ckpt_dir, name + ".pt")
    os.makedirs(out, exist_ok=True)
    os.makedirs(ckpt_dir, exist_ok=True)
    torch.manual_seed(seed)
    cfg = model_config(arm, K, layers, n, width)
    model = GPT(cfg if loops_sampler == "fixed" else replace(cfg, max_loops=MAX_LOOPS))
    opt = configure_optimizers(model, 0.1, lr, (0.9, 0.95), "cpu")
    spec = dict(arm=arm, K=K if arm != "vanilla" else None, layers=layers if arm == "vanilla" else None,
                p=p, n=n, seed=seed, max_steps=steps, width=width, batch_size=batch_size, lr=lr,
                eval_every=eval_every, layout=model.cfg.layout or f"vanilla {layers}")
    if loops_sampler != "fixed":
        spec.update(loops_sampler=loops_sampler, max_loops=MAX_LOOPS)
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
        depth = {} if loops_sampler == "fixed" else \
            dict(n_loops=draw_loops(loops_sampler, K, MAX_LOOPS, seed, step))
        _, loss = model(X, y, **depth)
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
        doc["test_time_K"] = {str(k): accuracy(lambda X, k=k: model(X, n_loops=k), X_eval, y_eval)
                              for k in MEASURED_KS}
    with open(json_path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(json_path + ".tmp", json_path)
    log(f"{name}: steps to learn {learn_step} ({'learned' if learned else 'never learned'}), final "
        f"accuracy {doc['final_accuracy']:.3f}, {doc['minutes']:.1f} min -> {json_path}")
    return doc


TEST_KS = (1, 2, 3, 4, 6, 8, 12)     # loops at test time (K'), for the models trained at K = 4 (and 2)
MAX_LOOPS = 16                       # random-depth runs: MeSH routers of steps 0..16, draws capped there
MEASURED_KS = TEST_KS + (MAX_LOOPS,)  # what a run measures (the older runs' tables: TEST_KS)


# -----------------------------------------------------------------------------
# The plan: every run of the study, and the workers that share it

P, N, STEPS = 6, 64, 6000       # the calibrated task (studies/phop.md: at p = 4 the 3-layer stack learned) and the cap
HARD_P = 12                     # the harder task of the random-depth study (57% of positions unscored)
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


def plan_random_depth():
    """The random-depth study's runs as (arm, K, layers, seed, p, sampler), seed by seed: base, MeSH and
    anchor at p = P with random depth of mean 4 (5 seeds; their fixed-K = 4 pairs are the main study's);
    then a fixed K = 4 calibration run at HARD_P (it must not learn within STEPS), and base and MeSH with
    random depth at HARD_P (3 seeds)."""
    runs = [(arm, 4, None, s, P, "poisson_lognormal") for s in TEST_SEEDS for arm in ("base", "mesh", "anchor")]
    runs.append(("base", 4, None, CALIBRATION_SEEDS[0], HARD_P, "fixed"))
    return runs + [(arm, 4, None, s, HARD_P, "poisson_lognormal") for s in TEST_SEEDS[:3] for arm in ("base", "mesh")]


def worker(out, runs, ckpt_dir="out/phop", log=print):
    """Run the unfinished runs of `runs` ((arm, K, layers, seed, p, sampler) each) in order; a run being
    trained by another worker (its .lock names a live process) is skipped."""
    for arm, K, layers, seed, p, sampler in runs:
        name = run_name(arm, K, layers, p, N, seed) + ("" if sampler == "fixed" else f"_{sampler}")
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
            run(arm, K, layers, p, N, seed, STEPS, out, ckpt_dir=ckpt_dir, log=log, loops_sampler=sampler)
        finally:
            os.remove(lock)


# -----------------------------------------------------------------------------
# The report: tables, paired intervals and figures of the finished runs

def load_runs(out, p):
    """{(arm, depth): {seed: run dict}} of the finished test-seed runs at hop count p in `out` (depth: K, or
    L for vanilla)."""
    runs = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".json") and name.split("_")[0] in ARMS:
            with open(os.path.join(out, name)) as f:
                r = json.load(f)
            if r["seed"] in TEST_SEEDS and r["p"] == p and r["n"] == N and "loops_sampler" not in r:
                runs.setdefault((r["arm"], r["K"] or r["layers"]), {})[r["seed"]] = r
    return runs


def paired(a, b, key):
    """paired_stats of runs a - b ({seed: run}) on run[key] (a number), over the seeds both have."""
    if not set(a) & set(b):
        return None
    return paired_stats({s: float(r[key]) for s, r in a.items()}, {s: float(r[key]) for s, r in b.items()})


def summarise(runs):
    """The report's dict: per arm the seeds' steps to learn, fraction learned and final accuracy; depth
    (3-layer stack vs base at K = 4), the state passings against each other at K = 2 and 4 (paired by
    seed), and loops at test time (accuracy at K' minus at the trained K = 4, paired by seed)."""
    arms = {f"{arm} {'L' if arm == 'vanilla' else 'K'}={d}": dict(
        seeds=sorted(rs), steps_to_learn=[rs[s]["steps_to_learn"] for s in sorted(rs)],
        learned=[rs[s]["learned"] for s in sorted(rs)], final=[rs[s]["final_accuracy"] for s in sorted(rs)],
        minutes=[rs[s]["minutes"] for s in sorted(rs)]) for (arm, d), rs in sorted(runs.items())}
    get = lambda arm, d: runs.get((arm, d), {})
    comparisons = {}
    pairs = [("3-layer stack - base K=4", ("base", 1), ("base", 4))]
    for K in (2, 4):
        pairs += [(f"mesh - base K={K}", ("mesh", K), ("base", K)),
                  (f"anchor - base K={K}", ("anchor", K), ("base", K)),
                  (f"mesh - anchor K={K}", ("mesh", K), ("anchor", K))]
    for label, a, b in pairs:
        comparisons[label] = {key: paired(get(*a), get(*b), key) for key in ("steps_to_learn", "final_accuracy")}
    test_time = {}
    for arm in ("base", "anchor", "mesh"):
        rs = get(arm, 4)
        if not rs:
            continue
        test_time[arm] = {k: dict(mean=sum(r["test_time_K"][k] for r in rs.values()) / len(rs),
                                  vs_trained=paired_stats({s: r["test_time_K"][k] for s, r in rs.items()},
                                                          {s: r["test_time_K"]["4"] for s, r in rs.items()}))
                          for k in map(str, TEST_KS)}
    return dict(arms=arms, comparisons=comparisons, test_time_K=test_time)


def interval(stats, fmt="{:+.0f}"):
    """'+d [lo, hi] (n)' of a paired_stats dict, '—' without one."""
    if stats is None:
        return "—"
    ci = "" if stats["ci"] is None else " [" + ", ".join(fmt.format(v) for v in stats["ci"]) + "]"
    return f"{fmt.format(stats['diff'])}{ci} (n = {stats['n']})"


def markdown(doc):
    lines = ["| arm | seeds | learned | steps to learn (each seed; 6000 = never) | final accuracy |",
             "|---|---|---|---|---|"]
    for name, a in doc["arms"].items():
        lines.append(f"| {name} | {len(a['seeds'])} | {sum(a['learned'])}/{len(a['seeds'])} | "
                     f"{', '.join(map(str, a['steps_to_learn']))} | "
                     f"{', '.join(f'{v:.3f}' for v in a['final'])} |")
    lines += ["", "| paired by seed | steps to learn, Δ [95% t interval] | final accuracy, Δ [95%] |",
              "|---|---|---|"]
    for label, c in doc["comparisons"].items():
        lines.append(f"| {label} | {interval(c['steps_to_learn'])} | "
                     f"{interval(c['final_accuracy'], '{:+.3f}')} |")
    if doc["test_time_K"]:
        ks = list(map(str, TEST_KS))
        lines += ["", "| trained at K = 4, run at K' | " + " | ".join(ks) + " |", "|---|" + "---|" * len(ks)]
        for arm, t in doc["test_time_K"].items():
            lines.append(f"| {arm} | " + " | ".join(f"{t[k]['mean']:.3f}" for k in ks) + " |")
        lines += ["", "| K' minus K = 4, paired | " + " | ".join(ks) + " |", "|---|" + "---|" * len(ks)]
        for arm, t in doc["test_time_K"].items():
            lines.append(f"| {arm} | " + " | ".join(interval(t[k]["vs_trained"], "{:+.3f}") for k in ks) + " |")
    return "\n".join(lines)


def figures(runs, doc, out, p):
    """phop_steps.png (steps to learn per arm and seed) and phop_test_time_K.png (accuracy against K')."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 3.6))
    names = list(doc["arms"])
    for i, name in enumerate(names):
        a = doc["arms"][name]
        ax.scatter([i] * len(a["steps_to_learn"]), a["steps_to_learn"], c=["C2" if l else "C3" for l in a["learned"]],
                   s=28, zorder=3)
    ax.axhline(STEPS, color="C3", lw=0.8, ls="--")
    ax.text(len(names) - 0.5, STEPS, "never (counted at 6000)", color="C3", ha="right", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("steps to accuracy >= 0.9")
    ax.set_title(f"p-hop induction (p = {p}, n = {N}): steps to learn, one dot a seed (green learned)", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"phop_p{p}_steps.png"), dpi=120)
    plt.close(fig)
    if doc["test_time_K"]:
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for arm, t in doc["test_time_K"].items():
            ax.plot(TEST_KS, [t[str(k)]["mean"] for k in TEST_KS], marker="o", label=arm)
            for r in runs[(arm, 4)].values():
                ax.plot(TEST_KS, [r["test_time_K"][str(k)] for k in TEST_KS], alpha=0.2, lw=0.8,
                        color=ax.lines[-1].get_color())
        ax.axvline(4, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("loops at test time K' (trained at K = 4)")
        ax.set_ylabel("accuracy (scored positions)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"phop_p{p}_test_time_K.png"), dpi=120)
        plt.close(fig)


def probe(out, p=P, ckpt_dir="out/phop", K=4, n_words=64):
    """What the loops do, on the models trained at K (base, anchor, MeSH; every finished test seed), over the
    first n_words evaluation words: each loop's relative update 2‖f(h) − h‖ / (‖f(h)‖ + ‖h‖) (MeSH §4.1's
    skew, studies/probe.py), linear CKA between the states of consecutive loops h(t), h(t+1), and for MeSH
    each step's read and write entropy and slot usage (studies.probe.router_usage). Writes out/probe.json
    and out/phop_probe.png; returns the dict."""
    from studies.probe import router_usage, run_probe
    X, _ = eval_set(N, p)
    X = X[:n_words]
    result = {}
    for arm in ("base", "anchor", "mesh"):
        for seed in TEST_SEEDS:
            path = os.path.join(ckpt_dir, run_name(arm, K, None, p, N, seed) + ".pt")
            if not os.path.exists(os.path.join(out, run_name(arm, K, None, p, N, seed) + ".json")):
                continue
            ckpt = load_checkpoint(path)
            model = GPT(model_config(arm, K, None, N, ckpt["spec"]["width"]))
            model.load_state_dict(ckpt["model"])
            model.eval()
            r = run_probe(model, X, batch_size=16)
            states = r["cka"]["states"]
            loops = [states.index(f"h({t})") for t in range(K + 1)]
            row = {"update": {b: m for b, m in zip(r["skew"]["blocks"], r["skew"]["mean"]) if b.startswith("core")},
                   "cka_next": [r["cka"]["linear"][a][b] for a, b in zip(loops, loops[1:])],
                   "effective_rank": {n: r["spectra"]["effective_rank"][n][0] for n in states}}
            if arm == "mesh":
                row["routing"] = router_usage(model, X)
            result.setdefault(arm, {})[str(seed)] = row
    with open(os.path.join(out, f"probe_p{p}.json"), "w") as f:
        json.dump(dict(result, command=f"python -m studies.phop --probe --p {p}"), f, indent=1)
    plot_probe(result, K, out, p)
    return result


def plot_probe(result, K, out, p):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for i, (arm, seeds) in enumerate(result.items()):
        for j, row in enumerate(seeds.values()):
            kw = dict(color=f"C{i}", alpha=0.7, marker="o", label=arm if j == 0 else None)
            axes[0].plot(range(K), [row["update"][f"core{t}"] for t in range(K)], **kw)
            axes[1].plot(range(K), row["cka_next"], **kw)
    axes[0].set(xlabel="loop t", ylabel="relative update of the core", title="how much each loop changes h(t)")
    axes[1].set(xlabel="loop t", ylabel="linear CKA(h(t), h(t+1))", title="loop-to-loop similarity")
    for ax in axes[:2]:
        ax.set_xticks(range(K))
        ax.legend(fontsize=8)
    mesh = result.get("mesh", {})
    for j, row in enumerate(mesh.values()):
        for kind, style in (("write", "-"), ("read", "--")):
            axes[2].plot([s["entropy"] for s in row["routing"][kind]], style, color="C2", alpha=0.7,
                         marker="o", label=kind if j == 0 else None)
    if mesh:
        n_slots = next(iter(mesh.values()))["routing"]["n_slots"]
        axes[2].axhline(math.log(n_slots), color="grey", ls=":", lw=0.8)
        axes[2].text(0, math.log(n_slots), f"uniform over {n_slots} slots", fontsize=8, va="bottom")
        axes[2].set(xlabel="step s (0 transitional, t + 1 loop t)", ylabel="entropy (nats)",
                    title="MeSH routers: entropy over slots")
        axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"phop_p{p}_probe.png"), dpi=120)
    plt.close(fig)


def report(out, p=P):
    """Write out/report_p<p>.json, .md and the figures from the finished runs at hop count p; print the
    markdown."""
    runs = load_runs(out, p)
    doc = summarise(runs)
    doc["command"] = f"python -m studies.phop --report --p {p}"
    doc["p"], doc["n"] = p, N
    with open(os.path.join(out, f"report_p{p}.json"), "w") as f:
        json.dump(doc, f, indent=1)
    text = markdown(doc)
    with open(os.path.join(out, f"report_p{p}.md"), "w") as f:
        f.write(text + "\n")
    figures(runs, doc, out, p)
    print(text)


@keeps_process_state
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
    ap.add_argument("--ckpt_dir", default="out/phop", help="the runs' checkpoints (resume, probes)")
    ap.add_argument("--loops_sampler", default="fixed", choices=LOOPS_SAMPLERS,
                    help="random-depth training: the loop count of each step (mean K)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (two workers: 1 each)")
    ap.add_argument("--plan", action="store_true", help="print the study's runs")
    ap.add_argument("--worker", action="store_true", help="run the plan's unfinished runs")
    ap.add_argument("--report", action="store_true", help="tables and figures of the finished runs")
    ap.add_argument("--probe", action="store_true", help="what the loops do, on the finished K = 4 runs")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    for name, value, low in (("K", args.K, 1), ("layers", args.layers, 1), ("p", args.p, 1),
                             ("n", args.n, 2), ("steps", args.steps, 1)):
        if value < low:
            ap.error(f"--{name} {value} must be >= {low}")
    if args.plan:
        for r in plan():
            print(run_name(*r[:3], args.p, N, r[3]))
    elif args.worker and args.loops_sampler == "fixed":
        worker(args.out, [(arm, K, layers, seed, args.p, "fixed") for arm, K, layers, seed in plan()],
               args.ckpt_dir)
    elif args.worker:
        worker(args.out, plan_random_depth(), args.ckpt_dir)
    elif args.report:
        report(args.out, args.p)
    elif args.probe:
        probe(args.out, args.p, args.ckpt_dir)
    elif args.arm is None:
        ap.error("give --arm (one run), --plan, --worker or --report")
    else:
        run(args.arm, args.K, args.layers, args.p, args.n, args.seed, args.steps, args.out,
            ckpt_dir=args.ckpt_dir, loops_sampler=args.loops_sampler)


if __name__ == "__main__":
    main()
