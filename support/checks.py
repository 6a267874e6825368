"""The checks of a GPTConfig (model.py), run by its __post_init__: every invalid value or combination raises
ValueError naming the value and what is valid. Nothing here changes a config."""

import re

from configurator import check_ranges

LAYOUT_RE = re.compile(r"^(\d+)\+(\d+)R(\d+)\+(\d+)$")      # "P+CRK+Q", the MeSH paper's layouts


def parse_layout(layout: str):
    """'P+CRK+Q' (the MeSH paper's notation) -> (n_prelude, n_core, n_loops K, n_coda), e.g. '2+4R2+2' ->
    (2, 4, 2, 2). Raises ValueError quoting the string when it is malformed or has no core or K < 1."""
    m = LAYOUT_RE.match(layout.replace(" ", ""))
    if m is None:
        raise ValueError(
            f"layout {layout!r} is malformed; expected 'P+CRK+Q' with non-negative integers, e.g. '2+4R2+2'"
        )
    n_prelude, n_core, K, n_coda = map(int, m.groups())
    if n_core < 1 or K < 1:
        raise ValueError(
            f"layout {layout!r} needs at least one core layer and K >= 1 loops (the 'CRK' part), e.g. '2+4R2+2'"
        )
    return n_prelude, n_core, K, n_coda


STATE_PASSINGS = ("base", "residual", "anchor", "anchor_star", "mesh")
# The valid range of every numeric field (configurator.check_ranges: None passes, nan and inf never).
# l_start and l_end take any int (negative counts from the end); check_t2mlr checks them.
GPT_RANGES = {
    "vocab_size": ">= 1",
    "block_size": ">= 1",
    "n_layer": ">= 1",
    "n_head": ">= 1",
    "n_kv_head": ">= 1",
    "n_embd": ">= 1",
    "mlp_hidden": ">= 1",
    "rope_theta": "> 0",
    "rope_pct": "[0, 1]",
    "norm_eps": "> 0",
    "mesh_slots": ">= 2",
    "jacobi_sweeps": ">= 1",
    "jacobi_grad_sweeps": ">= 0",
    "jacobi_tol": "[0, 1)",
    "gate_bias_prob": "(0, 1)",
    "gate_weight_gain": "> 0",
}
CHOICES = {"flavour": ("neox", "llama"), "state_passing": STATE_PASSINGS, "jacobi_init": ("zero", "plain"),
           "mesh_trans_router_in": ("pre", "emb"), "weight_init": ("mesh", "reference")}


def check_choice(cfg, name):
    if getattr(cfg, name) not in CHOICES[name]:
        raise ValueError(f"{name} {getattr(cfg, name)!r} is not one of {', '.join(map(repr, CHOICES[name]))}")


def check_config(cfg):
    """Raise ValueError for the first invalid field or combination of cfg (a GPTConfig)."""
    check_choice(cfg, "flavour")
    if cfg.mlp_hidden is None and cfg.flavour == "llama":
        raise ValueError("flavour 'llama' needs mlp_hidden (the SwiGLU width, e.g. 1536 for SmolLM2-135M)")
    check_ranges(cfg, GPT_RANGES)
    if cfg.n_embd % cfg.n_head or cfg.n_head % cfg.n_kv_head:
        raise ValueError(f"n_embd ({cfg.n_embd}) must divide by n_head ({cfg.n_head}), "
                         f"and n_head by n_kv_head ({cfg.n_kv_head})")
    if cfg.layout:
        parse_layout(cfg.layout)
    for name in ("state_passing", "jacobi_init", "mesh_trans_router_in", "weight_init"):
        check_choice(cfg, name)
    if cfg.t2mlr:
        check_t2mlr(cfg)


def check_t2mlr(cfg):
    if cfg.layout:
        raise ValueError(f"t2mlr needs a flat stack (n_layer), not the recursive layout {cfg.layout!r}")
    start, end = cfg.recurrent_layers
    if not (0 <= start <= end < cfg.n_layer):
        raise ValueError(
            f"l_start = {cfg.l_start}, l_end = {cfg.l_end} must give 0 <= l_start <= l_end < "
            f"n_layer = {cfg.n_layer} (negative values count from the end: -1 .. -{cfg.n_layer})"
        )
    if cfg.jacobi_grad_sweeps > cfg.jacobi_sweeps:
        raise ValueError(
            f"jacobi_grad_sweeps = {cfg.jacobi_grad_sweeps} must be <= jacobi_sweeps = {cfg.jacobi_sweeps}"
            f" (b sweeps before the final one keep gradient; b = D keeps the plain start's too)"
        )


def check_forward(cfg, idx, pos, control):
    """GPT.forward's input: idx (B, T) continuing at position pos, control (B, T) or None."""
    if pos + idx.shape[1] > cfg.block_size:
        raise ValueError(f"sequence of {pos + idx.shape[1]} tokens exceeds block_size = {cfg.block_size}")
    if control is not None and control.shape != idx.shape:
        raise ValueError(f"control has shape {tuple(control.shape)}; it must match idx, {tuple(idx.shape)}")


def check_generate(temperature, top_k, prefill, prefill_tol):
    """GPT.generate's sampling and prefill settings."""
    if prefill not in ("exact", "converged"):
        raise ValueError(f"prefill {prefill!r} is not one of 'exact', 'converged'")
    if not 0 <= prefill_tol < 1:              # also NaN
        raise ValueError(f"prefill_tol = {prefill_tol} must be in [0, 1) (0 = sweep until exact)")
    if not temperature >= 0:                  # also NaN
        raise ValueError(f"temperature = {temperature} must be >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k = {top_k} must be >= 1 (the number of most likely tokens to sample from), "
                         f"or None for all tokens")
