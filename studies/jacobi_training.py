"""
T²MLR trained in parallel (Jacobi sweeps) against token by token (exact), on the word problem of A5.

The word-problem study (studies/word_problem.py) trains T²MLR exactly, on words of n = 16 = D, where a Jacobi
forward is exact anyway. A user with a GPU trains with Jacobi sweeps (D = 16, b = 4: T²MLR paper §3.3) on
sequences longer than D. This study trains the same T²MLR (the word-problem recipe: A5, the length curriculum,
256 words a step, 2,000 steps) each way and asks where Jacobi training loses:

- exact vs Jacobi D = 16, b = 4 at n = 32, and the control at n = 16 (the forward is exact there: only the
  gradient is cut after b sweeps);
- the positions past the exactness front: D = 32, b = 4 at n = 32 (the forward exact again);
- the gradient cut: D = 16, b = 15 at n = 32;
- the start of the sweeps: D = 16, b = 4 at n = 32 from one pass of the middle layers without the gate
  (jacobi_init "ungated", as the T²MLR code starts them) rather than from R = 0.

Each run is word_problem.run_one's (resumable; two processes share the runs through its lock), tested at
every position up to 4n. Its JSON records the commit, train_n, D, b and the mode.

    python -m studies.jacobi_training --worker          # every run of PLAN in order (skips finished ones)
    python -m studies.jacobi_training --report          # report.json, report.md and the figure
    python -m studies.jacobi_training --arm jacobi_D16_b4 --n 32 --seed 0   # one run
    python -m studies.jacobi_training --cost            # time and memory a step, arm by arm (cost.json)
    python -m studies.jacobi_training --converged       # sweeps a converged forward takes (exact-trained)
"""

import argparse
import os
import sys
import time

import torch

from bench import SavedTensorMeter
from studies import word_problem as wp
from studies.common import git_commit, read_json, write_json
from studies.reproduce.stats import mean_std, paired_stats
from support.accounting import count_middle_passes
from support.process import keeps_process_state
from support.runtime import RunError

# arm -> (training mode, D = jacobi_sweeps, b = jacobi_grad_sweeps, jacobi_lag); exact training uses
# none. The recipes "lag": D = T - lag for words of T tokens, so D follows the curriculum's length. An arm
# in PLAIN_START starts its sweeps from an ungated pass of the middle layers (jacobi_init "ungated"), not
# R = 0.
ARMS = {"exact": ("exact", None, None, 0), "jacobi_D16_b4": ("jacobi", 16, 4, 0),
        "jacobi_D16_b4_plain": ("jacobi", 16, 4, 0),
        "jacobi_D32_b4": ("jacobi", 32, 4, 0), "jacobi_D16_b15": ("jacobi", 16, 15, 0),
        "jacobi_lag1_b4": ("jacobi", 16, 4, 1), "jacobi_lag4_b4": ("jacobi", 16, 4, 4),
        "jacobi_lag1_b15": ("jacobi", 16, 15, 1)}
PLAIN_START = {"jacobi_D16_b4_plain"}
SEEDS = (0, 1, 2)
# the order runs are trained in: the comparison and its control seed by seed, then the isolating arms
PLAN = ([(arm, n, s) for s in SEEDS for arm, n in (("exact", 32), ("jacobi_D16_b4", 32), ("exact", 16),
                                                     ("jacobi_D16_b4", 16))]
        + [(arm, 32, s) for s in SEEDS for arm in ("jacobi_D32_b4", "jacobi_D16_b15")]
        + [("jacobi_lag1_b4", 32, s) for s in SEEDS] + [("jacobi_D16_b4_plain", 32, s) for s in SEEDS])
GROUP = "A5"
OUT = "studies/results/jacobi_training"
FIGURE = "studies/results/jacobi_training/jacobi_training.png"
CKPT = "out/jacobi_training"                  # the runs' checkpoints


def spec(arm, n, seed, size=wp.FULL):
    """word_problem.run_one's spec: T²MLR under the word-problem recipe at training length n, tested at
    positions 1..4n, trained in `arm`'s mode with its D and b."""
    mode, D, b, lag = ARMS[arm]
    size = dict(size, train_n=n, test_n=4 * n)
    model = wp.matched_arms(size, GROUP)["t2mlr"]
    if mode == "jacobi":
        jacobi = {"jacobi_sweeps": D, "jacobi_grad_sweeps": b} | ({"jacobi_lag": lag} if lag else {}) \
            | ({"jacobi_init": "ungated"} if arm in PLAIN_START else {})
        model = dict(model, config=model["config"] | jacobi)
    return wp.spec_of(size, "jacobi", GROUP, "t2mlr", seed, model, None, mode, tag=f"_{arm}_n{n}")


def run(arm, n, seed, out=OUT, ckpt=CKPT, size=wp.FULL, log=print):
    """Train (or resume, or return) one run; its JSON gains the commit, train_n, D, b and mode."""
    s = spec(arm, n, seed, size)
    paths = {"runs": out, "ckpt": ckpt}
    result = wp.run_locked(s, paths, log, size.get("device", "cpu"))
    if result is not None and "commit" not in result:
        mode, D, b, lag = ARMS[arm]
        D = f"T - {lag}" if lag else D                    # the recipe: D follows the length T
        result |= {"commit": git_commit(), "arm": arm, "train_n": n, "D": D, "b": b, "mode": mode}
        write_json(wp.run_json(paths, s), result)
    return result


def length_reached_at(r, n):
    """The step the curriculum first trained length n (the full training length); None if never."""
    return r.get("curriculum_lengths", {}).get(str(n))


def summary(r):
    n = r["train_n"]
    acc = r["acc_by_position"]
    lengths = [int(L) for L in r.get("curriculum_lengths", {})]
    return {"in_dist": sum(acc[:n]) / n, "beyond": sum(acc[n:]) / len(acc[n:]),
            "steps_to_length": length_reached_at(r, n), "longest": max(lengths, default=None)}


def finished_runs(out=OUT):
    """(arm, train_n, seed) -> the run's JSON, for every finished run in out."""
    runs = {}
    for name in sorted(os.listdir(out)) if os.path.isdir(out) else []:
        if name.startswith("jacobi_") and name.endswith(".json"):
            r = read_json(os.path.join(out, name))
            if "arm" in r:
                runs[(r["arm"], r["train_n"], r["spec"]["seed"])] = r
    return runs


def report(out=OUT, figure=FIGURE):
    """Per (arm, n): the seeds' accuracies and the step the curriculum reached n; paired Δ to exact at the
    same n with 95% t intervals; then cost.json's time and memory a step and converged_sweeps.json, where
    measured. Writes out/report.json, report.md and the figure (curriculum length over steps, accuracy by
    position)."""
    runs = finished_runs(out)
    rows = []
    for arm, n in dict.fromkeys([(a, n) for a, n, _ in PLAN] + sorted({(a, n) for a, n, _ in runs})):
        mine = {s: summary(runs[(arm, n, s)]) for s in SEEDS if (arm, n, s) in runs}
        if not mine:
            continue
        exact = {s: summary(runs[("exact", n, s)]) for s in SEEDS if ("exact", n, s) in runs}
        row = {"arm": arm, "train_n": n, "D": runs[(arm, n, min(mine))]["D"], "b": ARMS[arm][2],
               "seeds": sorted(mine)}
        for key in ("in_dist", "beyond"):
            row[key] = mean_std([m[key] for m in mine.values()])
        row["steps_to_length"] = {s: m["steps_to_length"] for s, m in mine.items()}
        row["longest"] = {s: m["longest"] for s, m in mine.items()}
        if arm != "exact" and set(mine) & set(exact):
            row["beyond_minus_exact"] = paired_stats({s: m["beyond"] for s, m in mine.items()},
                                                     {s: m["beyond"] for s, m in exact.items()})
        rows.append(row)
    write_json(os.path.join(out, "report.json"), {"group": GROUP, "rows": rows})
    lines = ["| arm | n | D | b | seeds | positions 1..n | positions n+1..4n | Δ to exact [95% CI] | "
             "step reaching n, per seed (never: the longest reached) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r.get("beyond_minus_exact")
        ci = (f"{d['diff']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]" if d["ci"] else
              f"{d['diff']:+.3f} (one seed: no interval)") if d else "—"
        spread = f" ± {r['beyond'][1]:.3f}" if len(r["seeds"]) > 1 else f" (seed {r['seeds'][0]})"
        reached = ", ".join(str(step) if step is not None else f"never ({r['longest'][s]})"
                            for s, step in r["steps_to_length"].items())
        lines.append(f"| {r['arm']} | {r['train_n']} | {r['D'] or '—'} | {r['b'] or '—'} | {len(r['seeds'])} | "
                     f"{r['in_dist'][0]:.3f} | {r['beyond'][0]:.3f}{spread} | {ci} | {reached} |")
    cost_path = os.path.join(out, "cost.json")
    if os.path.exists(cost_path):
        lines += ["", "| arm | T | s/step | × exact | × Jacobi D = 16 | MiB held for backward | × exact | "
                  "× Jacobi D = 16 |", "|---|---|---|---|---|---|---|---|"]
        for c in read_json(cost_path)["rows"]:
            lines.append(f"| {c['arm']} | {c['T']} | {c['seconds_per_step']:.3f} | {c['time_vs_exact']:.2f} | "
                         f"{c['time_vs_D16']:.2f} | {c['held_bytes'] / 2 ** 20:.0f} | {c['held_vs_exact']:.2f} | "
                         f"{c['held_vs_D16']:.2f} |")
    converged_path = os.path.join(out, "converged_sweeps.json")
    if os.path.exists(converged_path):
        conv = read_json(converged_path)
        tols = list(conv["rows"][0]["tol"]) if conv["rows"] else []
        lines += ["", "| exact-trained seed | " + " | ".join(f"sweeps at tol {t}" for t in tols) + " |",
                  "|---|" + "---|" * len(tols)]
        for c in conv["rows"]:
            lines.append(f"| {c['seed']} | " + " | ".join(
                f"{c['tol'][t]['sweeps']} (agrees with exact {c['tol'][t]['agrees_with_exact']:.3f})"
                for t in tols) + " |")
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if figure and runs:
        draw(runs, figure, n=max(k[1] for k in runs))
    return rows


def draw(runs, path, n=32):
    """Left: the curriculum's length over steps, one line per run at training length n; right: accuracy
    by position 1..4n, each arm's mean over its seeds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    arms = [a for a in ARMS if any(k[:2] == (a, n) for k in runs)]
    colours = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for (arm, train_n, seed), r in sorted(runs.items()):
        if train_n != n:
            continue
        reached = sorted((step, int(L)) for L, step in r.get("curriculum_lengths", {}).items())
        steps = [0] + [s for s, _ in reached] + [r["steps"]]
        lengths = [2] + [L for _, L in reached] + [reached[-1][1] if reached else 2]
        left.step(steps, lengths, where="post", color=colours[arm], alpha=0.8,
                  label=arm if seed == min(s for a, m, s in runs if (a, m) == (arm, n)) else None)
    for arm in arms:
        accs = [r["acc_by_position"] for (a, m, _), r in runs.items() if (a, m) == (arm, n)]
        mean = [sum(col) / len(col) for col in zip(*accs)]
        right.plot(range(1, len(mean) + 1), mean, color=colours[arm], label=f"{arm} ({len(accs)} seeds)")
    left.axhline(16, color="grey", lw=0.5, ls=":")                     # D = 16's exactness front
    right.axvline(16, color="grey", lw=0.5, ls=":")
    right.axvline(n, color="black", lw=0.6, ls="--")
    left.set(xlabel="training step", ylabel="curriculum length (positions supervised)",
             title=f"A5, n = {n}: the curriculum (dotted: D = 16)")
    right.set(xlabel="position", ylabel="accuracy (exact evaluation)", ylim=(0, 1.02),
              title=f"accuracy by position (dashed: n = {n}; dotted: 16)")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cost(lengths=(16, 32), arms=("exact", "jacobi_D16_b4", "jacobi_lag1_b4", "jacobi_D32_b4", "jacobi_D16_b15"),
         rounds=3, steps=4, size=wp.FULL, out=OUT, log=print):
    """Each arm's training step (forward, backward, AdamW) on the same words of T tokens (batch 256):
    seconds (the median of `rounds` interleaved rounds of `steps` steps) and the bytes autograd holds for
    backward at most (bench.SavedTensorMeter). Run it with nothing else running. Writes out/cost.json."""
    table = wp.multiplication_table(GROUP)
    seconds = {(arm, T): [] for T in lengths for arm in arms}
    held = {}
    for r in range(rounds):
        for T in lengths:
            for arm in arms:
                s = spec(arm, 32, 0, size)
                torch.manual_seed(0)
                model = wp.build(s["model"]).train()
                opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
                x, y = (t[:, :T] for t in wp.make_batch(table, size["batch_size"], 32, r))

                def step():
                    wp.step_loss(model, x, y, s["train_mode"]).backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                with SavedTensorMeter(exclude=list(model.parameters())) as meter:
                    step()                                             # also the warm-up
                held[(arm, T)] = meter.peak
                t0 = time.perf_counter()
                for _ in range(steps):
                    step()
                seconds[(arm, T)].append((time.perf_counter() - t0) / steps)
                log(f"round {r + 1}/{rounds}, T = {T}, {arm}: {seconds[(arm, T)][-1]:.3f} s a step")
    rows = [{"arm": arm, "T": T, "seconds_per_step": sorted(seconds[(arm, T)])[rounds // 2],
             "held_bytes": held[(arm, T)], "threads": torch.get_num_threads()} for T in lengths for arm in arms]
    by = {(r["arm"], r["T"]): r for r in rows}
    for row in rows:                                     # each against exact and Jacobi D = 16 at its T
        for ref, name in (("exact", "exact"), ("jacobi_D16_b4", "D16")):
            row[f"time_vs_{name}"] = row["seconds_per_step"] / by[(ref, row["T"])]["seconds_per_step"]
            row[f"held_vs_{name}"] = row["held_bytes"] / by[(ref, row["T"])]["held_bytes"]
    write_json(os.path.join(out, "cost.json"), {"commit": git_commit(), "batch_size": size["batch_size"],
                                                "rounds": rounds, "steps": steps, "rows": rows})
    return rows


@torch.no_grad()
def converged_sweeps(arm="exact", n=32, seeds=SEEDS, tols=(0.5, 0.3, 0.1, 1e-2, 1e-3), examples=512,
                     ckpt=CKPT, out=OUT, size=wp.FULL, log=print):
    """The converged forward (jacobi_tol), on models trained exactly: for each tolerance, the sweeps a
    Jacobi forward takes on the test words of length n (D = n at most: exact there) before the state
    moves by less than tol of its RMS, and its accuracy at positions 1..n against the exact forward's.
    Writes out/converged_sweeps.json."""
    table = wp.multiplication_table(GROUP)
    x, y = wp.make_batch(table, examples, n, wp.TEST_SEED)
    rows = []
    for seed in seeds:
        s = spec(arm, n, seed, size)
        path = os.path.join(ckpt, s["name"], "ckpt.pt")
        if not os.path.exists(path):
            continue
        model = wp.build(s["model"]).eval()
        model.load_state_dict(torch.load(path, map_location="cpu", weights_only=False)["model"])
        exact = model(x, mode="exact")[0].argmax(-1)
        row = {"seed": seed, "exact_acc": (exact == y).float().mean().item(), "tol": {}}
        for tol in tols:
            model.cfg.jacobi_sweeps, model.cfg.jacobi_grad_sweeps, model.cfg.jacobi_tol = n, 0, tol
            with count_middle_passes(model) as passes:
                pred = model(x, mode="jacobi")[0].argmax(-1)
            row["tol"][str(tol)] = {"sweeps": passes.n, "acc": (pred == y).float().mean().item(),
                                    "agrees_with_exact": (pred == exact).float().mean().item()}
        rows.append(row)
        log(f"seed {seed}: sweeps {[v['sweeps'] for v in row['tol'].values()]} at tol {list(row['tol'])}")
    write_json(os.path.join(out, "converged_sweeps.json"), {"commit": git_commit(), "arm": arm, "train_n": n,
                                                           "examples": examples, "rows": rows})
    return rows


@keeps_process_state
def main(argv):
    p = argparse.ArgumentParser(prog="python -m studies.jacobi_training", description=__doc__.split("\n")[1])
    p.add_argument("--worker", action="store_true", help="train every run of the plan not yet finished")
    p.add_argument("--report", action="store_true", help="the tables from the finished runs")
    p.add_argument("--cost", action="store_true", help="time and memory a step, arm by arm (nothing else running)")
    p.add_argument("--converged", action="store_true", help="the sweeps a converged forward takes on exact-trained models")
    p.add_argument("--ckpt", default=CKPT, help=f"the runs' checkpoints, for --converged (default {CKPT})")
    p.add_argument("--arm", choices=ARMS, help="one run: its arm")
    p.add_argument("--n", type=int, default=32, help="one run: the training length (default 32)")
    p.add_argument("--seed", type=int, default=0, help="one run: its seed")
    p.add_argument("--out", default=OUT, help=f"the runs' JSON and the report (default {OUT})")
    p.add_argument("--threads", type=int, default=1, help="torch threads (two workers: 1 each)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.n < 2:
        raise RunError(f"--n {args.n}: the training length must be at least 2")
    if args.cost:
        cost(out=args.out)
    if args.converged:
        converged_sweeps(ckpt=args.ckpt, out=args.out)
    if args.arm:
        run(args.arm, args.n, args.seed, args.out)
    elif args.worker:
        for i, (arm, n, seed) in enumerate(PLAN):
            print(f"[{i + 1}/{len(PLAN)}] {arm} n={n} seed {seed}", flush=True)
            run(arm, n, seed, args.out)
    if args.report or args.worker:
        report(args.out)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except RunError as e:
        sys.exit(f"error: {e}")
