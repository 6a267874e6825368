"""
One file, every variant: a vanilla GPT, recursive transformers with MeSH, and T²MLR.

Notation (the README's glossary maps it to the papers): B batch, T sequence length (with a KV cache: the
new positions of a call), C = n_embd (the papers' d), V vocabulary, hs head size; K loops of the core,
n_slots MeSH slots (the MeSH paper's B); D Jacobi sweeps per training step (the final one included), b
sweeps before the final one that keep gradient; R_t the T²MLR recurrent state, R^(j) the states of all
positions after j sweeps. t follows each paper: the loop index in MeSH's h(t), the token index in
T²MLR's R_t. In a layout "P+CRK+Q" (the MeSH paper's notation) P, C, Q count layers.

MeSH (Yu et al., "MeSH: Memory-as-State-Highways for Recursive Transformers", arXiv 2510.07739).
    A recursive transformer runs a prelude, then ONE weight-shared core (a stack of layers) K times (the
    loops), then a coda. Layout "2+4R2+2" = 2 prelude layers, 4 core layers looped K=2 times, 2 coda
    layers: the compute of 12 layers with the parameters of 8. Between loops one rule passes the state
    (§3.1): h(t+1) = f_core(h(t)) + h_sup(t) with h_sup = 0 (base), h(t) (+residual), h(0) (+anchor) or
    h_emb (+anchor*). MeSH (§3.2) replaces that rule by a buffer of n_slots slots with a write and a read
    router per step: the core output is softly written into the slots, the next state is a soft read.

T²MLR (Transformer with Temporal Middle-Layer Recurrence, arXiv 2607.15178).
    The output of layer l_end at token t-1, merged into the recurrent state R_{t-1}, is fused by a gate
    into the input of layer l_start at token t. Training is parallel: D Jacobi sweeps over the middle layers
    l_start..l_end (gradients through the final one and the b before it); inference is exact, token by
    token through the middle layers, with a KV cache plus one recurrent state.

How to read it: GPT.forward embeds idx and picks one branch per variant; read the branch's functions in
this order (each is short and narrated step by step). Every branch applies its layers with run_layers
(rotary tables from GPT.rotary -> rotary_tables) -> Layer (make_norm, Attention with apply_rotary and its
LayerCache, MLP); the layer groups (prelude/core/coda, lower/middle/upper) are lists made once in
GPT.__init__.
    vanilla      forward -> run_layers
    recursive    forward -> recursive_forward (a branch per state mode) -> MeshMemory.write_read (mesh only)
    T²MLR train  forward -> jacobi_forward (the start, the sweeps, the final sweep) -> middle_step (the
                 gate, the middle layers, the state update; TemporalGate holds the gate's parameters)
    T²MLR exact  forward -> exact_forward (the token loop; the middle layers' LayerCaches made per call)
                 -> middle_step
    generation   generate -> forward (exact mode with an InferenceCache) -> exact_forward -> middle_step;
                 (a prompt with prefill="converged": forward -> jacobi_forward); sample_next turns the
                 last logits into the next token
test_equivalence.py holds the executable definitions these are checked against (a naive token loop for
T²MLR, one-hot MeSH routing that reproduces base and residual, the one-loop layout that is vanilla).

Section, equation, table and figure numbers refer to the two papers ("MeSH paper §3.2, Eq. 3").
"The reference" is the public T²MLR code (github.com/princeton-pli/T2MLR), whose details the T²MLR
parts follow; "our reading" marks a choice the papers leave open; "speed-up" marks an optimisation
shown after the direct form it computes.
"""

import glob
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from configurator import check_ranges


# -----------------------------------------------------------------------------
# Rotary position embedding

def rotary_tables(head_dim: int, rope_pct: float, theta: float, length: int, dtype=torch.float32):
    """cos/sin tables for rotary embedding on the first `rope_pct` of each head's dims.

    Returns two tensors of shape (length, 1, rot_dim), rot_dim = int(head_dim * rope_pct) rounded down
    to an even number, to broadcast over (B, T, heads, hs); sin carries the sign of the rotation.
    GPT-NeoX/Pythia rotates 25% of the dims (base 10000), LLaMA all of them. Computed in `dtype` from
    the start (float64 tables are not float32 ones cast up: those would be exact to ~1e-7 only).
    """
    rot_dim = int(head_dim * rope_pct) // 2 * 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=dtype) / rot_dim))
    angles = torch.outer(torch.arange(length, dtype=dtype), inv_freq)           # (length, rot_dim/2)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).unsqueeze(1)          # (length, 1, rot_dim)
    sin = torch.cat([-angles.sin(), angles.sin()], dim=-1).unsqueeze(1)         # signed: see apply_rotary
    return cos, sin


def apply_rotary(x, cos, sin):
    """Rotate the first rot_dim = cos.shape[-1] dims of x (B, T, heads, hs) by position, in NeoX and
    LLaMA's "rotate half" form: pair dim i with i + rot_dim/2 and rotate each pair by its angle,

        x1, x2 = x.chunk(2, dim=-1);  x -> cat([x1 cos - x2 sin, x2 cos + x1 sin])      (the direct form)

    Other dims pass through. cos, sin: (T, 1, rot_dim) from rotary_tables.
    Speed-up (same values, one expression and no chunk): roll() swaps the halves, [x2, x1], and the sin
    table carries the minus, [-sin, +sin], so x·cos + roll(x)·sin is the rotation above."""
    rot_dim = cos.shape[-1]
    if rot_dim == 0:             # rope_pct = 0: no positional encoding at all (NoPE)
        return x
    if rot_dim < x.shape[-1]:    # partial rotary (NeoX: 25% of the dims): rotate the first rot_dim only
        return torch.cat([apply_rotary(x[..., :rot_dim], cos, sin), x[..., rot_dim:]], dim=-1)
    return (x * cos + x.roll(rot_dim // 2, dims=-1) * sin).to(x.dtype)


# -----------------------------------------------------------------------------
# Building parts: attention with an optional KV cache, MLP, transformer layer

class LayerCache:
    """Keys and values of one layer application, holding at most `max_len` positions.

    `update(k, v)` appends (B, n_kv_head, T, hs) keys/values and returns all cached ones so far, (B,
    n_kv_head, length, hs). The direct form concatenates the new ones to the cached ones (used with
    autograd, e.g. training through the exact T²MLR recurrence, where in-place writes would overwrite
    tensors saved for the backward pass). Speed-up without autograd (generation, evaluation): they are
    written in place into a buffer preallocated to max_len, one copy of the new positions per call
    instead of one of all of them. Raises RuntimeError when more than `max_len` positions would be stored.
    """

    def __init__(self, max_len: int):
        self.max_len, self.k, self.v, self.length = max_len, None, None, 0

    def update(self, k, v):
        T = k.shape[2]
        if self.length + T > self.max_len:
            raise RuntimeError(f"KV cache full: {self.length} + {T} > {self.max_len} positions")
        if torch.is_grad_enabled():                                   # the direct form: concatenate
            self.k = k if self.k is None else torch.cat([self.k[:, :, :self.length], k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v[:, :, :self.length], v], dim=2)
        else:                                                         # speed-up: write in place
            if self.k is None or self.k.shape[2] < self.max_len:      # first write, or after a cat
                self.k = self._preallocate(k, self.k)
                self.v = self._preallocate(v, self.v)
            self.k[:, :, self.length:self.length + T] = k
            self.v[:, :, self.length:self.length + T] = v
        self.length += T
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def _preallocate(self, new, old):
        """A (B, n_kv_head, max_len, hs) buffer holding the `length` positions of `old` (if any)."""
        buffer = new.new_empty(*new.shape[:2], self.max_len, new.shape[3])
        if old is not None:
            buffer[:, :, :self.length] = old[:, :, :self.length]
        return buffer


class InferenceCache:
    """Everything generation carries between calls: one LayerCache per layer *application*
    (a core layer looped K times has K caches), plus the T²MLR recurrent state R_{t-1} of shape (B, 1, C)."""

    def __init__(self, n_applications: int, max_len: int):
        self.layers = [LayerCache(max_len) for _ in range(n_applications)]
        self.state = None

    @property
    def length(self) -> int:
        """Number of positions already processed (the next token's position)."""
        return self.layers[-1].length


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads (n_kv_head <= n_head), rotary, and SDPA."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.n_embd // cfg.n_head
        kv_dim = self.n_kv_head * self.head_dim
        self.qkv = nn.Linear(cfg.n_embd, cfg.n_embd + 2 * kv_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)   # "attention out"; scaled init

    def forward(self, x, cos, sin, cache: Optional[LayerCache] = None):
        """x (B, T, C) at positions pos..pos+T-1 (cos/sin already sliced to them) -> (B, T, C)."""
        B, T, C = x.shape
        nh, nkv = self.n_head, self.n_kv_head
        # heads: nh queries, nkv keys, nkv values
        qkv = self.qkv(x).view(B, T, nh + 2 * nkv, self.head_dim)
        # queries and keys rotated in one go
        qk = apply_rotary(qkv[:, :, :nh + nkv], cos, sin)
        q, k = qk.transpose(1, 2).split([nh, nkv], dim=1)                   # (B, nh, T, hs), (B, nkv, T, hs)
        v = qkv[:, :, nh + nkv:].transpose(1, 2)                            # (B, nkv, T, hs)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(k, v)                                        # (B, nkv, past+T, hs)
        if past == 0:      # no cached keys: the plain causal mask
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif T == 1:       # one new token attends to everything cached
            y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        else:              # a chunk after a cached prefix: query i sees keys 0..past+i
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    """GELU MLP (neox: down(gelu(up(x)))) or SwiGLU (llama: down(silu(gate(x)) * up(x)), with the gate and
    up projections stored as one Linear(C -> 2·hidden), one matmul instead of two)."""

    def __init__(self, cfg):
        super().__init__()
        self.swiglu = cfg.flavour == "llama"
        self.up = nn.Linear(cfg.n_embd, (2 if self.swiglu else 1) * cfg.mlp_hidden, bias=cfg.bias)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=cfg.bias)    # "MLP down"; scaled init

    def forward(self, x):
        if self.swiglu:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)
        return self.down(F.gelu(self.up(x)))


def make_norm(cfg):
    """LayerNorm with bias (Pythia) or RMSNorm (LLaMA), eps = cfg.norm_eps."""
    if cfg.flavour == "llama":
        return nn.RMSNorm(cfg.n_embd, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.n_embd, eps=cfg.norm_eps, bias=True)


class Layer(nn.Module):
    """One transformer layer, a map (B, T, C) -> (B, T, C) that includes its own residual.

    neox  (Pythia / GPT-NeoX, as in the MeSH paper):      parallel residual x + attn(ln1(x)) + mlp(ln2(x)).
    llama (SmolLM2, the T²MLR reference's FineWeb model): sequential x = x + attn(ln1(x)); x = x +
    mlp(ln2(x)).
    """

    def __init__(self, cfg):
        super().__init__()
        self.parallel = cfg.flavour == "neox"
        self.ln1, self.attn, self.ln2, self.mlp = make_norm(cfg), Attention(cfg), make_norm(cfg), MLP(cfg)

    def forward(self, x, cos, sin, cache=None):
        if self.parallel:
            return x + self.attn(self.ln1(x), cos, sin, cache) + self.mlp(self.ln2(x))
        x = x + self.attn(self.ln1(x), cos, sin, cache)
        return x + self.mlp(self.ln2(x))


# -----------------------------------------------------------------------------
# MeSH: state passing between loops of the core (MeSH paper §3.1 heuristics, §3.2 memory)

class MeshMemory(nn.Module):
    """The MeSH slot buffer's routers (MeSH paper §3.2).

    One write and one read router per step, steps = the transitional step + K loops, each a
    Linear(C -> n_slots) with bias: (K+1) * 2 * (C*n_slots + n_slots) parameters. Routing weights are
    a softmax over slots, per token. The buffer itself is a tensor (n_slots, B, T, C) built per forward.
    """

    def __init__(self, n_embd: int, n_slots: int, n_steps: int):
        super().__init__()
        self.write_routers = nn.ModuleList(nn.Linear(n_embd, n_slots) for _ in range(n_steps))
        self.read_routers = nn.ModuleList(nn.Linear(n_embd, n_slots) for _ in range(n_steps))
        self.n_slots = n_slots

    def write_read(self, step: int, buffer, router_in, written):
        """One MeSH step, write then read (paper Eq. 3):

            w_write = softmax(write_routers[step](router_in))     (B, T, n_slots)
            w_read  = softmax(read_routers[step](router_in))      (B, T, n_slots)
            m_i    <- m_i + w_write[..., i] * written             (additive soft write, every slot i)
            h_next  = sum_i w_read[..., i] * m_i                  (read from the UPDATED buffer)

        step 0 is the transitional step (written = h_pre, the prelude output; router_in = h_pre, or h_emb
        with mesh_trans_router_in "emb"), step t+1 the loop t (written = f_core(h(t)), router_in = h(t)).

        router_in, written: (B, T, C); buffer: (n_slots, B, T, C). Returns (new buffer, h_next (B, T, C)).
        """
        # softmax in fp32 under bf16 autocast
        fp32 = torch.promote_types(router_in.dtype, torch.float32)
        w_write = F.softmax(self.write_routers[step](router_in), dim=-1, dtype=fp32)    # (B, T, n_slots)
        w_read = F.softmax(self.read_routers[step](router_in), dim=-1, dtype=fp32)
        buffer = buffer + w_write.permute(2, 0, 1).unsqueeze(-1) * written     # out of place, for autograd
        h_next = torch.einsum("btn,nbtc->btc", w_read, buffer)
        return buffer, h_next.to(written.dtype)


# -----------------------------------------------------------------------------
# T²MLR: the gate's parameters (its equations run in GPT.middle_step, together with the state update)

class TemporalGate(nn.Module):
    """The parameters of the gated fusion of the recurrent state r = R_{t-1} into the input x of layer l_start
    (the T²MLR paper; the reference's "gated" mixer, the one all its released scripts use). The direct form,
    computed in GPT.middle_step:

        r~ = W_p r;  g = [x ; r~]
        a_r = σ(A_r g + b_r),  a_x = σ(A_x g + b_x)               per-dimension local gates
        x'  = x + tanh(θ_r) · a_r ⊙ r~ + tanh(θ_x) · a_x ⊙ x       θ_r = θ_x = 0 at init: an exact identity

    Speed-up (same values, same 5C² + 2C + 2 parameters): the gates' linear map splits into an x half and an
    r half, with A = [A_r; A_x]: A g + [b_r; b_x] = A^x x + A^r r~ + [b_r; b_x], stored as `gates_x` (the x
    columns A^x of A and the biases) and `gates_r` (the r~ columns A^r). x is the same in every Jacobi sweep
    and known for all positions before the token-by-token loop, so the forwards evaluate gates_x(x) once and
    each sweep or token adds the r half.
    """

    def __init__(self, n_embd: int):
        super().__init__()
        self.proj = nn.Linear(n_embd, n_embd, bias=False)             # W_p
        self.gates_x = nn.Linear(n_embd, 2 * n_embd)                  # [A_r^x; A_x^x] x + [b_r; b_x]
        self.gates_r = nn.Linear(n_embd, 2 * n_embd, bias=False)      # [A_r^r; A_x^r] r~
        self.theta_r = nn.Parameter(torch.zeros(1))                   # θ_r, global gate of the state
        self.theta_x = nn.Parameter(torch.zeros(1))                   # θ_x, global gate of the input


# Control flow (c_t in the T²MLR reference code): per token 0 = padding, 1 = non-recurrent (e.g. a prompt), >=
# 2 = recurrent. Mixing and the residual state merge happen only where c > 1; elsewhere the gate passes x
# through and the written state is the raw l_end output h. `recurrent` in the code is the mask (c > 1) of
# shape (B, T, 1), or None when every token is recurrent (no control given), which skips the masking entirely.


# -----------------------------------------------------------------------------
# Probes: what probe.py reads out of a forward pass

class Recorder:
    """Collects hidden states during a forward pass, for probe.py (MeSH paper §4.1 diagnostics):
    `states` {name: (B, T, C)} (h_emb and h_out; h(0)..h(K) for a recursive model, the states R_t written
    at every position for T²MLR) and `updates` [(name, input, output)], one per
    layer or unit applied (its input h and output f(h), for the relative update). Pass one as
    forward(..., recorder=Recorder()); the default, NO_RECORDER, records nothing. `active` is False for
    NO_RECORDER only, so a forward can skip building a tensor that would only be recorded."""

    active = True

    def __init__(self):
        self.states, self.updates = {}, []

    def state(self, name, h):
        """Keep the hidden state h (B, T, C) under `name` (e.g. "h(1)")."""
        self.states[name] = h

    def update(self, name, h_in, h_out):
        """Keep one applied unit's input and output, both (B, T, C), for its relative update."""
        self.updates.append((name, h_in, h_out))


class _NoRecorder(Recorder):
    active = False

    def state(self, name, h):
        pass

    def update(self, name, h_in, h_out):
        pass


NO_RECORDER = _NoRecorder()


# -----------------------------------------------------------------------------
# Configuration

# GPTConfig fields renamed since earlier versions: old checkpoints load under the new names
# (train.load_checkpoint), and a config file or flag with an old name is told the new one (configurator).
RENAMED_FIELDS = {"jacobi_iters": "jacobi_sweeps", "jacobi_grad_iters": "jacobi_grad_sweeps"}
LAYOUT_RE = re.compile(r"^(\d+)\+(\d+)R(\d+)\+(\d+)$")
STATE_MODES = ("base", "residual", "anchor", "anchor_star", "mesh")
# The valid range of every numeric field of GPTConfig (configurator.check_ranges: None passes, nan and inf
# never). l_start and l_end take any int (negative counts from the end); _check_t2mlr checks them.
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


def parse_layout(layout: str):
    """'P+CRK+Q' -> (n_prelude, n_core, n_loops, n_coda), e.g. '2+4R2+2' -> (2, 4, 2, 2), the MeSH paper's
    notation (as in its Table 1).

    Raises ValueError quoting the string when it is malformed, has no core layers or K < 1.
    """
    m = LAYOUT_RE.match(layout.replace(" ", ""))
    if m is None:
        raise ValueError(
            f"layout {layout!r} is malformed; expected 'P+CRK+Q' with non-negative integers, e.g. '2+4R2+2'"
        )
    n_prelude, n_core, K, n_coda = map(int, m.groups())
    if n_core < 1 or K < 1:
        raise ValueError(
            f"layout {layout!r} needs at least one core layer and K >= 1 loops (the 'CRK' part), e.g. "
            "'2+4R2+2'"
        )
    return n_prelude, n_core, K, n_coda


@dataclass
class GPTConfig:
    """Every variant is a setting of these fields; __post_init__ fills flavour defaults and raises
    ValueError for invalid combinations, naming the bad value and what would be valid."""
    renamed = RENAMED_FIELDS         # a class attribute, not a field: old name -> new name, for configurator
    flavour: str = "neox"            # "neox" (Pythia, MeSH's baseline) or "llama" (SmolLM2, T²MLR's)
    vocab_size: int = 50304          # GPT-2's 50257 padded to a multiple of 64
    block_size: int = 1024           # maximum sequence length T
    n_layer: int = 12                # depth of a vanilla model (used when layout is "")
    layout: str = ""                 # recursive "P+CRK+Q": prelude, core layers, K loops, coda (MeSH paper)
    n_head: int = 12
    n_kv_head: Optional[int] = None  # grouped-query attention; None = n_head
    n_embd: int = 768                # C (the papers' d)
    mlp_hidden: Optional[int] = None  # MLP width; None = 4*n_embd (neox); required for llama
    rope_theta: float = 10000.0      # rotary base θ
    rope_pct: Optional[float] = None  # fraction of head dims rotated; None = 0.25 (neox) / 1.0 (llama)
    bias: Optional[bool] = None      # biases on linears; None = True (neox) / False (llama)
    tie_embeddings: Optional[bool] = None  # None = False (neox, Pythia) / True (llama, SmolLM2)
    norm_eps: float = 1e-5
    embed_scale: bool = True         # embeddings times sqrt(C) (MeSH §4.1); False for Pythia/SmolLM2 weights
    # MeSH and the heuristic state passings (MeSH paper §3.1-3.2)
    state_passing: str = "base"         # h_sup: base 0 | residual h(t) | anchor h(0) | anchor_star h_emb | mesh
    mesh_slots: Optional[int] = None  # n_slots (the paper's B); None = K + 3 (MeSH paper §4.4, Table 3)
    # the MeSH paper does not say which state feeds the transitional routers: "pre" is our reading
    mesh_trans_router_in: str = "pre"  # transitional routers' input: "pre" (h_pre) or "emb" (h_emb)
    # T²MLR (gate, state update and Jacobi training as the reference has them)
    t2mlr: bool = False              # temporal middle-layer recurrence on layers l_start..l_end
    l_start: int = 0                 # first recurrent layer (gate at its input); negative counts from the end
    l_end: int = -1                  # last recurrent layer (state written from its output); inclusive
    jacobi_sweeps: int = 16          # D: Jacobi sweeps per step, the final one included (positions < D exact)
    jacobi_grad_sweeps: int = 4      # b: sweeps before the final one that keep gradient (b <= D)
    jacobi_tol: float = 0.0          # > 0: stop no-grad sweeps once the state moves less (relative); 0 = D
    jacobi_checkpoint: bool = False  # recompute the b gradient sweeps in backward (less memory, more time)
    jacobi_init: str = "zero"        # R^(0): "zero" (ours) or "plain" (the reference's, +1 middle pass)
    recurrent_residual: bool = True      # R_t = s·(h_t + R_{t-1}), not h_t (on in the reference's FineWeb run)
    recurrent_detach: bool = False       # no gradient along the R chain (reference: off for FineWeb, on for S5)
    gate_bias_prob: Optional[float] = None  # b_r = b_x = logit(p) (S5: 0.5); None = Linear default (FineWeb)
    gate_weight_gain: float = 1.0    # xavier-normal gain of A_r, A_x (FineWeb, S5: 1.0; reference SFT: 1e-2)

    def __post_init__(self):
        if self.flavour not in ("neox", "llama"):
            raise ValueError(f"flavour {self.flavour!r} is not one of 'neox', 'llama'")
        llama = self.flavour == "llama"
        self.n_kv_head = self.n_head if self.n_kv_head is None else self.n_kv_head
        self.rope_pct = (1.0 if llama else 0.25) if self.rope_pct is None else self.rope_pct
        self.bias = (not llama) if self.bias is None else self.bias
        self.tie_embeddings = llama if self.tie_embeddings is None else self.tie_embeddings
        if self.mlp_hidden is None:
            if llama:
                raise ValueError(
                    "flavour 'llama' needs mlp_hidden (the SwiGLU width, e.g. 1536 for SmolLM2-135M)"
                )
            self.mlp_hidden = 4 * self.n_embd
        check_ranges(self, GPT_RANGES)
        if self.n_embd % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(f"n_embd ({self.n_embd}) must divide by n_head ({self.n_head}), "
                             f"and n_head by n_kv_head ({self.n_kv_head})")
        if self.layout:
            parse_layout(self.layout)
        if self.state_passing not in STATE_MODES:
            raise ValueError(f"state_passing {self.state_passing!r} is not one of {', '.join(STATE_MODES)}")
        if self.jacobi_init not in ("zero", "plain"):
            raise ValueError(f"jacobi_init {self.jacobi_init!r} is not one of 'zero', 'plain'")
        if self.mesh_trans_router_in not in ("pre", "emb"):
            raise ValueError(f"mesh_trans_router_in {self.mesh_trans_router_in!r} is not one of 'pre', 'emb'")
        if self.t2mlr:
            self._check_t2mlr()

    def _check_t2mlr(self):
        if self.layout:
            raise ValueError(f"t2mlr needs a flat stack (n_layer), not the recursive layout {self.layout!r}")
        start, end = self.recurrent_layers
        if not (0 <= start <= end < self.n_layer):
            raise ValueError(
                f"l_start = {self.l_start}, l_end = {self.l_end} must give 0 <= l_start <= l_end < "
                f"n_layer = {self.n_layer} (negative values count from the end: -1 .. -{self.n_layer})"
            )
        if self.jacobi_grad_sweeps > self.jacobi_sweeps:
            raise ValueError(
                f"jacobi_grad_sweeps = {self.jacobi_grad_sweeps} must be <= jacobi_sweeps = "
                f"{self.jacobi_sweeps}"
                f" (b sweeps before the final one keep gradient; b = D keeps the plain start's too)"
            )

    @property
    def depth(self):
        """(n_prelude, n_core, n_loops, n_coda); a vanilla stack is (n_layer, 0, 0, 0)."""
        return parse_layout(self.layout) if self.layout else (self.n_layer, 0, 0, 0)

    @property
    def recurrent_layers(self):
        """T²MLR's (l_start, l_end) as layer indices, a negative one counted from the end as Python indexes a
        list (-1 = the last layer, -n_layer = the first). Never wrapped around: an index outside
        -n_layer..n_layer-1 stays out of range, and _check_t2mlr refuses it."""
        return tuple(i + self.n_layer if i < 0 else i for i in (self.l_start, self.l_end))

    @property
    def n_unique(self):
        """Number of distinct (parameter) layers."""
        n_prelude, n_core, _, n_coda = self.depth
        return n_prelude + n_core + n_coda

    @property
    def n_unrolled(self):
        """Number of layer applications per token: n_prelude + n_core·K + n_coda (the compute depth)."""
        n_prelude, n_core, K, n_coda = self.depth
        return n_prelude + n_core * K + n_coda


# -----------------------------------------------------------------------------
# The model

class GPT(nn.Module):
    """A decoder-only language model whose depth is a schedule of layer applications.

    Vanilla: layers 0..n_layer-1 once. Recursive (layout "P+CRK+Q"): prelude layers, then the core
    layers K times with a state-passing rule between loops, then the coda. T²MLR: a vanilla stack whose
    layers l_start..l_end are recurrent in time.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        n_prelude, n_core, K, _ = cfg.depth
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_unique))   # prelude, core, coda in order
        # The groups of layers the forwards read, as plain lists (the modules are registered once, in layers):
        # recursive (MeSH paper §3.1): prelude, core (looped n_loops = K times), coda; a vanilla stack is all
        # prelude. T²MLR: lower (below l_start), middle (l_start..l_end, the recurrent layers), upper (above
        # l_end).
        self.n_loops = K
        self.prelude, self.core, self.coda = self.split(n_prelude, n_prelude + n_core)
        start, end = cfg.recurrent_layers
        self.lower, self.middle, self.upper = self.split(start, end + 1)
        self.mesh = None
        if cfg.layout and cfg.state_passing == "mesh":
            # K + 3 slots: MeSH paper §4.4
            self.mesh = MeshMemory(cfg.n_embd, cfg.mesh_slots or K + 3, K + 1)
        self.gate = TemporalGate(cfg.n_embd) if cfg.t2mlr else None
        self.ln_f = make_norm(cfg)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.rotary_cache = {}         # (dtype, device) -> (cos, sin) over block_size positions; see rotary()
        self.init_weights()

    def split(self, i: int, j: int):
        """The layers as three plain lists: [:i], [i:j], [j:]."""
        layers = list(self.layers)
        return layers[:i], layers[i:j], layers[j:]

    # ---- initialisation ------------------------------------------------------

    @torch.no_grad()
    def init_weights(self):
        """One initialisation for every variant, so comparisons are fair (the MeSH paper's recipe, with
        Huginn's base std, Geiping et al. 2025, arXiv 2502.05171, where the paper does not state one):

        * every Linear/Embedding weight ~ N(0, std²) with std = sqrt(2 / (5 C)); biases 0; norm weights 1;
        * attention-out and MLP-down projections: std / sqrt(2 · unrolled depth) (depth-aware, MeSH §4.1);
        * the embeddings are multiplied by sqrt(C) in the forward pass, not here;
        * MeSH routers: the same small normal and zero bias, NEVER zero weights (zero weights would keep
          the empty slots 1..n_slots-1 identical forever; the MeSH paper states no router init: our choice);
        * the T²MLR gate keeps the reference's initialisation: W_p the PyTorch Linear default;
          A_r, A_x (C x 2C each) xavier-normal with gain g = gate_weight_gain, i.e. std g·sqrt(2/(3C));
          biases b_r, b_x = logit(gate_bias_prob) (p clamped to [1e-4, 1 - 1e-4], as the reference does)
          or, when that is None, the default of a Linear(2C -> C), U(-1/sqrt(2C), 1/sqrt(2C));
          θ_r = θ_x = 0 (identity at init).
        """
        std = math.sqrt(2 / (5 * self.cfg.n_embd))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        for layer in self.layers:
            for proj in (layer.attn.proj, layer.mlp.down):
                nn.init.normal_(proj.weight, mean=0.0, std=std / math.sqrt(2 * self.cfg.n_unrolled))
        if self.gate is not None:
            C = self.cfg.n_embd
            self.gate.proj.reset_parameters()
            gate_std = self.cfg.gate_weight_gain * math.sqrt(2 / (3 * C))
            nn.init.normal_(self.gate.gates_x.weight, std=gate_std)
            nn.init.normal_(self.gate.gates_r.weight, std=gate_std)
            if self.cfg.gate_bias_prob is None:
                nn.init.uniform_(self.gate.gates_x.bias, -1 / math.sqrt(2 * C), 1 / math.sqrt(2 * C))
            else:
                p = min(max(self.cfg.gate_bias_prob, 1e-4), 1 - 1e-4)
                nn.init.constant_(self.gate.gates_x.bias, math.log(p / (1 - p)))
            self.gate.theta_r.zero_()
            self.gate.theta_x.zero_()

    # ---- forward: idx -> logits. Read it top-down; each variant's path is one branch below ---------------

    def forward(self, idx, targets=None, mode=None, cache: Optional[InferenceCache] = None,
                control=None, tol: float = 0.0, recorder: Optional[Recorder] = None):
        """Logits and loss.

        idx: (B, T) token ids; targets: (B, T) ids, -1 = ignored. With `cache`, idx continues the
        sequence the cache holds (positions cache.length..), and the cache is updated in place.
        mode (T²MLR only, ignored by the other models): how the recurrence in time is computed.
            "jacobi"     D parallel Jacobi sweeps (as the paper and the reference train): jacobi_forward
            "exact"      token by token through the middle layers (as the reference evaluates): exact_forward
            "converged"  Jacobi sweeps until the state moves less than `tol` (a prefill): jacobi_forward
                         with D = T and b = 0
            None         "jacobi" in train() without a cache, else "exact".
        control (T²MLR only): (B, T) ints, 0 padding, 1 non-recurrent, >= 2 recurrent (control flow);
        None = every token recurrent.
        recorder: a Recorder to fill with the hidden states (probe.py), or None.
        Returns (logits (B, T, V), loss scalar or None). Raises ValueError when the sequence is longer
        than block_size, mode is unknown, "jacobi" is given a cache, "converged" a cache that already
        holds positions, or control's shape is not idx's.
        """
        B, T = idx.shape
        pos = cache.length if cache is not None else 0               # position of idx[:, 0]
        if pos + T > self.cfg.block_size:
            raise ValueError(f"sequence of {pos + T} tokens exceeds block_size = {self.cfg.block_size}")
        if control is not None and control.shape != idx.shape:
            raise ValueError(
                f"control has shape {tuple(control.shape)}; it must match idx, {tuple(idx.shape)}"
            )
        rec = recorder or NO_RECORDER
        h = self.wte(idx)                                             # token embeddings h_emb (B, T, C)
        if self.cfg.embed_scale:
            h = h * math.sqrt(self.cfg.n_embd)                        # scaled by sqrt(d) (MeSH paper §4.1)
        rec.state("h_emb", h)
        if self.gate is not None:                                     # T²MLR: the recurrence in time
            mode = mode or ("jacobi" if self.training and cache is None else "exact")
            if mode == "jacobi" and cache is not None:
                raise ValueError(
                    "mode 'jacobi' cannot continue a KV cache (its sweeps see the whole sequence at "
                    "once): use mode 'exact' (the default with a cache) or 'converged' for a prompt"
                )
            if mode == "jacobi":                                      # D sweeps (training)
                h = self.jacobi_forward(h, control, rec)
            elif mode == "exact":                                     # token by token
                h = self.exact_forward(h, control, cache, rec)
            elif mode == "converged":                                 # sweeps until exact (or within tol)
                if cache is not None and cache.length:
                    raise ValueError(
                        f"mode 'converged' fills an empty cache (a prompt); this one holds {cache.length} "
                        f"positions: continue it with mode 'exact'"
                    )
                h = self.jacobi_forward(h, control, rec, sweeps=T, grad_sweeps=0, tol=tol, cache=cache)
            else:
                raise ValueError(f"mode {mode!r} is not one of 'jacobi', 'exact', 'converged'")
        elif self.cfg.layout:                                         # recursive: prelude, K core loops, coda
            caches = iter(cache.layers) if cache is not None else None   # one per application, in order
            h = self.recursive_forward(h, pos, caches, rec)
        else:                                                         # vanilla: every layer once, in order
            h = self.run_layers(h, self.layers, pos, cache.layers if cache is not None else None, rec)
        rec.state("h_out", h)
        logits = self.lm_head(self.ln_f(h))                           # (B, T, V)
        loss = None
        if targets is not None:
            # in float32 at least (bf16 logits under autocast), in float64 for a float64 model
            logits_loss = logits.to(torch.promote_types(logits.dtype, torch.float32))
            loss = F.cross_entropy(logits_loss.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def run_layers(self, h, layers, pos, caches=None, recorder=None, name="layer"):
        """Apply `layers` in order to h (B, T, C) at positions pos..pos+T-1 -> (B, T, C). caches: an iterable
        with at least one LayerCache (or None) per layer, taken in order; None = no caches. recorder gets
        each layer's (input, output) as f"{name}{i}"."""
        cos, sin = self.rotary(pos, h.shape[1], h.dtype, h.device)   # rotary tables for these positions
        caches = iter(caches if caches is not None else [None] * len(layers))
        rec = recorder or NO_RECORDER
        for i, layer in enumerate(layers):
            h_in, h = h, layer(h, cos, sin, next(caches))
            rec.update(f"{name}{i}", h_in, h)
        return h

    def rotary(self, pos: int, T: int, dtype, device):
        """Rotary cos/sin tables (T, 1, rot_dim) for positions pos..pos+T-1, for a residual stream of `dtype`.

        The tables are float64 for a float64 model and float32 otherwise (bf16/fp16 activations, e.g.
        under autocast, rotate against fp32 tables, as apply_rotary casts back). They are computed once
        per (dtype, device) in that dtype, on the CPU, and cached: not buffers, so `model.to(dtype)`
        never casts them (a float64 table cast from float32 would carry float32's ~1e-7 error)."""
        dtype = torch.promote_types(dtype, torch.float32)
        key = (dtype, device)
        if key not in self.rotary_cache:
            cfg = self.cfg
            tables = rotary_tables(
                cfg.n_embd // cfg.n_head, cfg.rope_pct, cfg.rope_theta, cfg.block_size, dtype
            )
            self.rotary_cache[key] = tuple(t.to(device) for t in tables)
        cos, sin = self.rotary_cache[key]
        return cos[pos:pos + T], sin[pos:pos + T]

    # ---- depth: recursive transformers (MeSH paper §3) -------------------------------------------------

    def recursive_forward(self, h_emb, pos, caches, rec=NO_RECORDER):
        """h_emb (B, T, C) -> coda output (B, T, C); caches: an iterator of LayerCaches, one per layer
        application in order, or None (no KV caches). The MeSH paper §3.1:

            h(0) = f_pre(h_emb);  h(t+1) = f_core(h(t)) + h_sup(t), t = 0..K-1;  h_out = f_coda(h(K))

        h_sup is the state-passing rule (state_passing): 0 (base), h(t) (+residual), h(0) (+anchor), h_emb
        (+anchor*). MeSH (§3.2, Eq. 3) instead writes into and reads from the slot buffer: a transitional
        write-read step forms h(0) from the prelude output h_pre, and each loop's write-read forms h(t+1).

            slot   step 0 (transitional)      step 1 (loop 0)           step 2 (loop 1)   ...
            m_0    h_emb + w0_0·h_pre         + w1_0·f_core(h(0))       + w2_0·f_core(h(1))
            m_1    0     + w0_1·h_pre         + w1_1·f_core(h(0))       + w2_1·f_core(h(1))
            ...
                   h(0) = Σ_i r0_i m_i        h(1) = Σ_i r1_i m_i        h(2) = Σ_i r2_i m_i
            (wk = softmax of write_routers[k], rk = softmax of read_routers[k] at step k, per token)
        """
        cfg = self.cfg
        # self.prelude, self.core, self.coda: the layout's layer groups, lists of Layer (made in __init__)
        # forward the prelude once
        h = self.run_layers(h_emb, self.prelude, pos, caches, rec, "prelude")
        if cfg.state_passing == "mesh":    # the transitional step: write h_pre into the slots, read h(0)
            buffer = h_emb.new_zeros(self.mesh.n_slots, *h_emb.shape)         # (n_slots, B, T, C)
            buffer[0] = h_emb                                                   # m_0 = h_emb, m_1.. = 0
            router_in = h if cfg.mesh_trans_router_in == "pre" else h_emb
            buffer, h = self.mesh.write_read(0, buffer, router_in, h)
        h0 = h
        rec.state("h(0)", h0)
        # loop the core K times: the same weights, each loop with its own KV caches
        for t in range(self.n_loops):
            h_core = self.run_layers(h, self.core, pos, caches)                 # f_core(h(t))
            rec.update(f"core{t}", h, h_core)
            if cfg.state_passing == "mesh":          # MeSH: write f_core(h(t)), read h(t+1); routers see h(t)
                buffer, h = self.mesh.write_read(t + 1, buffer, h, h_core)
            elif cfg.state_passing == "base":        # h(t+1) = f_core(h(t))
                h = h_core
            elif cfg.state_passing == "residual":    # h(t+1) = f_core(h(t)) + h(t)
                h = h_core + h
            elif cfg.state_passing == "anchor":      # h(t+1) = f_core(h(t)) + h(0)
                h = h_core + h0
            else:                                 # anchor_star: h(t+1) = f_core(h(t)) + h_emb
                h = h_core + h_emb
            rec.state(f"h({t + 1})", h)
        # forward the coda once
        return self.run_layers(h, self.coda, pos, caches, rec, "coda")

    # ---- time: T²MLR (Jacobi training, exact recurrence) ------------------------------------

    def middle_step(self, x, state, pos=0, caches=None, recurrent=None, gates_x=None, gammas=None,
                    rec=NO_RECORDER):
        """The recurrent middle of T²MLR, applied to the positions in x (all T of them in a Jacobi sweep, one
        token at a time in the exact recurrence): each position t mixes the state R_{t-1} it is given into
        its input of layer l_start, runs the middle layers l_start..l_end, and writes the state R_t from
        their output h_t.

        x, state: (B, L, C), L the positions of this call (state may be (B, 1, C), broadcast): the input of
        l_start and R_{t-1} per position. pos: the position of x[:, 0]; caches: the middle layers'
        LayerCaches (one each, in order) or None.
        recurrent: (B, L, 1) bool or None (all recurrent): control flow (the note after TemporalGate).
        gates_x, gammas: the parts of the gate that do not depend on the state, A^x x + [b_r; b_x] (B, L, 2C)
        and (tanh θ_r, tanh θ_x), if the caller computed them once for many calls (the speed-up), else None.
        rec gets ("gate", x, x') and the middle layers' (input, output) pairs.
        Returns (h (B, L, C) the output of l_end, R (B, L, C) the state written at each position).
        """
        cfg, gate = self.cfg, self.gate      # gate: TemporalGate, the parameters W_p, A, b_r, b_x, θ below
        # mix (the gate): r~ = W_p R_{t-1};  [a_r; a_x] = σ(A [x; r~] + [b_r; b_x]);
        #                 x' = x + tanh(θ_r) · a_r ⊙ r~ + tanh(θ_x) · a_x ⊙ x
        # speed-up: A [x; r~] + [b_r; b_x] = (A^x x + [b_r; b_x]) + A^r r~, the first part gate.gates_x(x)
        # (computed once per forward when the caller passes it), the second gate.gates_r(r~); likewise tanh θ
        r_tilde = gate.proj(state)                                                   # W_p R_{t-1}
        gates_x = gate.gates_x(x) if gates_x is None else gates_x                    # A^x x + [b_r; b_x]
        a_r, a_x = torch.sigmoid(gates_x + gate.gates_r(r_tilde)).chunk(2, dim=-1)   # both local gates
        # the global gates θ_r, θ_x (zero at init: x' = x) are fp32 master weights, and autocast leaves tanh
        # in fp32 (as the reference keeps them)
        if gammas is None:
            gammas = torch.tanh(gate.theta_r).to(x.dtype), torch.tanh(gate.theta_x).to(x.dtype)
        gamma_r, gamma_x = gammas
        x_mixed = x + gamma_r * a_r * r_tilde + gamma_x * a_x * x
        if recurrent is not None:                                     # non-recurrent tokens pass x through
            x_mixed = torch.where(recurrent, x_mixed, x)
        rec.update("gate", x, x_mixed)
        # forward the middle layers
        h = self.run_layers(x_mixed, self.middle, pos, caches, rec, "middle")
        # write the state R_t from h_t (as the reference writes it):
        #   residual off: R_t = h_t
        #   residual on:  u_t = h_t + R_{t-1};  R_t = s_t · u_t,
        #                 s_t = clamp(1 / sqrt(mean(u_t²) + 1e-6), 1/5, 5)
        # s_t is a stop-gradient constant computed on detach(u_t) (NOT an nn.RMSNorm: no weight, and the clamp
        # changes values when RMS(u) > 5); recurrent_detach also stops the gradient along the R chain.
        if not cfg.recurrent_residual:
            return h, h
        u = h + (state.detach() if cfg.recurrent_detach else state)
        scale = u.detach().pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt().clamp(0.2, 5.0)
        # non-recurrent tokens write their raw h_t
        return h, (u * scale if recurrent is None else torch.where(recurrent, u * scale, h))

    def jacobi_forward(self, h_emb, control=None, rec=NO_RECORDER, sweeps=None, grad_sweeps=None, tol=None,
                       cache=None):
        """Parallel T²MLR by Jacobi sweeps (as the paper and the reference train). h_emb (B, T, C) -> top
        output (B, T, C).

        A sweep is one middle_step over all T positions at once, each position reading the state that the
        previous sweep wrote for the position before it. The start R^(0) = 0 is exact at position 0, and
        every sweep makes one more position exact (the exactness front):

            position:    0  1  2  3            R^(j)[t] = the state fed to token t after j sweeps
            R^(0)        ✓  ·  ·  ·            ✓ = equal to the exact recurrence's R_{t-1}
            R^(1)        ✓  ✓  ·  ·            sweep j: h, R = middle_step(x, R^(j-1)) for all t,
            R^(2)        ✓  ✓  ✓  ·                     R^(j) = R shifted one position right
            R^(3)        ✓  ✓  ✓  ✓

        Sweeps 1..D-1 only refine the state; sweep D is the final one, whose middle output goes on to the
        upper layers, so positions < D of the output are exact (all of them when D >= T). The gradient
        flows through the final sweep and the b sweeps before it: min(b + 1, D) sweeps run with autograd
        (b = D and b = D - 1 differ only with the plain start, whose gradient b = D keeps too).
        sweeps, grad_sweeps, tol: D, b and the early-stop tolerance; None = the config's jacobi_sweeps,
        jacobi_grad_sweeps and jacobi_tol (training). tol > 0 stops the sweeps without gradient once one
        moved the state by at most tol relative to its RMS, max|R^(j) - R^(j-1)| <= tol · RMS(R^(j)); the
        gradient sweeps always run; tol = 0 runs all of them. The middle passes run are left in
        self.jacobi_passes (D with no early stop, D + 1 with the plain start).
        Mode "converged" (a prefill) runs it with D = T, b = 0 and its own tol: exact up to rounding at
        tol = 0. An empty `cache` then receives every layer's keys and values and the final state R_{T-1}.
        control (B, T) or None: only tokens with c > 1 are mixed and merged (control flow: the note after
        TemporalGate).
        Where it departs from the reference (same values and gradients from the same start): the lower
        layers run once and x is reused by every sweep and by the final one; the reference first runs one
        plain pass of the whole model (for its warm start, jacobi_init "plain") and reruns the whole model
        in the final pass.
        """
        cfg = self.cfg
        D = cfg.jacobi_sweeps if sweeps is None else sweeps
        b = cfg.jacobi_grad_sweeps if grad_sweeps is None else grad_sweeps
        tol = cfg.jacobi_tol if tol is None else tol
        caches = iter(cache.layers) if cache is not None else None      # one per layer, in order
        # self.lower, self.middle, self.upper: the layers below l_start, l_start..l_end, above l_end
        # forward the lower layers once: their output x is the same in every sweep
        x = self.run_layers(h_emb, self.lower, 0, caches, rec, "lower")
        # speed-up: the parts of the gate that do not depend on the state, the same in every sweep
        gates_x = self.gate.gates_x(x)                                       # A^x x + [b_r; b_x]
        gammas = torch.tanh(self.gate.theta_r).to(x.dtype), torch.tanh(self.gate.theta_x).to(x.dtype)
        recurrent = None if control is None else (control > 1).unsqueeze(-1)   # (B, T, 1) or None

        def shift(R):      # R_t written at position t is read by token t + 1; token 0 reads R_{-1} = 0
            return F.pad(R[:, :-1], (0, 0, 1, 0))

        def sweep(state):  # one Jacobi sweep: the new state R^(j) from R^(j-1), all positions in parallel
            return shift(self.middle_step(x, state, 0, None, recurrent, gates_x, gammas)[1])

        # the start R^(0): zeros, or the reference's warm start (jacobi_init "plain"): the middle layers'
        # output on x without mixing, shifted (one middle pass more; it keeps its gradient only when b >= D)
        grad = torch.is_grad_enabled()
        if cfg.jacobi_init == "plain":
            with torch.set_grad_enabled(grad and b >= D):
                state = shift(self.run_layers(x, self.middle, 0))
        else:
            state = torch.zeros_like(x)
        self.jacobi_passes = 1 + (cfg.jacobi_init == "plain")          # the final sweep, the plain start
        # sweeps 1..D-1-b refine the state without gradient (and stop early once it moves less than tol)
        with torch.no_grad():
            for _ in range(D - 1 - min(b, D - 1)):
                new, self.jacobi_passes = sweep(state), self.jacobi_passes + 1
                converged = tol > 0 and (new - state).abs().max() <= tol * new.pow(2).mean().sqrt()
                state = new
                if converged:
                    break
        # the last b sweeps before the final one keep their gradient (checkpointed: recomputed in backward)
        for _ in range(min(b, D - 1)):
            if grad and cfg.jacobi_checkpoint:
                state = checkpoint(sweep, state, use_reentrant=False)
            else:
                state = sweep(state)
            self.jacobi_passes += 1
        # sweep D, the final one: its middle output goes on (and fills the middle layers' caches)
        h, R = self.middle_step(x, state, 0, caches, recurrent, gates_x, gammas, rec)
        rec.state("R", R)
        if cache is not None:
            cache.state = R[:, -1:]                         # R_{T-1}: decoding continues from it
        # forward the upper layers
        return self.run_layers(h, self.upper, 0, caches, rec, "upper")

    def exact_forward(self, h_emb, control=None, cache=None, rec=NO_RECORDER):
        """The exact T²MLR recurrence (as the paper defines it and the reference evaluates).
        h_emb (B, T, C) -> top output (B, T, C).

        The lower layers run in parallel over all T positions, the middle layers token by token (middle_step),
        each token reading the state R_{t-1} written by the token before it (R_{-1} = 0), and the upper
        layers in parallel again. The middle layers need KV caches (a token attends to the keys of the tokens
        before it); with `cache` (generation) every layer uses its own and the state continues from
        cache.state, without one the middle layers get caches for this call only.
        control (B, T) or None: tokens with c > 1 are mixed and merged, the others pass through and write
        their raw h. A span where no row is recurrent needs no state, so it goes through the middle layers
        in one parallel chunk (a prompt); recurrent tokens go one at a time.
        rec gets the lower and upper layers, the middle layers as one unit "middle" (they run token by
        token; probe.py splits them) and the states R_t written at every position.
        """
        B, T, C = h_emb.shape
        pos = cache.length if cache is not None else 0
        # self.lower, self.middle, self.upper: the layers below l_start, l_start..l_end, above l_end
        caches = iter(cache.layers) if cache is not None else None          # one per layer, in order
        # forward the lower layers over all positions at once
        x = self.run_layers(h_emb, self.lower, pos, caches, rec, "lower")
        # the middle layers' KV caches, grown token by token
        middle_caches = [next(caches) if cache is not None else LayerCache(T) for _ in self.middle]
        # speed-up: the parts of the gate that do not depend on the state, once for all positions
        gates_x = self.gate.gates_x(x)                                       # A^x x + [b_r; b_x]
        gammas = torch.tanh(self.gate.theta_r).to(x.dtype), torch.tanh(self.gate.theta_x).to(x.dtype)
        recurrent = None if control is None else (control > 1).unsqueeze(-1)   # (B, T, 1) or None
        state = cache.state if cache is not None and cache.state is not None else x.new_zeros(B, 1, C)
        # the chunks: one token each, except that a span in which no row reads the state (no row is
        # recurrent) is one chunk: a chunk starts at every recurrent token and after every recurrent token
        reads = [True] * T if recurrent is None else recurrent.any(dim=0).view(-1).tolist()
        starts = [t for t in range(T) if t == 0 or reads[t] or reads[t - 1]]
        outputs, states = [], []
        for t, end in zip(starts, starts[1:] + [T]):
            chunk = None if recurrent is None else recurrent[:, t:end]
            # mix R_{t-1} in, forward the middle layers on this token (attending to the cached keys of the
            # tokens before it), write R_t
            h_t, R_t = self.middle_step(
                x[:, t:end], state, pos + t, middle_caches, chunk, gates_x[:, t:end], gammas
            )
            state = R_t[:, -1:]
            outputs.append(h_t)
            states.append(R_t)
        if cache is not None:
            cache.state = state
        h = torch.cat(outputs, dim=1)
        rec.update("middle", x, h)
        if rec.active:                  # R_t of every position, concatenated only when someone records it
            rec.state("R", torch.cat(states, dim=1))
        # forward the upper layers over all positions at once
        return self.run_layers(h, self.upper, pos, caches, rec, "upper")

    # ---- generation ------------------------------------------------------------

    def new_cache(self, max_len: Optional[int] = None) -> InferenceCache:
        """An empty InferenceCache with one LayerCache per layer application (max_len default block_size)."""
        return InferenceCache(self.cfg.n_unrolled, max_len or self.cfg.block_size)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
                 generator: Optional[torch.Generator] = None, recurrent_prompt: bool = False,
                 prefill: str = "exact", prefill_tol: float = 0.0):
        """Continue idx (B, T) by max_new_tokens sampled tokens -> (B, T + max_new_tokens).

        Each token is drawn from the last logits of the model run on the last block_size tokens: exactly
        what a full recompute over that window gives (T²MLR: the exact recurrence, its state starting
        at the window's first token). While the sequence fits in block_size, a KV cache makes each step
        one token of work. Beyond it the window slides by one token per step and every token in it
        changes position, so every layer's keys and values (and T²MLR's state) change and no cache can
        be reused exactly: each step is then a full forward over block_size tokens, nanoGPT's cost.
        (Rebuilding the cache from a shorter window every few steps is cheaper, but it conditions on
        fewer tokens than block_size, and so picks other tokens.)

        Sampling, see sample_next: temperature 0 = greedy; any temperature > 0 is safe, and one so small
        that logits / temperature would overflow gives the greedy tokens; top_k None = all tokens,
        k >= 1 keeps the k most likely (clamped to the vocabulary). Raises ValueError for a negative or
        NaN temperature and for top_k < 1.

        T²MLR control flow (ignored by other models): generated tokens are recurrent (c = 2); the prompt is
        non-recurrent (c = 1: not mixed, and the state after it is the last prompt token's raw l_end
        output), as the reference generates, unless recurrent_prompt=True (c = 2 everywhere, which equals
        control=None: how train.py trains on plain text). prefill (T²MLR): how the prompt is processed:
        "exact" (token by token) or "converged" (parallel Jacobi sweeps until the state moves less than
        prefill_tol, jacobi_forward; 0 = exact up to rounding). Decoding, and the recompute of a slid
        window, are always exact (a converged recompute of every window would cost up to block_size sweeps
        per new token).
        """
        if prefill not in ("exact", "converged"):
            raise ValueError(f"prefill {prefill!r} is not one of 'exact', 'converged'")
        if not 0 <= prefill_tol < 1:              # also NaN
            raise ValueError(f"prefill_tol = {prefill_tol} must be in [0, 1) (0 = sweep until exact)")
        if not temperature >= 0:                  # also NaN
            raise ValueError(f"temperature = {temperature} must be >= 0 (0 = greedy)")
        if top_k is not None and top_k < 1:
            raise ValueError(
                f"top_k = {top_k} must be >= 1 (the number of most likely tokens to sample from), "
                f"or None for all tokens"
            )
        window = self.cfg.block_size
        control = torch.full_like(idx, 2 if recurrent_prompt else 1)   # (B, T), grows with idx
        # the cache: cache.layers, a LayerCache (the keys and values so far) per layer application in order;
        # cache.state, T²MLR's R_{t-1} (B, 1, C); cache.length, the positions it holds
        cache = InferenceCache(self.cfg.n_unrolled, window)
        # process the prompt (its last block_size tokens), filling every layer's KV cache (and T²MLR's state)
        logits, _ = self(
            idx[:, -window:], mode=prefill, cache=cache, control=control[:, -window:], tol=prefill_tol
        )
        for step in range(max_new_tokens):
            # draw the next token (B, 1) from the last position's logits (greedy at temperature 0, else from
            # softmax(logits / temperature) over the top_k) and append it
            idx_next = self.sample_next(logits[:, -1, :], temperature, top_k, generator)
            idx = torch.cat([idx, idx_next], dim=1)
            control = torch.cat([control, torch.full_like(idx_next, 2)], dim=1)   # generated: recurrent
            if step == max_new_tokens - 1:
                break
            if idx.shape[1] <= window:
                # the cache holds all of idx: feed the new token only (T²MLR: exact, continuing the state)
                logits, _ = self(idx_next, mode="exact", cache=cache, control=control[:, -1:])
            else:
                # the window slid: every position moved, so recompute the whole window without a cache,
                # exactly (a converged recompute would cost up to block_size sweeps for every new token)
                logits, _ = self(idx[:, -window:], mode="exact", control=control[:, -window:])
        return idx

    @staticmethod
    def sample_next(logits, temperature: float, top_k: Optional[int] = None,
                    generator: Optional[torch.Generator] = None):
        """One token per row from next-token logits (B, V) -> (B, 1) ids.

        temperature 0: the argmax (the first of exact ties). temperature > 0: a draw from
        softmax((logits - max) / temperature), in float32 at least (float64 for float64 logits).
        Subtracting the max first keeps every scaled logit <= 0 with the maximum at exactly 0, so no
        temperature overflows: as it goes to 0 the distribution becomes one-hot on the argmax (shared
        evenly by exact ties), and a temperature so small that the division underflows or overflows
        (1e-40, 1e-320) gives just that, the greedy token; temperature = inf is uniform over the kept
        tokens. top_k: None keeps every token, k >= 1 the k largest logits (all of them when k >= V;
        tokens tied with the k-th are kept too).
        """
        if temperature == 0:
            return logits.argmax(dim=-1, keepdim=True)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        diff = logits - logits.amax(dim=-1, keepdim=True)                # <= 0, exactly 0 at the maximum
        # never NaN, even if temperature -> 0 in this dtype
        scaled = torch.where(diff == 0, diff, diff / temperature)
        if top_k is not None and top_k < logits.size(-1):
            kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(logits < kth, -math.inf)
        return torch.multinomial(F.softmax(scaled, dim=-1), num_samples=1, generator=generator)

    # ---- released checkpoints (Pythia, SmolLM2) ----------------------------------

    @classmethod
    def from_pretrained(cls, name_or_path: str, **overrides) -> "GPT":
        """A released Pythia or SmolLM2 model as a GPT: name_or_path is a local Hugging Face folder or a hub
        id (hf_checkpoint); the config is its config.json plus `overrides` (config_from_hf). The T²MLR paper's
        §3.4 retrofit: GPT.from_pretrained("HuggingFaceTB/SmolLM2-135M", t2mlr=True, l_start=12, l_end=17).
        Its new gate starts as an exact identity (θ_r = θ_x = 0), so at step 0 the logits are the released
        model's. Raises ValueError (unsupported architecture or field, missing or misshapen tensors)."""
        hf_config, weight_files = hf_checkpoint(name_or_path)
        model = cls(config_from_hf(hf_config, **overrides))
        model.load_hf_weights(weight_files)
        return model

    def load_hf_weights(self, weight_files):
        """Copy the tensors of Hugging Face safetensors files into this model (cast to its dtype). Every
        tensor must find its place and shape, and every tensor of the model must be given, except a
        T²MLR gate (it keeps its identity initialisation). Raises ValueError naming the first problems."""
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ValueError(
                "reading Hugging Face weights needs safetensors: pip install safetensors"
            ) from None
        tensors = {}
        for path in weight_files:
            tensors |= load_file(path)
        state = state_from_hf(tensors, self.cfg)
        tied = {"lm_head.weight"} if self.cfg.tie_embeddings else set()
        problems = state_differences(state, self.state_dict(), lambda k: k in tied or k.startswith("gate."))
        if problems:
            more = f" and {len(problems) - 4} more" if len(problems) > 4 else ""
            raise ValueError(f"the checkpoint does not fit this config: {', '.join(problems[:4])}{more}")
        self.load_state_dict(state, strict=False)

    # ---- accounting and optimizer ----------------------------------------------

    def param_counts(self) -> dict:
        """Parameter counts (each shared tensor once): total; embedding (token embedding and output head);
        non_embedding = the transformer layers and final norm (the papers' count, as in the MeSH paper's Table
        5); router (MeSH) and gate (T²MLR) separately."""
        counts = {"total": 0, "embedding": 0, "non_embedding": 0, "router": 0, "gate": 0}
        for name, p in self.named_parameters():
            group = ("embedding" if name.startswith(("wte.", "lm_head.")) else
                     "router" if name.startswith("mesh.") else
                     "gate" if name.startswith("gate.") else "non_embedding")
            counts[group] += p.numel()
            counts["total"] += p.numel()
        return counts

    def layer_passes(self):
        """Per unique layer, (forward passes, backward passes) in one training step, for FLOP counting.

        Plain and recursive: each application once forward and once backward (a core layer K times).
        T²MLR Jacobi (see jacobi_forward): lower 1/1; middle D forward (D - 1 refining sweeps and the final
        sweep), min(b, D - 1) + 1 backward; upper 1/1. jacobi_init "plain" adds one middle forward (and its
        backward when b = D, which keeps the start's gradient too), jacobi_checkpoint the recomputed forwards
        of the gradient sweeps; jacobi_tol can only lower the count, so the count is its maximum.
        """
        n_prelude, n_core, K, n_coda = self.cfg.depth
        passes = [(1, 1)] * n_prelude + [(K, K)] * n_core + [(1, 1)] * n_coda
        if self.gate is not None:
            cfg = self.cfg
            start, end = cfg.recurrent_layers
            D, b = cfg.jacobi_sweeps, cfg.jacobi_grad_sweeps
            grad_sweeps, plain = min(b, D - 1), cfg.jacobi_init == "plain"
            middle = (D + plain + grad_sweeps * cfg.jacobi_checkpoint, grad_sweeps + 1 + (plain and b >= D))
            passes = [middle if start <= i <= end else (1, 1) for i in range(len(passes))]
        return passes

    def train_flops_per_token(self, T: Optional[int] = None) -> float:
        """FLOPs of one training step (forward + backward) per token at sequence length T (default
        block_size).

        A layer forward costs 2·P + 4·C·T per token, P the parameters of one layer (matmuls plus attention
        scores and values, as nanoGPT/PaLM count it), and its backward twice that; the output head 6·C·V.
        Looped layers and Jacobi sweeps count every time they run (nanoGPT's 6N undercounts looped models).
        """
        cfg = self.cfg
        T = T or cfg.block_size
        params_per_layer = sum(p.numel() for p in self.layers[0].parameters())
        layer_fwd = 2 * params_per_layer + 4 * cfg.n_embd * T
        flops = sum((fwd + 2 * bwd) * layer_fwd for fwd, bwd in self.layer_passes())
        if self.gate is not None:
            start, _ = self.cfg.recurrent_layers
            fwd, bwd = self.layer_passes()[start]
            if cfg.jacobi_init == "plain":     # the plain start's middle pass runs no gate
                fwd, bwd = fwd - 1, bwd - (cfg.jacobi_grad_sweeps >= cfg.jacobi_sweeps)
            per_pass = sum(p.numel() for p in (*self.gate.proj.parameters(), *self.gate.gates_r.parameters()))
            # W_p and the r half with every sweep
            flops += (fwd + 2 * bwd) * 2 * per_pass
            flops += 6 * sum(p.numel() for p in self.gate.gates_x.parameters())   # the x half once
        if self.mesh is not None:
            flops += 6 * sum(p.numel() for p in self.mesh.parameters())
        return flops + 6 * cfg.n_embd * cfg.vocab_size

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW with weight decay on >= 2-D tensors only (matrices and embeddings; not biases, norms, θ)."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == "cuda")


# -----------------------------------------------------------------------------
# Released checkpoints: Pythia (GPTNeoXForCausalLM) and SmolLM2 (LlamaForCausalLM) as Hugging Face saves them.
# Our neox and llama layers are those architectures (test_pretrained.py checks the logits against
# `transformers`), so a released model is a GPTConfig plus renamed tensors. Read with `safetensors` only.

def state_differences(source: dict, own: dict, optional=lambda name: False) -> list:
    """Why the state dict `source` does not load into a model whose state dict is `own`, one message per
    tensor: a shape that differs, a tensor the model lacks, a tensor of the model that source lacks (unless
    optional(name), e.g. the T²MLR gate, which keeps its identity initialisation). [] when it fits; used by
    load_hf_weights and by train.py's checkpoint loaders."""
    return (
        [f"{k} {tuple(v.shape)} vs this model's {tuple(own[k].shape)}"
         for k, v in source.items() if k in own and v.shape != own[k].shape]
        + [f"{k} is not in this model" for k in source if k not in own]
        + [f"{k} is missing" for k in own if k not in source and not optional(k)]
    )


def hf_checkpoint(name_or_path: str):
    """(config.json as a dict, [*.safetensors paths]) of a Hugging Face checkpoint: a local folder, or a hub
    id such as "HuggingFaceTB/SmolLM2-135M" fetched (and cached) through huggingface_hub. Raises ValueError
    naming the checkpoint when it cannot be found or holds no config.json / safetensors weights."""
    folder = name_or_path
    if not os.path.isdir(folder):
        if os.path.exists(folder) or folder.startswith((".", "/")):
            raise ValueError(
                f"{name_or_path!r} is not a folder: give a folder holding config.json and *.safetensors, "
                f"or a hub id such as 'HuggingFaceTB/SmolLM2-135M'"
            )
        try:
            from huggingface_hub import snapshot_download
        except ImportError:
            raise ValueError(f"{name_or_path!r} is not a local folder, and fetching it from the hub needs "
                             f"huggingface_hub: pip install huggingface_hub") from None
        try:
            folder = snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors"])
        except Exception as e:             # offline, unknown id, gated repo: many exception types
            raise ValueError(f"cannot fetch {name_or_path!r} from the Hugging Face hub ({type(e).__name__}); "
                             f"give a local folder holding config.json and *.safetensors") from None
    config_path = os.path.join(folder, "config.json")
    weights = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not os.path.isfile(config_path) or not weights:
        raise ValueError(
            f"{name_or_path!r} holds no "
            f"{'config.json' if not os.path.isfile(config_path) else '*.safetensors'}"
            f" (pytorch_model.bin is not read: save the model with safetensors)"
        )
    with open(config_path) as f:
        return json.load(f), weights


def config_from_hf(hf: dict, **overrides) -> GPTConfig:
    """The GPTConfig of a Hugging Face config.json (dict), then `overrides` (e.g. t2mlr=True, l_start=12,
    l_end=17, block_size=1024). Reads both the transformers 4 keys (rotary_pct, rotary_emb_base, rope_theta)
    and the transformers 5 ones (rope_parameters). The token embeddings are not scaled (embed_scale=False).

    Raises ValueError, naming the field, for an architecture other than GPTNeoXForCausalLM / LlamaForCausalLM
    and for any setting these layers do not have: RoPE scaling, sliding windows, sequential NeoX residuals,
    biases on LLaMA linears (or none on NeoX's), another activation, dropout, a head_dim != n_embd /
    n_head."""
    arch = (hf.get("architectures") or [hf.get("model_type", "?")])[0]
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    n_embd, n_head = hf["hidden_size"], hf["num_attention_heads"]
    expected = {"rope type": (rope_type, "default"), "sliding_window": (hf.get("sliding_window"), None),
                "attention_dropout": (hf.get("attention_dropout", 0.0), 0.0),
                "hidden_dropout": (hf.get("hidden_dropout", 0.0), 0.0),
                "head_dim": (hf.get("head_dim") or n_embd // n_head, n_embd // n_head)}
    if arch == "GPTNeoXForCausalLM":            # Pythia: parallel residual, LayerNorm, biases, partial rotary
        expected |= {"hidden_act": (hf.get("hidden_act"), "gelu"),
                     "use_parallel_residual": (hf.get("use_parallel_residual", True), True),
                     "attention_bias": (hf.get("attention_bias", True), True)}
        cfg = dict(flavour="neox", n_kv_head=n_head, norm_eps=hf.get("layer_norm_eps", 1e-5), bias=True,
                   rope_theta=rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0)),
                   # GPT-NeoX's default
                   rope_pct=rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25)))
    # SmolLM2: sequential residual, RMSNorm, SwiGLU, GQA, no biases
    elif arch == "LlamaForCausalLM":
        expected |= {"hidden_act": (hf.get("hidden_act"), "silu"),
                     "attention_bias": (hf.get("attention_bias", False), False),
                     "mlp_bias": (hf.get("mlp_bias", False), False)}
        cfg = dict(flavour="llama", n_kv_head=hf.get("num_key_value_heads") or n_head, bias=False,
                   norm_eps=hf.get("rms_norm_eps", 1e-6), rope_pct=rope.get("partial_rotary_factor", 1.0),
                   rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    else:
        raise ValueError(
            f"architecture {arch!r} is not supported; from_pretrained reads GPTNeoXForCausalLM (Pythia) "
            f"and LlamaForCausalLM (SmolLM2)"
        )
    for field, (value, ours) in expected.items():
        if value != ours:
            raise ValueError(f"{arch}: {field} = {value!r} is not supported (these layers have {ours!r})")
    cfg |= dict(
        vocab_size=hf["vocab_size"],
        block_size=hf["max_position_embeddings"],
        n_layer=hf["num_hidden_layers"],
        n_head=n_head,
        n_embd=n_embd,
        mlp_hidden=hf["intermediate_size"],
        tie_embeddings=hf.get("tie_word_embeddings", False),
        embed_scale=False,
    )
    return GPTConfig(**(cfg | overrides))


# Per-layer tensor names: Hugging Face's (after "gpt_neox.layers.{i}." / "model.layers.{i}.") -> ours
# (after "layers.{i}."). Several names mapped to one of ours (q/k/v -> attn.qkv, gate/up -> mlp.up) are fused
# by concatenating their rows in the order they appear here.
HF_LAYER_NAMES = {
    "neox": {
        "input_layernorm": "ln1",
        "post_attention_layernorm": "ln2",
        "attention.dense": "attn.proj",
        "attention.query_key_value": "attn.qkv",
        "mlp.dense_h_to_4h": "mlp.up",
        "mlp.dense_4h_to_h": "mlp.down",
    },
    "llama": {
        "input_layernorm": "ln1",
        "post_attention_layernorm": "ln2",
        "self_attn.o_proj": "attn.proj",
        "self_attn.q_proj": "attn.qkv",
        "self_attn.k_proj": "attn.qkv",
        "self_attn.v_proj": "attn.qkv",
        "mlp.gate_proj": "mlp.up",
        "mlp.up_proj": "mlp.up",
        "mlp.down_proj": "mlp.down",
    },
}
HF_TOP_NAMES = {
    "neox": {"gpt_neox.embed_in": "wte", "gpt_neox.final_layer_norm": "ln_f", "embed_out": "lm_head"},
    "llama": {"model.embed_tokens": "wte", "model.norm": "ln_f", "lm_head": "lm_head"},
}
HF_LAYER_PREFIX = {"neox": "gpt_neox.layers.", "llama": "model.layers."}
# buffers that old NeoX checkpoints saved (the causal mask, rotary frequencies): recomputed here, never read
HF_IGNORED = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")


def neox_qkv_rows(t, n_head):
    """NeoX's fused query_key_value stores its rows per head, [q_h, k_h, v_h] for h = 0..n_head-1; ours
    stores [q_0..q_{n-1}, k_0.., v_0..]. t: weight (3C, C) or bias (3C,) -> the same tensor, rows
    regrouped."""
    return t.unflatten(0, (n_head, 3, -1)).transpose(0, 1).flatten(0, 2)


def state_from_hf(tensors: dict, cfg: GPTConfig) -> dict:
    """A Hugging Face state dict (name -> tensor) as this model's state dict: renamed (HF_LAYER_NAMES,
    HF_TOP_NAMES), q/k/v and SwiGLU gate/up fused by rows in the table's order, NeoX's per-head qkv
    regrouped (neox_qkv_rows). A tied model takes the embedding only: a saved lm_head must equal it.
    Raises ValueError naming a tensor that has no place in the model."""
    layer_names, prefix = HF_LAYER_NAMES[cfg.flavour], HF_LAYER_PREFIX[cfg.flavour]
    pieces = {}                                              # our name -> [(order, tensor), ...]
    for name, t in tensors.items():
        if name.endswith(HF_IGNORED):
            continue
        stem, kind = name.rsplit(".", 1)                     # kind: "weight" or "bias"
        if stem.startswith(prefix):                          # "model.layers.3.self_attn.k_proj"
            i, hf_name = stem[len(prefix):].split(".", 1)
            ours = layer_names.get(hf_name)
            order = list(layer_names).index(hf_name) if ours else 0     # the row order of a fused tensor
            key = f"layers.{i}.{ours}.{kind}"
        else:
            ours, order = HF_TOP_NAMES[cfg.flavour].get(stem), 0
            key = f"{ours}.{kind}"
        if ours is None:
            raise ValueError(f"tensor {name!r} has no place in a {cfg.flavour} model")
        if cfg.flavour == "neox" and ours == "attn.qkv":
            t = neox_qkv_rows(t, cfg.n_head)
        pieces.setdefault(key, []).append((order, t))
    state = {key: torch.cat([t for _, t in sorted(p, key=lambda x: x[0])]) for key, p in pieces.items()}
    if cfg.tie_embeddings and "lm_head.weight" in state:
        if not torch.equal(state.pop("lm_head.weight"), state.get("wte.weight")):
            raise ValueError(
                "the config ties the output head to the embedding (tie_word_embeddings), but the "
                "checkpoint's lm_head differs from its embedding"
            )
    return state


# -----------------------------------------------------------------------------
# `python model.py config/<name>.py`: a summary of the architecture

def summary(cfg: GPTConfig) -> str:
    """A human-readable summary of a config: flavour, layout, depth, parameter counts, FLOPs per token.
    The model is built on the meta device, so even the 1.4B summary needs no memory."""
    with torch.device("meta"):
        model = GPT(cfg)
    counts = model.param_counts()
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
        lines.append(f"router params      {counts['router']:,} (+{model.mesh.n_slots} slots, {K + 1} steps)")
    if model.gate is not None:
        start, end = cfg.recurrent_layers
        lines.append(
            f"T²MLR gate params  {counts['gate']:,} (layers {start}..{end}, D={cfg.jacobi_sweeps}, "
            f"b={cfg.jacobi_grad_sweeps})"
        )
    lines.append(f"train FLOPs/token  {model.train_flops_per_token():,.0f} at T={cfg.block_size}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys
    from configurator import ConfigError, load_config
    # config files hold training keys too: skipped here (train.py checks them), so train.py is not imported
    try:
        (model_cfg,), _ = load_config(sys.argv[1:], GPTConfig, skip_unknown=True)
    except (ConfigError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(summary(model_cfg))
