"""Accounting for a GPT (model.py): parameter counts, layer passes and FLOPs per training token, the
middle-layer passes T²MLR runs, and the summary `python model.py config/<name>.py` prints."""

import contextlib
import sys
from dataclasses import replace
from typing import Optional

import torch

from model import GPT, GPTConfig


def param_counts(model: GPT) -> dict:
    """Parameter counts (each shared tensor once): total; embedding (token embedding and output head);
    non_embedding = the layers and final norm (the papers' count, as the MeSH paper's Table 5); router (MeSH)
    and gate (T²MLR) apart."""
    counts = {"total": 0, "embedding": 0, "non_embedding": 0, "router": 0, "gate": 0}
    for name, p in model.named_parameters():
        group = ("embedding" if name.startswith(("wte.", "lm_head.")) else "router" if name.startswith("mesh.")
                 else "gate" if name.startswith("gate.") else "non_embedding")
        counts[group] += p.numel()
        counts["total"] += p.numel()
    return counts


def jacobi_D(cfg, T: int) -> int:
    """D, the Jacobi sweeps of a training step on T tokens, as GPT.jacobi_forward takes it: jacobi_sweeps,
    or T - jacobi_lag when the sweeps follow the length."""
    return max(1, T - cfg.jacobi_lag) if cfg.jacobi_lag else cfg.jacobi_sweeps


def layer_passes(model: GPT, T: Optional[int] = None, n_loops=None, loops_backprop=None):
    """Per unique layer, (forward passes, backward passes) in one training step on T tokens (default block_size).
    Plain and recursive: each application once each way (a core layer K times, or the step's draw n_loops
    forward and min(n_loops, loops_backprop) backward). T²MLR Jacobi: a middle layer D forward, min(b, D - 1) + 1
    backward; jacobi_init "ungated" adds one forward (and its backward when b = D), jacobi_checkpoint the
    recomputed forwards of the gradient sweeps; jacobi_tol only lowers the count, so this is its maximum."""
    cfg = model.cfg
    n_prelude, n_core, K, n_coda = cfg.depth
    K = n_loops or K
    passes = [(1, 1)] * n_prelude + [(K, min(K, loops_backprop or K))] * n_core + [(1, 1)] * n_coda
    if model.gate is not None:
        start, end = cfg.recurrent_layers
        D, b = jacobi_D(cfg, T or cfg.block_size), cfg.jacobi_grad_sweeps
        grad_sweeps, ungated = min(b, D - 1), cfg.jacobi_init == "ungated"
        middle = (D + ungated + grad_sweeps * cfg.jacobi_checkpoint, grad_sweeps + 1 + (ungated and b >= D))
        passes = [middle if start <= i <= end else (1, 1) for i in range(len(passes))]
    return passes


def train_flops_per_token(model: GPT, T: Optional[int] = None, n_loops=None, loops_backprop=None) -> float:
    """FLOPs of one training step (forward + backward) per token at sequence length T (default block_size): a
    layer forward 2·P + 4·C·T (P its parameters: matmuls plus attention scores and values, as nanoGPT/PaLM
    count it), its backward twice that, the output head 6·C·V; looped layers and Jacobi sweeps count every
    time they run (layer_passes; nanoGPT's 6N undercounts looped models)."""
    cfg = model.cfg
    T = T or cfg.block_size
    layer_fwd = 2 * sum(p.numel() for p in model.layers[0].parameters()) + 4 * cfg.n_embd * T
    passes = layer_passes(model, T, n_loops, loops_backprop)
    flops = sum((fwd + 2 * bwd) * layer_fwd for fwd, bwd in passes)
    if model.gate is not None:
        fwd, bwd = passes[cfg.recurrent_layers[0]]
        if cfg.jacobi_init == "ungated":     # the ungated start's middle pass runs no gate
            fwd, bwd = fwd - 1, bwd - (cfg.jacobi_grad_sweeps >= jacobi_D(cfg, T))
        if cfg.jacobi_checkpoint:          # backward recomputes the middle layers, not the gate
            fwd -= min(cfg.jacobi_grad_sweeps, jacobi_D(cfg, T) - 1)
        gate = model.gate
        half = gate.A.weight.numel() // 2        # A's x columns act once a step (jacobi_forward's x_part)
        flops += (fwd + 2 * bwd) * 2 * (gate.W_p.weight.numel() + half)    # W_p, A's r~ columns: each sweep
        flops += 6 * (half + gate.A.bias.numel())                             # A's x columns and b: once
    if model.mesh is not None:         # the routers of the steps run: 0 .. K (a step past max_loops: the last)
        per_step = sum(p.numel() for p in model.mesh.parameters()) / (cfg.max_loops + 1)
        K = n_loops or cfg.n_loops
        flops += (2 * (K + 1) + 4 * (min(K, loops_backprop or K) + 1)) * per_step
    return flops + 6 * cfg.n_embd * cfg.vocab_size


class count_middle_passes:
    """Counts how often T²MLR's middle layers run (a forward pre-hook on layer l_start): the Jacobi sweeps of a
    forward (D, +1 with the ungated start, fewer where jacobi_tol stopped them); n stays 0 for other models.
    `with count_middle_passes(model) as passes: ...; passes.n`, or one for a whole run (train.py's, registered
    before torch.compile) with n set to 0 before each forward (counting) and read before backward, which
    recomputes sweeps under jacobi_checkpoint (and a count carried across compiled forwards would recompile)."""

    def __init__(self, model: GPT):
        self.n = 0
        first = model.middle[0] if model.gate is not None else None
        self.handle = first.register_forward_pre_hook(self.count) if first is not None else None

    def count(self, module, args):
        self.n += 1

    @contextlib.contextmanager
    def counting(self, passes: list):
        """Around one forward: n from 0, and the passes it ran appended to `passes` at the end."""
        self.n = 0
        yield
        passes.append(self.n)

    def close(self):
        if self.handle is not None:
            self.handle.remove()
            self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def summary(cfg: GPTConfig) -> str:
    """A human-readable summary of a config: flavour, layout, depth, parameter counts, FLOPs per token.
    The model is built on the meta device, so even the 1.4B summary needs no memory."""
    with torch.device("meta"):
        model = GPT(cfg)
    counts = param_counts(model)
    K = cfg.depth[2]
    start, end = cfg.recurrent_layers
    layout = cfg.layout or (f"{cfg.n_layer} layers, {start}..{end} recurrent in time (T²MLR)" if cfg.t2mlr
                            else f"{cfg.n_layer} layers (vanilla)")
    lines = [
        f"flavour            {cfg.flavour}",
        f"layout             {layout}" + (f", state_passing {cfg.state_passing}" if K else ""),
        f"unique layers      {cfg.n_unique}",
        f"unrolled depth     {cfg.n_unrolled}",
        f"total params       {counts['total']:,}",
        f"non-embedding      {counts['non_embedding']:,}",
    ]
    if model.mesh is not None:
        lines.append(f"router params      {counts['router']:,} (+{model.cfg.n_slots} slots, {K + 1} steps)")
    if model.gate is not None:
        lines.append(
            f"T²MLR gate params  {counts['gate']:,} (layers {start}..{end}, D={jacobi_D(cfg, cfg.block_size)}, "
            f"b={cfg.jacobi_grad_sweeps})"
        )
    lines.append(f"train FLOPs/token  {train_flops_per_token(model):,.0f} at T={cfg.block_size}")
    return "\n".join(lines)


def exact_training_flops_per_token(model_cfg) -> float:
    """Training FLOPs per token of T²MLR trained exactly (train_mode 'exact'): the middle layers once each way
    per token, the gate once, as Jacobi with D = 1."""
    with torch.device("meta"):
        return train_flops_per_token(GPT(replace(model_cfg, jacobi_sweeps=1, jacobi_grad_sweeps=0, jacobi_lag=0,
                                                 jacobi_tol=0.0, jacobi_checkpoint=False, jacobi_init="zero")))


def main(load_config, argv=None):
    """`python model.py config/<name>.py [--key=value]`: print the summary. load_config is the
    configurator's (passed in: support/ imports no script). Config files hold training keys too: they are
    skipped here (train.py checks them), so train.py is not imported."""
    try:
        (model_cfg,), _ = load_config(sys.argv[1:] if argv is None else argv, GPTConfig, skip_unknown=True)
    except ValueError as e:                          # ConfigError is a ValueError
        sys.exit(f"error: {e}")
    print(summary(model_cfg))
