"""
Assembling the grid's results: every arm's mean ± std, its paired Δ to the baseline with the 95% interval
(stats.py), the papers' claims with their verdicts, the resolution reached, and the markdown of it all
(studies/results/reproduce.md). Input: the run summaries of summary.py, {run name: summary}.
"""

import math

from .protocol import GAP_MARGIN_NATS_PER_BYTE, LN2, PAPER_EPOCHS, flops_steps
from .stats import mean_std, paired_stats, verdict

# MeSH paper Table 1 (160M, Pile perplexity): the claims below compare against these.
MESH_PAPER_PPL = {"vanilla": 11.31, "base": 11.79, "anchor": 11.63, "mesh": 11.37}


def by_seed(summaries, value):
    """{seed: value(summary)} over a list of summaries."""
    return {s["seed"]: value(s) for s in summaries}


def arm_runs(summaries, study, arm, layout=""):
    return [s for s in summaries.values() if s["study"] == study and s["arm"] == arm and
            (s["layout"] == layout or arm == "vanilla")]


def final_bpb(s):
    return s["final"]["val_bpb"]


def compare(summaries, study, arm, base, layout="", value=final_bpb):
    """paired_stats of arm against base, or None when either has no run yet."""
    a, b = arm_runs(summaries, study, arm, layout), arm_runs(summaries, study, base, layout)
    if not a or not b or not set(by_seed(a, value)) & set(by_seed(b, value)):
        return None
    return paired_stats(by_seed(a, value), by_seed(b, value))


def claim(cid, text, paper, stats, expected_sign, unit="bits/byte", note=""):
    return {"id": cid, "claim": text, "paper": paper, "ours": stats, "unit": unit,
            "verdict": verdict(stats, expected_sign) if expected_sign else None, "note": note}


def paper_delta(a, b):
    """The paper's Δ between two arms in nats per token and relative to b's loss."""
    d = math.log(MESH_PAPER_PPL[a]) - math.log(MESH_PAPER_PPL[b])
    rel = 100 * d / math.log(MESH_PAPER_PPL[b])
    return (
        f"ppl {MESH_PAPER_PPL[a]} vs {MESH_PAPER_PPL[b]}: Δ {d:+.4f} nats/token ({rel:+.2f}% of {b}'s loss)"
    )


def jacobi_gap(d_index):
    """value(summary) = Jacobi-minus-exact val loss (nats) at the d_index-th depth."""
    return lambda s: s["jacobi_gap"]["jacobi"][d_index] - s["jacobi_gap"]["exact"]


def crossover(summaries):
    """Where plain_flops' curve first reaches t2mlr's final val loss (the same curve windows, same seed), by
    linear interpolation in FLOPs: as a multiple of t2mlr's training FLOPs and of the equal-steps plain run's.
    Indicative only: plain_flops is then mid-schedule (its LR not yet annealed), so a run that ended there
    would do better. {seed: {...}} plus the means; None where plain_flops never got there."""
    per_seed = {}
    for t2 in arm_runs(summaries, "t2mlr", "t2mlr"):
        long = [s for s in arm_runs(summaries, "t2mlr", "plain_flops") if s["seed"] == t2["seed"]]
        short = [s for s in arm_runs(summaries, "t2mlr", "plain") if s["seed"] == t2["seed"]]
        if not long:
            continue
        target, long = t2["curve"]["val_loss"][-1], long[0]
        per_step = long["flops_per_token"] * long["tokens_per_step"]
        pts = list(zip(long["curve"]["step"], long["curve"]["val_loss"]))
        at = None
        for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
            if v0 <= target:
                at = s0
                break
            if v1 <= target:
                at = s0 + (s1 - s0) * (v0 - target) / (v0 - v1)
                break
        t2_flops = t2["steps"] * t2["flops_per_token"] * t2["tokens_per_step"]
        plain_flops = (
            short[0]["steps"] * short[0]["flops_per_token"] * short[0]["tokens_per_step"] if short else None
        )
        per_seed[t2["seed"]] = None if at is None else {
            "step": at, "of_t2mlr_flops": at * per_step / t2_flops,
            "of_plain_flops": at * per_step / plain_flops if plain_flops else None}
    found = [v for v in per_seed.values() if v]
    mean = lambda k: sum(v[k] for v in found) / len(found) if found and all(v[k] for v in found) else None
    return {"per_seed": per_seed, "n_reached": len(found), "mean_of_t2mlr_flops": mean("of_t2mlr_flops"),
            "mean_of_plain_flops": mean("of_plain_flops")}


def assemble(pr, summaries):
    """Tables (mean ± std per arm, paired Δ to the baseline with 95% CI), the claims with verdicts, the
    resolution reached, all from the run summaries."""
    tables = {"mesh": {}, "t2mlr": {}, "jacobi_gap": {}, "scale": {}}
    claims, half_widths = [], {"mesh": [], "t2mlr": []}
    for layout_name, layout in pr.layouts:
        rows = {}
        for arm in ["vanilla"] + [a for a in dict(pr.mesh_arms)[layout_name] if a != "vanilla"]:
            runs = arm_runs(summaries, "mesh", arm, layout_name)
            if not runs:
                continue
            m, s = mean_std([final_bpb(r) for r in runs])
            st = compare(summaries, "mesh", arm, "base", layout_name) if arm != "base" else None
            rows[arm] = {"n": len(runs), "mean_bpb": m, "std_bpb": s, "vs_base": st}
            if st and st["half_width"] is not None:
                half_widths["mesh"].append(st["half_width"])
            if arm != "vanilla":
                tables["scale"].setdefault(layout_name, {})[arm] = {
                    when: {k: mean_std([r["scale"][when]["state_rms"][k] for r in runs])[0]
                           for k in runs[0]["scale"][when]["state_rms"]} for when in ("init", "trained")}
        tables["mesh"][layout_name] = {"layout": layout, "baseline": "base", "arms": rows}
        c = lambda a, b, v=final_bpb: compare(summaries, "mesh", a, b, layout_name, v)
        tag = f"{layout_name} ({layout})"
        claims += [
            claim(
                f"mesh-{layout_name}-1",
                f"{tag}: plain recursion (base) lags vanilla",
                paper_delta("base", "vanilla"),
                c("base", "vanilla"),
                +1,
            ),
            claim(
                f"mesh-{layout_name}-2",
                f"{tag}: +anchor improves on base",
                paper_delta("anchor", "base"),
                c("anchor", "base"),
                -1,
            ),
            claim(
                f"mesh-{layout_name}-3",
                f"{tag}: MeSH improves on base",
                paper_delta("mesh", "base"),
                c("mesh", "base"),
                -1,
            ),
            claim(
                f"mesh-{layout_name}-4",
                f"{tag}: MeSH improves on +anchor",
                paper_delta("mesh", "anchor"),
                c("mesh", "anchor"),
                -1,
            ),
            claim(
                f"mesh-{layout_name}-5",
                f"{tag}: MeSH closes most of base's gap to vanilla (Δ mesh - vanilla)",
                paper_delta("mesh", "vanilla"),
                c("mesh", "vanilla"),
                0,
                note="no mechanical verdict: read beside claims 1 and 3",
            ),
        ]
        if "mesh_as_base" in dict(pr.mesh_arms)[layout_name]:
            claims.append(
                claim(
                    f"mesh-{layout_name}-6",
                    f"{tag}: routers initialised as base (mesh_as_base) vs mesh",
                    "not in the paper",
                    c("mesh_as_base", "mesh"),
                    0,
                    note="does the router initialisation explain MeSH vs base? no paper claim",
                )
            )
        diag = lambda key: (lambda s: s["diagnostics"][key])
        paper4 = "MeSH paper §4.1, Fig. 1 (qualitative)"
        claims += [
            claim(
                f"diag-{layout_name}-1a",
                f"{tag}: later loops do more under MeSH than base: relative update of the "
                "last loop (paper's form, divides by state norms)",
                paper4,
                c("mesh", "base", diag("skew_last")),
                +1,
                unit="relative update",
            ),
            claim(
                f"diag-{layout_name}-1b",
                f"{tag}: the same, scale-free: the last loop's update over the first "
                "loop's, each loop's core applied to its input at unit RMS",
                paper4,
                c("mesh", "base", diag("skew_unit_last_over_first")),
                +1,
                unit="ratio",
            ),
            claim(
                f"diag-{layout_name}-2",
                f"{tag}: MeSH's consecutive loop states are less similar (RBF CKA)",
                paper4,
                c("mesh", "base", diag("cka_consecutive")),
                -1,
                unit="CKA",
            ),
            claim(
                f"diag-{layout_name}-3",
                f"{tag}: MeSH's loop states have higher effective rank",
                paper4,
                c("mesh", "base", diag("erank_loops")),
                +1,
                unit="effective rank",
            ),
        ]
    rows = {}
    for arm in ("plain", "t2mlr", "plain_224", "plain_flops"):
        runs = arm_runs(summaries, "t2mlr", arm)
        if runs:
            m, s = mean_std([final_bpb(r) for r in runs])
            st = compare(summaries, "t2mlr", arm, "plain") if arm != "plain" else None
            rows[arm] = {
                "n": len(runs),
                "steps": runs[0]["steps"],
                "mean_bpb": m,
                "std_bpb": s,
                "vs_plain": st,
            }
            if st and st["half_width"] is not None:
                half_widths["t2mlr"].append(st["half_width"])
    equal_flops = compare(summaries, "t2mlr", "plain_flops", "t2mlr")
    paper_epochs = compare(summaries, "t2mlr", "plain_224", "t2mlr")
    if equal_flops and equal_flops["half_width"] is not None:
        half_widths["t2mlr"].append(equal_flops["half_width"])
    tables["t2mlr"] = {"baseline": "plain", "arms": rows, "plain_flops_vs_t2mlr": equal_flops,
                       "plain_224_vs_t2mlr": paper_epochs,
                       "crossover": crossover(summaries)}
    t2 = arm_runs(summaries, "t2mlr", "t2mlr")
    gap16 = None
    if t2:
        for i, d in enumerate(pr.gap_depths):
            gaps = by_seed(t2, jacobi_gap(i))
            m, s = mean_std(list(gaps.values()))
            exact = by_seed(t2, lambda r: r["jacobi_gap"]["exact"])
            st = paired_stats(by_seed(t2, lambda r: r["jacobi_gap"]["jacobi"][i]), exact)
            tables["jacobi_gap"][str(d)] = {
                "mean_nats": m,
                "std_nats": s,
                "mean_bits": m / LN2,
                "stats_nats": st,
            }
            if d == pr.jacobi_sweeps:
                gap16 = st
    claims += [
        claim(
            "t2mlr-1",
            "T²MLR beats plain at equal steps",
            "T²MLR below plain at equal steps",
            compare(summaries, "t2mlr", "t2mlr", "plain"),
            -1,
        ),
        claim(
            "t2mlr-2",
            f"a plain baseline given {PAPER_EPOCHS}x the steps overtakes T²MLR (Δ plain_224 - t2mlr)",
            f"a baseline given {PAPER_EPOCHS}x the epochs overtakes T²MLR",
            paper_epochs,
            -1,
        ),
        claim(
            "t2mlr-2b",
            f"at equal training FLOPs (plain x{flops_steps(pr) / pr.t2mlr_steps:.2f} steps, Δ plain_flops "
            "- t2mlr)",
            "not in the paper",
            equal_flops,
            0,
            note="our question; no paper claim, so no mechanical verdict",
        ),
        claim(
            "t2mlr-3",
            f"Jacobi training (D = {pr.jacobi_sweeps}) and exact evaluation agree (Δ Jacobi - exact)",
            f"within 0.005 nats/token = {GAP_MARGIN_NATS_PER_BYTE:.4f} nats/byte",
            gap16,
            0,
            unit="nats/byte",
            note=f"verdict: reproduced if the 95% CI lies inside ±{GAP_MARGIN_NATS_PER_BYTE:.4f}, "
            "not reproduced if it lies outside",
        ),
    ]
    c3 = claims[-1]
    if gap16 and gap16["ci"]:
        lo, hi = gap16["ci"]
        m = GAP_MARGIN_NATS_PER_BYTE
        c3["verdict"] = ("reproduced" if -m < lo and hi < m else
                         "not reproduced" if lo > m or hi < -m else "not resolvable at this scale")
    resolution = {
        study: (
            {"min": min(h), "median": sorted(h)[len(h) // 2], "max": max(h), "n_comparisons": len(h)}
            if h
            else None
        )
        for study, h in half_widths.items()
    }
    return tables, claims, resolution


def fmt_stats(st, digits=4, percent=False):
    """'Δ [lo, hi] (n pairs)', and with percent=True Δ as a % of the baseline's mean as well."""
    if st is None:
        return "—"
    pct = f", {100 * st['diff'] / st['baseline_mean']:+.2f}%" if percent and st["baseline_mean"] else ""
    if st["ci"] is None:
        return f"{st['diff']:+.{digits}f} (n = 1{pct})"
    low, high = st['ci']
    return f"{st['diff']:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}] (n = {st['n']}{pct})"


def markdown(pr, tables, claims, resolution):
    """The tables and claims as markdown (studies/results/reproduce.md), for the README and docs."""
    lines = ["## MeSH study: final val loss (bits/byte), mean ± std over seeds; paired Δ to base, 95% CI", ""]
    for layout_name, t in tables["mesh"].items():
        lines += [f"### {layout_name}: {t['layout']}", "", "| arm | n | bits/byte | Δ to base [95% CI] |",
                  "|---|---|---|---|"]
        for arm, r in t["arms"].items():
            lines.append(f"| {arm} | {r['n']} | {r['mean_bpb']:.4f} ± {r['std_bpb']:.4f} | "
                         f"{fmt_stats(r['vs_base'])} |")
        lines.append("")
    t = tables["t2mlr"]
    lines += ["## T²MLR study: final val loss (bits/byte, exact mode); paired Δ to plain, 95% CI", "",
              "| arm | steps | n | bits/byte | Δ to plain [95% CI] |", "|---|---|---|---|---|"]
    for arm, r in t["arms"].items():
        lines.append(f"| {arm} | {r['steps']} | {r['n']} | {r['mean_bpb']:.4f} ± {r['std_bpb']:.4f} | "
                     f"{fmt_stats(r['vs_plain'])} |")
    cr = t["crossover"]
    lines += [
        "",
        f"Equal FLOPs, Δ plain_flops − t2mlr: {fmt_stats(t['plain_flops_vs_t2mlr'])} bits/byte; "
        f"{PAPER_EPOCHS}x steps, Δ plain_224 − t2mlr: {fmt_stats(t['plain_224_vs_t2mlr'])} bits/byte",
        "",
        f"plain_flops reaches t2mlr's final loss (curve windows) in {cr['n_reached']} of "
        f"{len(cr['per_seed'])} "
        "seeds"
        + (
            f", on average at {cr['mean_of_t2mlr_flops']:.2f}x t2mlr's training FLOPs = "
            f"{cr['mean_of_plain_flops']:.2f}x the equal-steps plain run's (mid-schedule: indicative)"
            if cr["mean_of_plain_flops"]
            else ""
        ),
        "",
        "## Jacobi − exact val loss of the trained T²MLR models (nats/byte), mean ± std [95% CI]",
        "",
        "| D | gap (nats) | 95% CI | gap (bits) |",
        "|---|---|---|---|",
    ]
    for d, g in tables["jacobi_gap"].items():
        ci = g["stats_nats"]["ci"]
        lines.append(f"| {d} | {g['mean_nats']:+.5f} ± {g['std_nats']:.5f} | "
                     + (f"[{ci[0]:+.5f}, {ci[1]:+.5f}]" if ci else "—") + f" | {g['mean_bits']:+.5f} |")
    lines += ["", "## State RMS (mean over seeds and val windows): at init → trained", ""]
    for layout_name, arms in tables["scale"].items():
        states = list(next(iter(arms.values()))["trained"])
        lines += [
            f"### {layout_name}",
            "",
            "| arm | " + " | ".join(states) + " |",
            "|---" * (len(states) + 1) + "|",
        ]
        for arm, sc in arms.items():
            cells = " | ".join(f"{sc['init'][k]:.2f} → {sc['trained'][k]:.2f}" for k in states)
            lines.append(f"| {arm} | {cells} |")
        lines.append("")
    lines += ["## Claims", "", "| id | claim | paper | ours: Δ [95% CI] | verdict |", "|---|---|---|---|---|"]
    for c in claims:
        lines.append(
            f"| {c['id']} | {c['claim']} | {c['paper']} | {fmt_stats(c['ours'], percent=True)} {c['unit']} | "
            f"{c['verdict'] or '—'}{' (' + c['note'] + ')' if c['note'] else ''} |"
        )
    lines += ["", "## Resolution reached (half-width of the paired 95% CIs, bits/byte)", ""]
    for study, r in resolution.items():
        lines.append(f"- {study}: " + (f"{r['min']:.4f} – {r['max']:.4f}, median {r['median']:.4f} "
                                       f"({r['n_comparisons']} comparisons)" if r else "none yet"))
    return "\n".join(lines) + "\n"

