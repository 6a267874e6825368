"""
Two Jacobi side studies of trained T²MLR models, each a subcommand:

    python -m studies.reproduce starts CKPT ...      # Jacobi - exact val loss from the zero and ungated starts
    python -m studies.reproduce tolerance --fixed DIR ... --tol DIR ...   # fixed D against jacobi_tol

They write studies/results/jacobi_starts.json and studies/results/jacobi_tol.json (the latter's runs:
studies/results/jacobi_tol_run.sh).
"""

import argparse
import json
import os

from support.checkpoints import load_model
from support.data import load_meta, val_starts
from support.runtime import RunError

from .runs import read_log, write_json
from .stats import mean_std
from .summary import val_loss


def starts_main(argv):
    """`python -m studies.reproduce starts CKPT ...`: the Jacobi-minus-exact val loss of trained T²MLR
    checkpoints at D = 1, 2, 4, 8, 16 from both starts, jacobi_init "zero" (ours) and "ungated" (the
    T²MLR code's warm start), on the same val windows. Prints a table and writes the numbers to --out
    (JSON)."""
    p = argparse.ArgumentParser(prog="python -m studies.reproduce starts",
                                description=starts_main.__doc__.split("\n\n")[0])
    p.add_argument("checkpoints", nargs="+", help="ckpt.pt files of trained T²MLR models")
    p.add_argument("--data_dir", default="data/fineweb_byte", help="the data the models were trained on")
    p.add_argument("--windows", type=int, default=64, help="val windows (default 64, as the gap table)")
    p.add_argument("--out", default="studies/results/jacobi_starts.json")
    args = p.parse_args(argv)
    rows = []
    for path in args.checkpoints:
        model, ckpt = load_model(path, "cpu")
        if not model.cfg.t2mlr:
            raise RunError(f"{path} is not a T²MLR model")
        T = model.cfg.block_size
        meta = load_meta(args.data_dir, T)
        starts = val_starts(meta["val_tokens"], T, args.windows)
        loss = lambda mode: val_loss(model, args.data_dir, meta, starts, 16, mode)
        row = {
            "checkpoint": path,
            "exact": loss("exact"),
            "depths": [1, 2, 4, 8, 16],
            "zero": [],
            "ungated": [],
        }
        for D in row["depths"]:
            model.cfg.jacobi_sweeps = D
            for init in ("zero", "ungated"):
                model.cfg.jacobi_init = init
                row[init].append(loss("jacobi") - row["exact"])
        rows.append(row)
        print(f"{path}: exact {row['exact']:.5f} nats/byte; Jacobi - exact, zero / ungated start: " + ", ".join(
            f"D {d}: {z:+.6f} / {q:+.6f}" for d, z, q in zip(row["depths"], row["zero"], row["ungated"])))
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
    model, ckpt = load_model(os.path.join(out_dir, "ckpt.pt"), "cpu")
    T = model.cfg.block_size
    meta = load_meta(data_dir, T)
    windows = (meta["val_tokens"] - 1) // T
    final = val_loss(model, data_dir, meta, val_starts(meta["val_tokens"], T, windows), 16, "exact")
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
    """`python -m studies.reproduce tolerance --fixed DIR ... --tol DIR ...`: fixed-D Jacobi training
    against jacobi_tol, paired by seed (train.py runs of the same config): wall-clock, mean middle-layer
    passes and the exact val loss of each final checkpoint on the whole val split. Prints a table, writes
    --out (JSON)."""
    p = argparse.ArgumentParser(prog="python -m studies.reproduce tolerance",
                                description=tolerance_main.__doc__.split("\n\n")[0])
    p.add_argument("--fixed", nargs="+", required=True, help="out_dirs of the fixed-D runs")
    p.add_argument("--tol", nargs="+", required=True, help="out_dirs of the jacobi_tol runs")
    p.add_argument("--data_dir", default="data/pydoc", help="the data the runs were trained on")
    p.add_argument("--out", default="studies/results/jacobi_tol.json")
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
    write_json(args.out, {"command": "python -m studies.reproduce tolerance " + " ".join(argv),
                          "data_dir": args.data_dir, "fixed": fixed, "tol": tol, "summary": summary})
    print(f"wrote {args.out}")
    return summary

