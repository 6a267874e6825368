"""
One finished run's numbers, as stored in studies/results/reproduce/<run>.json: its curves (from train.py's
log), the final val loss over the val split (exact mode for T²MLR), and the measurements its study needs:
the MeSH §4 probes (studies.probe) with the state-scale diagnostics of scale_probe for recursive models,
the Jacobi-vs-exact gap at every depth for T²MLR.
"""

import contextlib
import os
import re

import torch

from studies import probe
from support.accounting import param_counts, train_flops_per_token
from support.checkpoints import load_model
from support.data import get_batch, load_meta, val_starts
from support.loop import evaluate

from .protocol import LN2, initial_model
from .runs import read_log, rounded


def val_loss(model, data_dir, meta, starts, batch_size, mode=None):
    """The mean val loss (nats per token) of `model` on the CPU over the val windows `starts`, in batches of
    batch_size, fp32; mode: a T²MLR model's evaluation mode ('exact', 'jacobi'; None: its default)."""
    path, T = os.path.join(data_dir, "val.bin"), model.cfg.block_size
    batches = (get_batch(path, meta["dtype"], starts[i:i + batch_size], T, "cpu")
               for i in range(0, len(starts), batch_size))
    return evaluate(model, batches, "cpu", contextlib.nullcontext(), mode)


def block_layers(model, name):
    """The layers a probe unit name stands for: prelude, core<t>, coda, layer<i>."""
    p, c, _, _ = model.cfg.depth
    layers = list(model.layers)
    if name == "prelude":
        return layers[:p]
    if name.startswith("core"):
        return layers[p:p + c]
    if name == "coda":
        return layers[p + c:]
    return [layers[int(name.removeprefix("layer"))]]


@torch.no_grad()
def scale_probe(model, seqs, batch_size=8):
    """What a difference in state scale does to the skew diagnostic (vanilla and recursive models).

    For every state: its RMS. For every unit (probe.depth_probe's: prelude, core loops, coda): the RMS of its
    input h and of its update f(h) - h, the paper's relative update 2‖f(h)−h‖/(‖f(h)‖+‖h‖), and the same
    measure with the unit applied to its input rescaled to RMS 1 per sequence (skew_unit). The relative
    update divides by state norms, and a pre-norm unit's update barely depends on its input's scale, so a
    model with smaller states shows a larger skew for the same update; skew_unit compares units at one
    scale. Means over sequences."""
    model.eval()
    states, per_block = {}, {}
    for i in range(0, len(seqs), batch_size):
        blocks, st = probe.depth_probe(model, seqs[i:i + batch_size])
        for name, h in st.items():
            states.setdefault(name, []).append(h.double().pow(2).mean(dim=(1, 2)).sqrt())
        for name, h, f_h in blocks:
            rms = h.double().pow(2).mean(dim=(1, 2)).sqrt()
            unit = h / rms.to(h.dtype)[:, None, None]
            f_unit = model.run_layers(unit, block_layers(model, name), 0)
            row = per_block.setdefault(name, {"rms_in": [], "rms_update": [], "skew": [], "skew_unit": []})
            row["rms_in"].append(rms)
            row["rms_update"].append((f_h - h).double().pow(2).mean(dim=(1, 2)).sqrt())
            row["skew"].append(probe.relative_update(h, f_h))
            row["skew_unit"].append(probe.relative_update(unit, f_unit))
    mean = lambda v: torch.cat(v).mean().item()
    out = {"state_rms": {k: mean(v) for k, v in states.items()}, "blocks": list(per_block)}
    for key in ("rms_in", "rms_update", "skew", "skew_unit"):
        out[key] = [mean(per_block[b][key]) for b in per_block]
    return out


def diagnostics(result, scale):
    """The per-run numbers the §4 claims are tested on (recursive models), from run_probe's and scale_probe's
    results: the last core loop's relative update (paper's form and at unit RMS) and its ratio to the first
    loop's, the mean RBF CKA between consecutive loop states h(t), h(t+1), the mean effective rank of the loop
    outputs h(1..K), and h(0)'s RMS."""
    blocks = result["skew"]["blocks"]
    cores = [i for i, b in enumerate(blocks) if b.startswith("core")]
    skew, unit = result["skew"]["mean"], scale["skew_unit"]
    names = result["cka"]["states"]
    loop_states = [n for n in names if re.fullmatch(r"h\(\d+\)", n)]             # h(0) .. h(K)
    idx = [names.index(n) for n in loop_states]
    rbf = result["cka"]["rbf"]
    erank = result["spectra"]["effective_rank"]
    return {"skew_last": skew[cores[-1]], "skew_unit_last": unit[cores[-1]],
            "skew_last_over_first": skew[cores[-1]] / skew[cores[0]],
            "skew_unit_last_over_first": unit[cores[-1]] / unit[cores[0]],
            "cka_consecutive": sum(rbf[a][b] for a, b in zip(idx, idx[1:])) / (len(idx) - 1),
            "erank_loops": sum(erank[n][0] for n in loop_states[1:]) / (len(loop_states) - 1),
            "rms_h0": scale["state_rms"]["h(0)"]}


def compact_probe(result):
    """probe.run_probe's result without the per-cell stds (kept small for the JSON)."""
    sp = result["spectra"]
    return {
        "skew": result["skew"],
        "cka": {k: result["cka"][k] for k in ("states", "rbf", "linear")},
        "spectra": {
            "states": sp["states"],
            "ratio_mean": sp["ratio_mean"],
            "effective_rank": sp["effective_rank"],
        },
    }


def summarize(run, out_dir, data_dir, pr):
    """The run's summary: config, curves (val loss in nats per token, as train.py logs it), final val loss
    over the val split, and for MeSH-study recursive models the probe numbers and scale diagnostics (trained
    and at init), for T²MLR the exact and Jacobi losses at every depth of the gap table."""
    headers, val, loss = read_log(out_dir)
    model, ckpt = load_model(os.path.join(out_dir, "ckpt.pt"), "cpu")
    T = model.cfg.block_size
    meta = load_meta(data_dir, T)
    n_final = pr.final_windows or (meta["val_tokens"] - 1) // T
    exact = "exact" if model.cfg.t2mlr else None
    evaluate = lambda starts, mode: val_loss(model, data_dir, meta, starts, pr.batch_size, mode)
    final = evaluate(val_starts(meta["val_tokens"], T, n_final), exact)
    fpt = train_flops_per_token(model)
    out = {
        "name": run.name,
        "study": run.study,
        "arm": run.arm,
        "layout": run.layout,
        "seed": run.seed,
        "config": run.fingerprint(),
        "data": {k: meta[k] for k in ("tokenizer", "train_tokens", "val_tokens")},
        "params": param_counts(model),
        "flops_per_token": fpt,
        "tokens_per_step": pr.total_batch_size,
        "steps": run.steps,
        "curve": {
            "step": list(val),
            "val_loss": list(val.values()),
            "windows": pr.eval_iters * pr.batch_size,
        },
        "train_curve": {"step": list(loss), "loss": list(loss.values())},
        "final": {
            "val_loss": final,
            "val_bpb": final / LN2,
            "windows": n_final,
            "tokens": n_final * T,
            "mode": exact or "plain",
        },
    }
    if run.study == "mesh" and model.cfg.layout:
        seqs, _, _ = probe.validation_sequences(ckpt, pr.probe_seqs, T, data_dir)
        result = probe.run_probe(model, seqs, top=32)
        scale = scale_probe(model, seqs)
        out["probe"] = compact_probe(result)
        out["scale"] = {"trained": scale, "init": scale_probe(initial_model(run).eval(), seqs)}
        out["diagnostics"] = diagnostics(result, scale)
    if model.cfg.t2mlr:
        starts = val_starts(meta["val_tokens"], T, pr.gap_windows)
        gap = {"depths": list(pr.gap_depths), "windows": pr.gap_windows, "exact": evaluate(starts, "exact"),
               "jacobi": []}
        trained_d = model.cfg.jacobi_sweeps
        for d in pr.gap_depths:
            model.cfg.jacobi_sweeps = d               # the sweeps only; b is irrelevant without gradients
            gap["jacobi"].append(evaluate(starts, "jacobi"))
        model.cfg.jacobi_sweeps = trained_d
        out["jacobi_gap"] = gap
    return rounded(out)

