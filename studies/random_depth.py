"""
Depth chosen at test time: what random-depth training buys a looped model (docs/training.md, "Depth at
test time"). Models trained at a fixed K and with random depth (support.loop.draw_loops, Huginn's
Poisson log-normal sampler) are run at K' loops and with adaptive exits (exit_threshold τ: a position
stops looping once its state changes by less than τ, relative):

1. p-hop (studies/phop.md, p = 6, layout 1+1R4+1): accuracy at K' = 1 .. 16, fixed K = 4 against random
   depth of mean 4 (capped at 16), for base, anchor and MeSH, paired by seed. The gain from looping more
   (accuracy at K' = 16 minus at K' = 4) compared between passings.
   A harder p (phop.HARD_P = 12, where fixed K = 4 does not learn in 6,000 steps): base and MeSH with random
   depth, 3 seeds: does looping more at test time solve it?
2. Adaptive exit on the random-depth p-hop models (no new training): accuracy against the mean loops a
   position ran, over thresholds, beside the same model at fixed K'.
3. Language modelling at the tiny byte size (config/tiny_mesh.py on the Python manual, 300 steps, MeSH
   2+2R2+2), 3 seeds: bits per byte over the whole val split at K' = 1 .. 8, fixed K = 2 against random
   depth of mean 2 (capped at 8), and the adaptive-exit curve.

    python -m studies.phop --worker --loops_sampler poisson_lognormal \\
        --out studies/results/phop_random_depth --ckpt_dir out/phop_random_depth   # p-hop runs (2 workers)
    python -m studies.random_depth --lm          # the 6 language-model runs (resumable), ~7 min each
    python -m studies.random_depth --report      # exits, tables, figures -> studies/results/random_depth/

Bits per byte: the val loss in nats per token over ln 2 (byte tokens; the split's 2 end-of-text tokens
are counted as tokens).
"""

import argparse
import json
import math
import os
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F

from model import GPT
from studies import phop
from studies.common import git_commit
from studies.reproduce.stats import paired_stats
from support.checkpoints import load_checkpoint, load_model
from support.process import keeps_process_state

OUT = "studies/results/random_depth"
PHOP_FIXED, PHOP_RANDOM = "studies/results/phop", "studies/results/phop_random_depth"
PHOP_CKPTS, LM_CKPTS = "out/phop_random_depth", "out/random_depth"
SAMPLER = "poisson_lognormal"
PASSINGS = ("base", "anchor", "mesh")
THRESHOLDS = (1.0, 0.6, 0.4, 0.3, 0.2, 0.1, 0.03, 0.01)  # τ of the exit curves, fewest loops first
LM_SEEDS, LM_KS, LM_MAX_LOOPS = (0, 1, 2), (1, 2, 3, 4, 6, 8), 8


# -----------------------------------------------------------------------------
# p-hop: the finished runs (studies/phop.py) and exits on the random-depth checkpoints

def phop_runs(p=phop.P, seeds=phop.TEST_SEEDS):
    """{(passing, sampler): {seed: run dict}} of the finished K = 4 runs at hop count p, of the given
    seeds (None: every seed, as the harder p's calibration run, seed 100)."""
    runs = {}
    for folder in (PHOP_FIXED, PHOP_RANDOM):
        for name in sorted(os.listdir(folder)):
            if not name.endswith(".json") or name.split("_")[0] not in PASSINGS:
                continue
            with open(os.path.join(folder, name)) as f:
                r = json.load(f)
            if r["p"] == p and r["K"] == 4 and (seeds is None or r["seed"] in seeds):
                runs.setdefault((r["arm"], r.get("loops_sampler", "fixed")), {})[r["seed"]] = r
    return runs


def unscored_fraction(p, n=phop.N):
    """The fraction of evaluation positions whose p-hop chain ends at position 0 (not scored)."""
    return (phop.eval_set(n, p)[1] == -1).float().mean().item()


@torch.no_grad()
def phop_exits(run):
    """The random-depth p-hop run's model (its checkpoint) on the evaluation words at every τ, with up to
    max_loops loops: [{"threshold", "mean_loops" (over every position), "accuracy"}]."""
    model = GPT(replace(phop.model_config(run["arm"], 4, None, run["n"], run["width"]),
                        max_loops=run["max_loops"]))
    model.load_state_dict(load_checkpoint(os.path.join(PHOP_CKPTS, run["name"] + ".pt"))["model"])
    model.eval()
    X, y = phop.eval_set(run["n"], run["p"])
    curve = []
    for tau in THRESHOLDS:
        stats = {}
        acc = phop.accuracy(lambda X: model(X, n_loops=run["max_loops"], exit_threshold=tau, stats=stats), X, y)
        curve.append(dict(threshold=tau, mean_loops=stats["loops"].float().mean().item(), accuracy=acc))
    return curve


# -----------------------------------------------------------------------------
# Language modelling at the tiny byte size

def lm_name(sampler, seed):
    return f"mesh_{sampler}_s{seed}"


def lm_train(sampler, seed):
    """Train (or resume) one tiny MeSH run with train.py; its checkpoint is out/random_depth/<name>/ckpt.pt."""
    import train
    out_dir = os.path.join(LM_CKPTS, lm_name(sampler, seed))
    ckpt = os.path.join(out_dir, "ckpt.pt")
    args = ["config/tiny_mesh.py", f"--seed={seed}", f"--out_dir={out_dir}", "--log_interval=50"]
    if sampler != "fixed":
        args += [f"--loops_sampler={sampler}", f"--max_loops={LM_MAX_LOOPS}"]
    if os.path.exists(ckpt):
        if load_checkpoint(ckpt)["step"] >= 300:
            return ckpt
        args.append("--init_from=resume")
    train.main(args)
    return ckpt


@torch.no_grad()
def lm_bits_per_byte(model, val, block=256, **depth):
    """(bits per byte over the non-overlapping windows of the val tokens, mean loops a token ran)."""
    starts = range(0, len(val) - block - 1, block)
    x = torch.stack([torch.from_numpy(val[s:s + block].astype(np.int64)) for s in starts])
    y = torch.stack([torch.from_numpy(val[s + 1:s + 1 + block].astype(np.int64)) for s in starts])
    stats = {}
    logits, _ = model(x, stats=stats, **depth)
    nats = F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
    return nats / math.log(2), stats["loops"].float().mean().item()


def lm_evaluate(sampler, seed):
    """A finished LM run at every K' and every τ (up to LM_MAX_LOOPS loops), written to OUT/lm/<name>.json."""
    ckpt = os.path.join(LM_CKPTS, lm_name(sampler, seed), "ckpt.pt")
    model, saved = load_model(ckpt)
    val = np.fromfile("data/pydoc/val.bin", dtype=np.uint16)
    at_K = {str(k): lm_bits_per_byte(model, val, n_loops=k)[0] for k in LM_KS}
    exits = [dict(zip(("bits_per_byte", "mean_loops"),
                      lm_bits_per_byte(model, val, n_loops=LM_MAX_LOOPS, exit_threshold=tau)), threshold=tau)
             for tau in THRESHOLDS]
    doc = dict(name=lm_name(sampler, seed), sampler=sampler, seed=seed, step=saved["step"],
               max_loops=model.cfg.max_loops, commit=git_commit(), bits_per_byte_at_K=at_K, exits=exits)
    os.makedirs(os.path.join(OUT, "lm"), exist_ok=True)
    with open(os.path.join(OUT, "lm", doc["name"] + ".json"), "w") as f:
        json.dump(doc, f, indent=1)
    return doc


# -----------------------------------------------------------------------------
# The report

def by_seed(runs, value):
    return {s: value(r) for s, r in runs.items()}


def at_equal_loops(mean_loops, at_K):
    """The same model at fixed K' of equal mean loops: at_K {"K'": value} read linearly between measured K'."""
    ks = sorted(at_K, key=int)
    return float(np.interp(mean_loops, [int(k) for k in ks], [at_K[k] for k in ks]))


def exit_table(curves, at_K, value):
    """Per τ, over seeds: mean loops, the value at exit, and exit minus fixed K' at equal mean loops (paired).
    curves {seed: [{"threshold", "mean_loops", value}]}, at_K {seed: {"K'": value}}."""
    rows = []
    for i, tau in enumerate(THRESHOLDS):
        points = {s: c[i] for s, c in curves.items()}
        fixed = {s: at_equal_loops(pt["mean_loops"], at_K[s]) for s, pt in points.items()}
        rows.append(dict(threshold=tau, mean_loops=float(np.mean([pt["mean_loops"] for pt in points.values()])),
                         value=float(np.mean([pt[value] for pt in points.values()])),
                         minus_fixed=paired_stats({s: pt[value] for s, pt in points.items()}, fixed)))
    return rows


def summarise(runs, lm, exits=None, hard=None):
    """The report's dict: p-hop accuracy at K' per passing and sampler (mean over seeds, random - fixed
    paired by seed), the gain from looping more (K' = 16 vs 4) between passings, the exit curves against
    fixed K' at equal mean loops (exits {run name: curve}); LM bits per byte at K' (random - fixed,
    paired) and its exit curves; the harder p's runs (hard, as phop_runs) and its unscored fraction."""
    phop_K = {}
    for (passing, sampler), rs in sorted(runs.items()):
        ks = [k for k in map(str, phop.MEASURED_KS) if all(k in r["test_time_K"] for r in rs.values())]
        phop_K[f"{passing} {sampler}"] = {k: sum(r["test_time_K"][k] for r in rs.values()) / len(rs) for k in ks}
    random_vs_fixed = {}
    for passing in PASSINGS:
        a, b = runs.get((passing, SAMPLER), {}), runs.get((passing, "fixed"), {})
        if set(a) & set(b):
            random_vs_fixed[passing] = {k: paired_stats(by_seed(a, lambda r: r["test_time_K"][k]),
                                                        by_seed(b, lambda r: r["test_time_K"][k]))
                                        for k in map(str, phop.TEST_KS)}
    gain = {p: by_seed(runs.get((p, SAMPLER), {}), lambda r: r["test_time_K"]["16"] - r["test_time_K"]["4"])
            for p in PASSINGS}
    passings = {f"{a} - {b}": paired_stats(gain[a], gain[b]) for a, b in
                (("mesh", "base"), ("anchor", "base"), ("mesh", "anchor")) if set(gain[a]) & set(gain[b])}
    steps = {f"{p} {s}": by_seed(rs, lambda r: r["steps_to_learn"]) for (p, s), rs in sorted(runs.items())}
    lm_K = {}
    for sampler in ("fixed", SAMPLER):
        rs = {d["seed"]: d for d in lm if d["sampler"] == sampler}
        if rs:
            lm_K[sampler] = {k: sum(d["bits_per_byte_at_K"][k] for d in rs.values()) / len(rs) for k in map(str, LM_KS)}
    lm_a = {d["seed"]: d for d in lm if d["sampler"] == SAMPLER}
    lm_b = {d["seed"]: d for d in lm if d["sampler"] == "fixed"}
    lm_vs = {k: paired_stats(by_seed(lm_a, lambda d: d["bits_per_byte_at_K"][k]),
                             by_seed(lm_b, lambda d: d["bits_per_byte_at_K"][k]))
             for k in map(str, LM_KS)} if set(lm_a) & set(lm_b) else {}
    exit_rows = {}
    for passing in PASSINGS:
        rs = {s: r for s, r in runs.get((passing, SAMPLER), {}).items() if r.get("name") in (exits or {})}
        if rs:
            exit_rows[passing] = exit_table({s: exits[r["name"]] for s, r in rs.items()},
                                            {s: r["test_time_K"] for s, r in rs.items()}, "accuracy")
    lm_exits = {}
    for sampler in ("fixed", SAMPLER):
        rs = {d["seed"]: d for d in lm if d["sampler"] == sampler}
        if rs:
            lm_exits[sampler] = exit_table({s: d["exits"] for s, d in rs.items()},
                                           {s: d["bits_per_byte_at_K"] for s, d in rs.items()}, "bits_per_byte")
    hard_doc = {}
    for (passing, sampler), rs in sorted((hard or {}).items()):
        ks = [k for k in map(str, phop.MEASURED_KS) if all(k in r["test_time_K"] for r in rs.values())]
        hard_doc[f"{passing} {sampler}"] = dict(
            seeds=sorted(rs), learned=sum(r["learned"] for r in rs.values()),
            steps_to_learn=by_seed(rs, lambda r: r["steps_to_learn"]),
            accuracy_at_K={k: sum(r["test_time_K"][k] for r in rs.values()) / len(rs) for k in ks},
            best_K={s: max(ks, key=lambda k: r["test_time_K"][k]) for s, r in rs.items()})
    return dict(phop_accuracy_at_K=phop_K, phop_random_minus_fixed=random_vs_fixed,
                phop_gain_16_minus_4=gain, phop_gain_between_passings=passings, phop_steps_to_learn=steps,
                phop_exit_vs_fixed=exit_rows, lm_bits_per_byte_at_K=lm_K, lm_random_minus_fixed=lm_vs,
                lm_exit_vs_fixed=lm_exits, hard_p=dict(p=phop.HARD_P, unscored=unscored_fraction(phop.HARD_P),
                                                       unscored_at_p6=unscored_fraction(phop.P), runs=hard_doc))


def interval(s, fmt="{:+.3f}"):
    if s is None:
        return "–"
    if s["ci"] is None:
        return fmt.format(s["diff"]) + f" (n = {s['n']})"
    star = " *" if s["excludes_zero"] else ""
    return f"{fmt.format(s['diff'])} [{fmt.format(s['ci'][0])}, {fmt.format(s['ci'][1])}]{star} (n = {s['n']})"


def markdown(doc):
    """The report's tables."""
    ks = list(map(str, phop.MEASURED_KS))
    lines = ["## p-hop (p = 6): accuracy at K' loops, mean over seeds", "",
             "| passing, training | " + " | ".join(f"K' = {k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for arm, acc in doc["phop_accuracy_at_K"].items():
        lines.append(f"| {arm} | " + " | ".join(f"{acc[k]:.3f}" if k in acc else "–" for k in ks) + " |")
    lines += ["", "Random depth minus fixed K = 4, paired by seed (95% interval; * excludes 0):", "",
              "| passing | " + " | ".join(f"K' = {k}" for k in map(str, phop.TEST_KS)) + " |",
              "|---|" + "---|" * len(phop.TEST_KS)]
    for passing, row in doc["phop_random_minus_fixed"].items():
        lines.append(f"| {passing} | " + " | ".join(interval(row[k]) for k in map(str, phop.TEST_KS)) + " |")
    lines += ["", "The gain from looping more, random depth (accuracy at K' = 16 minus at K' = 4), between "
              "passings, paired by seed:", ""]
    lines += [f"- {label}: {interval(s)}" for label, s in doc["phop_gain_between_passings"].items()]
    lines += ["", "## p-hop: adaptive exit on the random-depth models (up to 16 loops), mean over seeds", "",
              "Exit minus the same model at fixed K' of equal mean loops (read linearly between measured K'), "
              "paired by seed:", "", "| passing | τ | mean loops | accuracy | exit - fixed K' |", "|---|---|---|---|---|"]
    for passing, rows in doc["phop_exit_vs_fixed"].items():
        lines += [f"| {passing} | {r['threshold']:g} | {r['mean_loops']:.2f} | {r['value']:.3f} | "
                  f"{interval(r['minus_fixed'])} |" for r in rows]
    hard = doc["hard_p"]
    lines += ["", f"## p-hop at p = {hard['p']} ({hard['unscored']:.1%} of positions unscored; "
              f"{hard['unscored_at_p6']:.1%} at p = 6): accuracy at K', mean over seeds", "",
              "| passing, training | seeds | learned | " + " | ".join(f"K' = {k}" for k in ks) + " |",
              "|---|---|---|" + "---|" * len(ks)]
    for arm, h in hard["runs"].items():
        lines.append(f"| {arm} | {len(h['seeds'])} | {h['learned']} | " +
                     " | ".join(f"{h['accuracy_at_K'][k]:.3f}" if k in h["accuracy_at_K"] else "–" for k in ks) + " |")
    lines += ["", "## Language modelling (tiny MeSH, Python manual): bits per byte at K' loops", "",
              "| training | " + " | ".join(f"K' = {k}" for k in map(str, LM_KS)) + " |", "|---|" + "---|" * len(LM_KS)]
    for sampler, bpb in doc["lm_bits_per_byte_at_K"].items():
        lines.append(f"| {sampler} | " + " | ".join(f"{bpb[k]:.4f}" for k in map(str, LM_KS)) + " |")
    if doc["lm_random_minus_fixed"]:
        lines.append("| random - fixed | " + " | ".join(interval(doc["lm_random_minus_fixed"][k], "{:+.4f}")
                                                      for k in map(str, LM_KS)) + " |")
    lines += ["", "Adaptive exit (up to 8 loops) minus the same model at fixed K' of equal mean loops, paired by seed:",
              "", "| training | τ | mean loops | bits per byte | exit - fixed K' |", "|---|---|---|---|---|"]
    for sampler, rows in doc["lm_exit_vs_fixed"].items():
        lines += [f"| {sampler} | {r['threshold']:g} | {r['mean_loops']:.2f} | {r['value']:.4f} | "
                  f"{interval(r['minus_fixed'], '{:+.4f}')} |" for r in rows]
    return "\n".join(lines) + "\n"


def figures(doc, runs, exits, lm, hard=None):
    """One figure a question: p-hop accuracy at K'; the p-hop exit curves; the harder p at K'; LM bits per
    byte at K' and exits."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = dict(base="tab:blue", anchor="tab:green", mesh="tab:red")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (passing, sampler), rs in sorted(runs.items()):
        ks = [k for k in phop.MEASURED_KS if all(str(k) in r["test_time_K"] for r in rs.values())]
        for i, r in enumerate(rs.values()):
            ax.plot(ks, [r["test_time_K"][str(k)] for k in ks], color=colors[passing], alpha=0.25, lw=0.8,
                    ls="-" if sampler != "fixed" else "--")
        mean = doc["phop_accuracy_at_K"][f"{passing} {sampler}"]
        ax.plot(ks, [mean[str(k)] for k in ks], color=colors[passing], lw=2, ls="-" if sampler != "fixed" else "--",
                marker="o", ms=3, label=f"{passing}, {'random depth' if sampler != 'fixed' else 'fixed K = 4'} "
                                         f"({len(rs)} seeds)")
    ax.axvline(4, color="gray", lw=0.5)
    ax.set(xscale="log", xticks=phop.MEASURED_KS, xticklabels=phop.MEASURED_KS, xlabel="loops at test time K'",
           ylabel="accuracy (scored positions)", title="p-hop, p = 6: loops at test time")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "phop_test_time_K.png"), dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, curve in sorted(exits.items()):
        run = runs[(name.split("_")[0], SAMPLER)][int(name.split("_s")[1].split("_")[0])]
        passing = run["arm"]
        ax.plot([c["mean_loops"] for c in curve], [c["accuracy"] for c in curve], color=colors[passing],
                marker="o", ms=3, lw=1)
        ks = phop.MEASURED_KS
        ax.plot(ks, [run["test_time_K"][str(k)] for k in ks], color=colors[passing], ls=":", lw=1)
    for passing in PASSINGS:
        ax.plot([], [], color=colors[passing], marker="o", ms=3, label=f"{passing}: exit at τ")
    ax.plot([], [], color="gray", ls=":", label="fixed K' (same model)")
    ax.set(xscale="log", xticks=phop.MEASURED_KS, xticklabels=phop.MEASURED_KS, xlabel="mean loops per position",
           ylabel="accuracy", title="p-hop, random-depth models: adaptive exit against fixed K'")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "phop_exit.png"), dpi=120)
    plt.close(fig)

    if hard:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for (passing, sampler), rs in sorted(hard.items()):
            ks = [k for k in phop.MEASURED_KS if all(str(k) in r["test_time_K"] for r in rs.values())]
            for s, r in sorted(rs.items()):
                ax.plot(ks, [r["test_time_K"][str(k)] for k in ks], color=colors[passing], marker="o", ms=3,
                        ls="-" if sampler != "fixed" else "--", lw=1,
                        label=f"{passing}, {'random depth' if sampler != 'fixed' else 'fixed K = 4'}, seed {s}")
        ax.axvline(4, color="gray", lw=0.5)
        ax.set(xscale="log", xticks=phop.MEASURED_KS, xticklabels=phop.MEASURED_KS, xlabel="loops at test time K'",
               ylabel="accuracy (scored positions)", title=f"p-hop, p = {phop.HARD_P}: does looping more solve it?")
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(os.path.join(OUT, "phop_hard.png"), dpi=120)
        plt.close(fig)

    if not lm:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for d in lm:
        color = "tab:red" if d["sampler"] != "fixed" else "tab:gray"
        left.plot(LM_KS, [d["bits_per_byte_at_K"][str(k)] for k in LM_KS], color=color, marker="o", ms=3,
                  label=f"{'random depth (mean 2)' if d['sampler'] != 'fixed' else 'fixed K = 2'}" if d["seed"] == 0 else None)
        right.plot([e["mean_loops"] for e in d["exits"]], [e["bits_per_byte"] for e in d["exits"]], color=color,
                   marker="o", ms=3)
        right.plot(LM_KS, [d["bits_per_byte_at_K"][str(k)] for k in LM_KS], color=color, ls=":", lw=1)
    left.set(xlabel="loops at test time K'", ylabel="val bits per byte", title="tiny MeSH LM: loops at test time")
    right.set(xlabel="mean loops per token", ylabel="val bits per byte", title="adaptive exit (solid) vs fixed K' (dotted)")
    left.legend(fontsize=7)
    for a in (left, right):
        a.set_xscale("log")
        a.set_xticks(LM_KS, LM_KS)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "lm.png"), dpi=120)
    plt.close(fig)


def report():
    """Exits on every finished random-depth p-hop run (cached in OUT/phop_exits.json), every finished LM run's
    evaluation, the summary (OUT/report.json, report.md) and the figures."""
    os.makedirs(OUT, exist_ok=True)
    runs = phop_runs()
    cache_path = os.path.join(OUT, "phop_exits.json")
    exits = json.load(open(cache_path)) if os.path.exists(cache_path) else {}
    for rs in (rs for (_, sampler), rs in runs.items() if sampler == SAMPLER):
        for r in rs.values():
            if r["name"] not in exits or exits[r["name"]][0].get("commit") != r["commit"]:
                exits[r["name"]] = [dict(c, commit=r["commit"]) for c in phop_exits(r)]
                print(f"exits: {r['name']}")
    with open(cache_path, "w") as f:
        json.dump(exits, f, indent=1)
    lm = []
    for sampler in ("fixed", SAMPLER):
        for seed in LM_SEEDS:
            if os.path.exists(os.path.join(LM_CKPTS, lm_name(sampler, seed), "ckpt.pt")):
                lm.append(lm_evaluate(sampler, seed))
                print(f"lm: {lm[-1]['name']}")
    hard = phop_runs(phop.HARD_P, seeds=None)
    doc = dict(summarise(runs, lm, exits, hard), phop_exits=exits, commit=git_commit())
    with open(os.path.join(OUT, "report.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(OUT, "report.md"), "w") as f:
        f.write(markdown(doc))
    figures(doc, runs, exits, lm, hard)
    print(markdown(doc))


@keeps_process_state
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lm", action="store_true", help="train the language-model runs (resumable)")
    ap.add_argument("--report", action="store_true", help="exits, tables and figures of what finished")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.lm:
        for seed in LM_SEEDS:
            for sampler in ("fixed", SAMPLER):
                lm_train(sampler, seed)
    if args.report:
        report()
    if not (args.lm or args.report):
        ap.error("give --lm or --report")


if __name__ == "__main__":
    main()
