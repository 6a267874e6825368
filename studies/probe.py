"""
See inside a trained model: MeSH's three diagnostics of the hidden states (MeSH paper §4.1, Fig. 1),
for every variant of model.py (vanilla, base / residual / anchor / anchor* / mesh recursion, T²MLR).

    python -m studies.probe out/tiny_mesh/ckpt.pt              # 64 val sequences, written next to ckpt.pt
    python -m studies.probe out/tiny_mesh/ckpt.pt --num_seqs 500 --out studies/results/probe     # the paper used 500

On N validation windows of block_size tokens (the fixed, evenly strided windows of support.data.val_starts), it
measures

(a) computational skew: the relative update r = 2‖f(h) − h‖_F / (‖f(h)‖_F + ‖h‖_F) of every unit applied
    (read by forward hooks, class Taps), per sequence (Frobenius norm over the T×C matrix), mean ± std over sequences.
    Units: recursive models as the paper (the whole prelude, each core loop with f(h) = the core output before
    any state passing, the whole coda); vanilla per layer; T²MLR per layer plus the gate, once with the
    recurrent state and once with it zeroed (R ≡ 0, so the difference is what the state contributes);
(b) CKA between every pair of probed states, per sequence (tokens are the rows), averaged: RBF kernel with the
    median heuristic as the paper (Kornblith et al. 2019) and linear CKA;
(c) the normalised singular values σ_i/σ_0 (top 50) of each raw state matrix, and its effective rank
    exp(H(σ/Σσ)).

States: h_emb, h(0) .. h(K), h_out for recursive models (the first core layer's input is h(t)); h_emb and every
layer's output (the last is h_out) for vanilla and T²MLR. Writes OUT/probe.json and, if matplotlib is
installed, OUT/probe_skew.png, OUT/probe_cka.png, OUT/probe_spectra.png. All the math is in float64.
"""

import argparse
import json
import math
import os
import sys

import torch

from model import GPTConfig
from support.checkpoints import load_model
from support.data import get_batch, load_meta, val_starts
from support.process import keeps_process_state
from support.runtime import RunError


# -----------------------------------------------------------------------------
# The three measures. Every function takes a batch of per-sequence matrices (B, T, C) and returns one
# value per sequence, computed in float64.

def relative_update(h, f_h):
    """Computational skew of one unit (MeSH paper §4.1): 2‖f(h) − h‖_F / (‖f(h)‖_F + ‖h‖_F) per sequence.
    h, f_h: (B, T, C) -> (B,). 0 for an identity unit, 2 when f(h) = −h."""
    h, f_h = h.double(), f_h.double()
    return 2 * (f_h - h).flatten(1).norm(dim=1) / (f_h.flatten(1).norm(dim=1) + h.flatten(1).norm(dim=1))


def rbf_gram(x, threshold=1.0):
    """RBF Gram matrix with the median heuristic, as Kornblith et al.'s `gram_rbf` (the MeSH paper
    names an RBF kernel but not its bandwidth; the median rule is our choice):
    K_ij = exp(−‖x_i − x_j‖² / (2 σ²)), σ² = threshold² · median of the squared distances (diagonal included).
    x: (B, T, C) -> (B, T, T)."""
    x = x.double()
    sq_dist = torch.cdist(x, x).pow(2)                                     # (B, T, T)
    # the median as np.median: for an even
    flat = sq_dist.flatten(1)
    # count, the mean of the two middle values
    n = flat.shape[1]
    median = (flat.kthvalue((n + 1) // 2, dim=1).values + flat.kthvalue(n // 2 + 1, dim=1).values) / 2
    sigma2 = threshold ** 2 * median                                       # (B,)
    return torch.exp(-sq_dist / (2 * sigma2.clamp_min(1e-300)[:, None, None]))


def linear_gram(x):
    """Linear kernel on column-centred features: K = X_c X_cᵀ. x: (B, T, C) -> (B, T, T)."""
    x = x.double()
    x = x - x.mean(dim=1, keepdim=True)
    return x @ x.transpose(1, 2)


def center_gram(k):
    """H K H with H = I − 11ᵀ/n: centres a Gram matrix (B, T, T) on both sides."""
    k = k - k.mean(dim=1, keepdim=True)
    return k - k.mean(dim=2, keepdim=True)


def cka_matrix(grams):
    """CKA between every pair of states, per sequence: grams (S, B, T, T) of S states -> (B, S, S).

    CKA(K, L) = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)) with HSIC(K, L) = tr(K H L H) / (n−1)²; the (n−1)²
    cancels, so CKA is the cosine between the centred Gram matrices (Frobenius inner product). With linear
    Grams this equals ‖Y_cᵀ X_c‖²_F / (‖X_cᵀ X_c‖_F ‖Y_cᵀ Y_c‖_F).
    """
    g = center_gram(grams.flatten(0, 1)).view(grams.shape[0], grams.shape[1], -1)   # (S, B, T²)
    inner = torch.einsum("sbn,ubn->bsu", g, g)                                       # (B, S, S)
    norms = inner.diagonal(dim1=1, dim2=2).sqrt()                                   # (B, S)
    return inner / (norms[:, :, None] * norms[:, None, :]).clamp_min(1e-300)


def cka(x, y, kernel="rbf"):
    """CKA between two batches of state matrices x, y: (B, T, C) and (B, T, C') -> (B,). kernel: 'rbf' or
    'linear'."""
    gram = rbf_gram if kernel == "rbf" else linear_gram
    return cka_matrix(torch.stack([gram(x), gram(y)]))[:, 0, 1]


def singular_values(x):
    """Singular values σ_0 ≥ σ_1 ≥ ... of each raw matrix (uncentred: the MeSH paper mentions no centring):
    (B, T, C) -> (B, min(T, C))."""
    return torch.linalg.svdvals(x.double())


def effective_rank(sigma):
    """exp of the entropy of p = σ / Σσ (Roy & Vetterli 2007): (B, n) -> (B,). Between 1 and n."""
    p = sigma / sigma.sum(dim=1, keepdim=True)
    return torch.exp(-torch.xlogy(p, p).sum(dim=1))


# -----------------------------------------------------------------------------
# What is probed: units (name, input, output) and states, for one batch of sequences, read from outside the
# model by forward hooks (model.py knows nothing of probes)

class GateCalls:
    """Calls keep(x, r, x') on every call of the gate (T1), GPT.temporal_gate: a method, not a module, so it
    is wrapped on the instance, over any wrapper already there, which exit puts back. Use as a context
    manager."""

    def __init__(self, model, keep):
        self.model, self.saved, inner = model, model.__dict__.get("temporal_gate"), model.temporal_gate

        def wrapped(x, r, *args, **kwargs):
            x_mixed = inner(x, r, *args, **kwargs)
            keep(x, r, x_mixed)
            return x_mixed
        model.temporal_gate = wrapped                 # the instance's attribute shadows the method

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            self.model.__dict__.pop("temporal_gate", None)
        else:
            self.model.temporal_gate = self.saved


class Taps:
    """Forward hooks on `modules` that keep the (input, output) of every call, in order: `calls[module]`.
    The first positional argument is the input (a Layer's h, ln_f's h_out, wte's idx). gate_of: a T²MLR
    model whose gate (T1), GPT.temporal_gate, is kept too, as calls["gate"] (its x, x'). Use as a context
    manager: the hooks are removed on exit."""

    def __init__(self, modules, gate_of=None):
        self.calls = {m: [] for m in modules}
        self.handles = [m.register_forward_hook(self.keep) for m in self.calls]
        self.gate = None
        if gate_of is not None:
            self.calls["gate"] = []
            self.gate = GateCalls(gate_of, lambda x, r, x_mixed: self.calls["gate"].append((x, x_mixed)))

    def keep(self, module, args, output):
        self.calls[module].append((args[0], output))

    def joined(self, module):
        """(input, output) of all of module's calls joined along the positions: the exact T²MLR loop runs the
        gate and the middle layers once per token."""
        ins, outs = zip(*self.calls[module])
        return torch.cat(ins, dim=1), torch.cat(outs, dim=1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        if self.gate is not None:
            self.gate.__exit__(*exc)


def embedding(model, taps):
    """h_emb (B, T, C) from the tapped token embedding, scaled as GPT.forward scales it (MeSH §4.1)."""
    h = taps.calls[model.wte][0][1]
    return h * math.sqrt(model.cfg.n_embd) if model.cfg.embed_scale else h


def unit(taps, layers, name):
    """One unit made of consecutive `layers` (the paper's "block", e.g. the whole prelude): (name, the first
    layer's input, the last layer's output) for each call, joined; [] when there are no layers."""
    if not layers:
        return []
    return [(name, taps.joined(layers[0])[0], taps.joined(layers[-1])[1])]


@torch.no_grad()
def depth_probe(model, idx):
    """Vanilla and recursive models. idx (B, T) -> (units [(name, h, f(h))], states {name: (B, T, C)})."""
    layers = list(model.layers)
    with Taps([model.wte, model.ln_f, *layers]) as taps:
        model(idx)
    h_emb, h_out = embedding(model, taps), taps.calls[model.ln_f][0][0]
    if not model.cfg.layout:     # vanilla: every layer is a unit and its output a state
        units = [(f"layer{i}", *taps.calls[layer][0]) for i, layer in enumerate(layers)]
        return units, {"h_emb": h_emb} | {name: out for name, _, out in units[:-1]} | {"h_out": h_out}
    # recursive: the first core layer's input at loop t is h(t), the last core layer's output f_core(h(t))
    core_in, core_out = taps.calls[model.core[0]], taps.calls[model.core[-1]]
    cores = [(f"core{t}", core_in[t][0], core_out[t][1]) for t in range(len(core_in))]
    h_last = taps.calls[model.coda[0]][0][0] if model.coda else h_out            # h(K)
    states = {"h_emb": h_emb} | {f"h({t})": h for t, (h, _) in enumerate(core_in)} | {f"h({len(core_in)})": h_last}
    return unit(taps, model.prelude, "prelude") + cores + unit(taps, model.coda, "coda"), states | {"h_out": h_out}


@torch.no_grad()
def t2mlr_probe(model, idx):
    """T²MLR in exact mode, per layer. idx (B, T) -> (units, units with R ≡ 0, states).

    The exact forward runs the gate and the middle layers token by token: their calls are joined along the
    positions. The units with R ≡ 0 rerun the gate, the middle and the upper layers on the same x with the
    state zeroed (no recurrence left, so in parallel). Unit names use global layer indices; "gate" sits
    before l_start."""
    start, _ = model.cfg.recurrent_layers
    layers = list(model.layers)
    with Taps([model.wte, model.ln_f, *layers], gate_of=model) as taps:
        model(idx, mode="exact")
    named = [(f"layer{i}", layer) for i, layer in enumerate(layers)]
    units = [(name, *taps.joined(layer)) for name, layer in named]
    units.insert(start, ("gate", *taps.joined("gate")))
    x = taps.joined("gate")[0]                                                     # the input of l_start
    with Taps([*model.middle, *model.upper], gate_of=model) as zero:
        h = model.run_layers(model.temporal_gate(x, torch.zeros_like(x)), model.middle, 0)
        model.run_layers(h, model.upper, 0)
    units_no_state = units[:start] + [("gate", *zero.joined("gate"))] + [
        (name, *zero.joined(layer)) for name, layer in named[start:]]
    outputs = [(name, f_h) for name, _, f_h in units if name != "gate"]
    states = {"h_emb": embedding(model, taps)} | dict(outputs[:-1]) | {"h_out": taps.calls[model.ln_f][0][0]}
    return units, units_no_state, states


@torch.no_grad()
def router_usage(model, idx):
    """MeSH's routing (MeSH §3.2): for each step s (0 the transitional step, t + 1 loop t) and each of the
    write and read routers, the entropy of its softmax over the n_slots slots (nats, mean over tokens; log
    n_slots is uniform, 0 one slot) and the mean weight each slot gets. idx (B, T) ->
    {"write": [{"entropy", "slots"} per step], "read": [...], "n_slots"}."""
    routers = {"write": list(model.mesh.write_routers), "read": list(model.mesh.read_routers)}
    with Taps([r for rs in routers.values() for r in rs]) as taps:
        model(idx)
    out = {"n_slots": model.cfg.n_slots}
    for kind, rs in routers.items():
        out[kind] = []
        for router in rs:
            w = torch.softmax(taps.calls[router][0][1].double(), dim=-1).flatten(0, 1)     # (B*T, n_slots)
            entropy = -(w * w.clamp_min(1e-300).log()).sum(-1).mean().item()
            out[kind].append({"entropy": entropy, "slots": w.mean(0).tolist()})
    return out


# -----------------------------------------------------------------------------
# Running the probe over many sequences

def mean_std(values):
    """A list of per-batch tensors (B, ...) -> (mean, std) over all sequences as nested lists."""
    v = torch.cat(values)
    return v.mean(0).tolist(), (v.std(0) if len(v) > 1 else torch.zeros_like(v[0])).tolist()


def skew_summary(per_block):
    """{unit: [per-batch (B,) tensors]} -> {"blocks": names, "mean": [...], "std": [...]}."""
    stats = [mean_std(v) for v in per_block.values()]
    return {"blocks": list(per_block), "mean": [m for m, _ in stats], "std": [s for _, s in stats]}


def run_probe(model, seqs, batch_size=8, top=50):
    """All three diagnostics over `seqs` (N, T) token ids, in batches. Returns probe.json's dict (no meta):
    skew (and skew_no_state for T²MLR), cka {states, rbf, linear (S x S means), rbf_std, linear_std}, spectra
    {states, top, ratio_mean/ratio_std {state: top values}, effective_rank {state: [mean, std]}}."""
    model.eval()
    skew, skew_no_state, cka_rbf, cka_lin, ratios, eranks = {}, {}, [], [], {}, {}
    names = None
    for i in range(0, len(seqs), batch_size):
        idx = seqs[i:i + batch_size]
        if model.gate is not None:
            units, units_no_state, states = t2mlr_probe(model, idx)
            for name, h, f_h in units_no_state:
                skew_no_state.setdefault(name, []).append(relative_update(h, f_h))
        else:
            units, states = depth_probe(model, idx)
        for name, h, f_h in units:
            skew.setdefault(name, []).append(relative_update(h, f_h))
        names = list(states)
        x = torch.stack([states[n] for n in names])                           # (S, B, T, C)
        cka_rbf.append(cka_matrix(torch.stack([rbf_gram(s) for s in x])))
        cka_lin.append(cka_matrix(torch.stack([linear_gram(s) for s in x])))
        for n in names:
            sigma = singular_values(states[n])
            ratios.setdefault(n, []).append((sigma / sigma[:, :1])[:, :top])
            eranks.setdefault(n, []).append(effective_rank(sigma))
    result = {"skew": skew_summary(skew)}
    if skew_no_state:
        result["skew_no_state"] = skew_summary(skew_no_state)
    (rbf, rbf_std), (lin, lin_std) = mean_std(cka_rbf), mean_std(cka_lin)
    result["cka"] = {"states": names, "rbf": rbf, "linear": lin, "rbf_std": rbf_std, "linear_std": lin_std}
    spectra = {n: mean_std(ratios[n]) for n in names}
    result["spectra"] = {"states": names, "top": len(spectra[names[0]][0]),
                         "ratio_mean": {n: m for n, (m, _) in spectra.items()},
                         "ratio_std": {n: s for n, (_, s) in spectra.items()},
                         "effective_rank": {n: list(map(float, mean_std(eranks[n]))) for n in names}}
    return result


def describe(cfg: GPTConfig) -> str:
    """One line naming the variant, e.g. 'recursive 2+2R2+2, mesh', 'vanilla, 8 layers', 'T²MLR, layers 2..5
    of 8'."""
    if cfg.t2mlr:
        start, end = cfg.recurrent_layers
        return f"T²MLR ({cfg.flavour}), layers {start}..{end} of {cfg.n_layer} recurrent"
    if cfg.layout:
        return f"recursive {cfg.layout}, {cfg.state_passing}"
    return f"vanilla ({cfg.flavour}), {cfg.n_layer} layers"


# -----------------------------------------------------------------------------
# Figures (matplotlib is optional)

def plot(result, out_dir, title):
    """Write probe_skew.png, probe_cka.png and probe_spectra.png into out_dir; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = [os.path.join(out_dir, f"probe_{name}.png") for name in ("skew", "cka", "spectra")]
    # (a) skew: one bar per unit, ± std; T²MLR: with the state and with R ≡ 0 side by side
    sk = result["skew"]
    n = len(sk["blocks"])
    fig, ax = plt.subplots(figsize=(max(5.0, 0.6 * n + 2), 3.6))
    series = [("with state R" if "skew_no_state" in result else None, sk, "tab:blue")]
    if "skew_no_state" in result:
        series.append(("state zeroed (R ≡ 0)", result["skew_no_state"], "tab:orange"))
    width = 0.8 / len(series)
    for j, (label, s, color) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(n)]
        colors = [("tab:red" if b.startswith("core") else color) for b in s["blocks"]]
        ax.bar(xs, s["mean"], width, yerr=s["std"], capsize=3, color=colors, label=label)
    ax.set_xticks(range(n), sk["blocks"], rotation=30 if n > 6 else 0, ha="right" if n > 6 else "center")
    ax.set_ylabel("relative update  2‖f(h)−h‖ / (‖f(h)‖+‖h‖)", fontsize=8)
    ax.set_title(
        "(a) computational skew, mean ± std over sequences"
        + (" (core loops red)" if "core0" in sk["blocks"] else ""),
        fontsize=9,
    )
    fig.suptitle(title, fontsize=9)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    # (b) CKA heatmaps, RBF (the paper's) and linear, values printed in the cells
    states = result["cka"]["states"]
    fig, axes = plt.subplots(1, 2, figsize=(2 * (0.5 * len(states) + 1.8), 0.5 * len(states) + 1.6))
    for ax, kind in zip(axes, ("rbf", "linear")):
        m = result["cka"][kind]
        im = ax.imshow(m, vmin=0, vmax=1, cmap="viridis")
        ax.set_xticks(range(len(states)), states, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(states)), states, fontsize=8)
        for i in range(len(states)):
            for j in range(len(states)):
                ax.text(j, i, f"{m[i][j]:.2f}", ha="center", va="center", fontsize=6.5,
                        color="black" if m[i][j] > 0.6 else "white")
        ax.set_title(f"(b) {'RBF (median heuristic)' if kind == 'rbf' else 'linear'} CKA", fontsize=9)
    fig.colorbar(im, ax=axes, shrink=0.8)
    fig.suptitle(title, fontsize=9)
    fig.savefig(paths[1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    # (c) spectra σ_i/σ_0 on a log axis, mean ± std band, effective rank in the legend
    sp = result["spectra"]
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    cmap = plt.get_cmap("viridis")
    for k, name in enumerate(sp["states"]):
        mean, std = torch.tensor(sp["ratio_mean"][name]), torch.tensor(sp["ratio_std"][name])
        color = cmap(k / max(1, len(sp["states"]) - 1))
        erank = sp["effective_rank"][name][0]
        ax.plot(mean, color=color, label=f"{name} (eff. rank {erank:.1f})")
        ax.fill_between(range(len(mean)), (mean - std).clamp_min(1e-5), mean + std, color=color, alpha=0.12)
    ax.set_yscale("log")
    # below: the exact zeros of rank-deficient states (a window holds few distinct tokens)
    ax.set_ylim(bottom=1e-4)
    ax.set_xlabel("index i")
    ax.set_ylabel("σ_i / σ_0")
    ax.set_title(f"(c) singular-value spectra, mean ± std — {title}", fontsize=8)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)
    return paths


# -----------------------------------------------------------------------------
# Command line

def validation_sequences(ckpt, num_seqs, seq_len, data_dir=None):
    """(num_seqs, seq_len) int64 token ids: the evenly strided validation windows of the checkpoint's data set
    (support.data.val_starts), so every variant is probed on the same tokens. Returns (ids, data_dir, overlap) where
    overlap says that windows share tokens (the val split is shorter than num_seqs * seq_len)."""
    tc = ckpt["train_config"]
    data_dir = data_dir or tc.get("data_dir") or os.path.join("data", tc["dataset"])
    meta = load_meta(data_dir, seq_len)
    starts = val_starts(meta["val_tokens"], seq_len, num_seqs)
    x, _ = get_batch(os.path.join(data_dir, "val.bin"), meta["dtype"], starts, seq_len, "cpu")
    return x, data_dir, num_seqs * seq_len > meta["val_tokens"]


@torch.no_grad()
@keeps_process_state
def main(argv=None):
    """Run the command line; returns the probe.json dict. Raises RunError for a bad checkpoint or data."""
    p = argparse.ArgumentParser(
        description="MeSH paper §4.1's hidden-state diagnostics for a trained checkpoint."
    )
    p.add_argument("checkpoint", help="path to a train.py ckpt.pt")
    p.add_argument(
        "--num_seqs", type=int, default=64, help="validation sequences (the paper used 500); default 64"
    )
    p.add_argument(
        "--seq_len", type=int, default=None, help="tokens per sequence; default the model's block_size"
    )
    p.add_argument("--batch_size", type=int, default=8, help="sequences per forward pass; default 8")
    p.add_argument("--out", default=None, help="output folder; default the checkpoint's folder")
    p.add_argument("--data_dir", default=None, help="data folder; default the checkpoint's (train_config)")
    p.add_argument("--device", default="cpu", help="default cpu; the probe runs in fp32 either way")
    args = p.parse_args(argv)
    model, ckpt = load_model(args.checkpoint, args.device)
    seq_len = model.cfg.block_size if args.seq_len is None else args.seq_len
    if not 2 <= seq_len <= model.cfg.block_size:     # CKA centres over the tokens: one token leaves nothing
        raise RunError(
            f"--seq_len {seq_len} must be in [2, block_size = {model.cfg.block_size}] (CKA compares "
            f"tokens, so it needs at least 2)"
        )
    if args.num_seqs < 1 or args.batch_size < 1:
        raise RunError(f"--num_seqs {args.num_seqs} and --batch_size {args.batch_size} must be >= 1")
    seqs, data_dir, overlap = validation_sequences(ckpt, args.num_seqs, seq_len, args.data_dir)
    title = f"{describe(model.cfg)}; {args.num_seqs} val seqs × {seq_len} tokens"
    print(
        f"probing {args.checkpoint}: {title} from {data_dir}"
        + (" (windows overlap: the val split is short)" if overlap else "")
    )
    result = {"checkpoint": args.checkpoint, "variant": describe(model.cfg), "num_seqs": args.num_seqs,
              "seq_len": seq_len, "data_dir": data_dir, "windows_overlap": overlap,
              **run_probe(model, seqs.to(args.device), args.batch_size)}
    out = args.out or os.path.dirname(os.path.abspath(args.checkpoint))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "probe.json"), "w") as f:
        json.dump(result, f, indent=1)
    for key, label in (("skew", "skew"), ("skew_no_state", "skew with R ≡ 0")):
        if key in result:                                       # skew_no_state: T²MLR only
            sk = result[key]
            units = zip(sk["blocks"], sk["mean"], sk["std"])
            print(f"{label} " + ", ".join(f"{u} {m:.3f}±{s:.3f}" for u, m, s in units))
    er = result["spectra"]["effective_rank"]
    print("effective rank " + ", ".join(f"{n} {m:.1f}" for n, (m, _) in er.items()))
    try:
        paths = plot(result, out, title)
        print(f"wrote {os.path.join(out, 'probe.json')}, " + ", ".join(paths))
    except ImportError:
        print(
            f"wrote {os.path.join(out, 'probe.json')}; for the figures: pip install matplotlib, then re-run"
        )
    return result


if __name__ == "__main__":
    try:
        main()
    except RunError as e:
        sys.exit(f"error: {e}")
