"""
Does MeSH's gap to base close with more tokens? `python -m studies.reproduce gap DIR [DIR ...]` reads the run
JSONs of one or more MeSH grids (each DIR holds reproduce/<run>.json, e.g. studies/results/lm_long at 1,500
steps and studies/results/lm_12m at 3,000), pairs MeSH with base by seed at every evaluation of the curve
and at the end, and writes the paired Δ (bits/byte, 95% t interval) over training tokens to
studies/results/lm_gap.json and lm_gap.png.
"""

import argparse
import glob
import json
import os

from support.process import keeps_process_state

from .protocol import LN2
from .runs import write_json
from .stats import paired_stats


def load_arm(folder, arm):
    """{seed: run summary} of the K2 runs of `arm` in folder/reproduce/."""
    runs = {}
    for path in glob.glob(os.path.join(folder, "reproduce", f"mesh_K2_{arm}_s*.json")):
        with open(path) as f:
            s = json.load(f)
        runs[s["seed"]] = s
    return runs


def gap_rows(folder, arm="mesh", baseline="base"):
    """One row per curve evaluation, then one for the final val split: tokens seen, and the paired
    arm - baseline difference in bits/byte with its 95% interval."""
    a, b = load_arm(folder, arm), load_arm(folder, baseline)
    first = next(iter(b.values()))
    steps, tokens_per_step = first["curve"]["step"], first["tokens_per_step"]
    rows = []
    for i, step in enumerate(steps):
        st = paired_stats({s: r["curve"]["val_loss"][i] / LN2 for s, r in a.items()},
                          {s: r["curve"]["val_loss"][i] / LN2 for s, r in b.items()})
        rows.append({"step": step, "tokens": step * tokens_per_step, "on": "curve windows",
                     "windows": first["curve"]["windows"], "diff": st["diff"], "ci": st["ci"], "n": st["n"]})
    st = paired_stats({s: r["final"]["val_bpb"] for s, r in a.items()},
                      {s: r["final"]["val_bpb"] for s, r in b.items()})
    rows.append({"step": first["steps"], "tokens": first["steps"] * tokens_per_step, "on": "val split",
                 "windows": first["final"]["windows"], "diff": st["diff"], "ci": st["ci"], "n": st["n"]})
    return rows


def plot(grids, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    for offset, (name, rows) in zip((-0.05, 0.05), grids.items()):
        curve = [r for r in rows if r["on"] == "curve windows" and r["step"] > 0]
        x = [r["tokens"] / 1e6 + offset for r in curve]
        ax.errorbar(x, [r["diff"] for r in curve], yerr=[[r["diff"] - r["ci"][0] for r in curve],
                    [r["ci"][1] - r["diff"] for r in curve]], fmt="o-", capsize=3, label=f"{name}: curve")
        end = rows[-1]
        ax.errorbar([end["tokens"] / 1e6 + offset], [end["diff"]], yerr=[[end["diff"] - end["ci"][0]],
                    [end["ci"][1] - end["diff"]]], fmt="s", color="black", capsize=3)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xlabel("training tokens (millions); squares: the whole val split at the end")
    ax.set_ylabel("MeSH − base (bits/byte)")
    ax.set_title("K = 2 (2+2R2+2), 5 paired seeds, 95% intervals", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


@keeps_process_state
def main(argv):
    p = argparse.ArgumentParser(prog="python -m studies.reproduce gap", description=__doc__)
    p.add_argument("dirs", nargs="+", help="result folders of MeSH grids (each with reproduce/<run>.json)")
    p.add_argument("--out", default="studies/results/lm_gap", help="writes OUT.json and OUT.png")
    args = p.parse_args(argv)
    grids = {f"{load_arm(d, 'base')[1]['steps']} steps": gap_rows(d) for d in args.dirs}
    write_json(args.out + ".json", {"comparison": "mesh - base, K2, bits/byte, paired by seed", "dirs": args.dirs,
                                    "grids": grids})
    plot(grids, args.out + ".png")
    for name, rows in grids.items():
        for r in rows:
            print(f"{name:>11s} {r['tokens'] / 1e6:5.2f}M tokens ({r['on']}): {r['diff']:+.4f} "
                  f"[{r['ci'][0]:+.4f}, {r['ci'][1]:+.4f}]")
    print(f"wrote {args.out}.json, {args.out}.png")
