"""
The study's figures (under studies/results/reproduce/: curves per study, the forest plot of paired Δs, the MeSH §4
diagnostics), drawn from the run summaries and tables, and the `plot` subcommand: val-loss curves against
steps and training FLOPs of any train.py runs. matplotlib is imported only when a figure is drawn.
"""

import argparse
import json
import os

import torch

from model import GPTConfig
from studies import probe
from support.runtime import RunError

from .protocol import LN2, PAPER_EPOCHS, flops_per_token
from .runs import SYSTEM, read_log
from .stats import mean_std
from .tables import arm_runs

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
# `python -m studies.reproduce plot OUT_DIR ...`: val-loss curves of any train.py runs

def describe_run(model_cfg, train_cfg):
    """A short legend entry from a run's configs: the variant (probe.describe) and its steps."""
    return f"{probe.describe(GPTConfig(**model_cfg))}, {train_cfg['max_iters']} steps"


def plot_main(argv):
    p = argparse.ArgumentParser(
        prog="python -m studies.reproduce plot",
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
            raise RunError(f"{d}/log.jsonl has no evaluation yet")
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

