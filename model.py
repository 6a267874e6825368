"""
One file, every variant: a vanilla GPT, recursive transformers with MeSH, and T²MLR.

MeSH (Yu et al., arXiv 2510.07739): a prelude, ONE weight-shared core looped K times, a coda;
between the loops a buffer of n_slots slots with a write and a read router per step carries the
state. T²MLR (arXiv 2607.15178): the output of layer l_end at token t-1, merged into the recurrent
state R_{t-1}, is gated into the input of layer l_start at token t; trained by parallel Jacobi
sweeps, run exactly token by token.

The README holds the equations (each once), the reading map and the glossary; the comments here cite
the papers' sections ("MeSH §3.2") and give shapes: B batch, T positions of this call, C = n_embd, V
vocabulary. "The reference" is the public T²MLR code (github.com/princeton-pli/T2MLR); "our reading"
marks a choice the papers leave open; "speed-up" marks an optimisation written after the direct form
it computes. test_equivalence.py checks every variant against slow, obvious definitions in float64.
It needs only torch; GPT.from_pretrained and `python model.py` import the rest of the repository.
"""

import math
import re
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


# -----------------------------------------------------------------------------
# The transformer layer: attention with rotary and an optional KV cache, MLP

class LayerCache:
    """Keys and values of one layer application, at most `max_len` positions. update(k, v) appends
    (B, n_kv_head, T, hs) tensors and returns all cached ones; RuntimeError on an overflow."""

    def __init__(self, max_len: int):
        self.max_len, self.k, self.v, self.length = max_len, None, None, 0

    def update(self, k, v):
        n, T = self.length, k.shape[2]
        if n + T > self.max_len:
            raise RuntimeError(f"KV cache full: {n} + {T} > {self.max_len} positions")
        # the direct form, autograd-safe (training through the exact loop; a cache begun so stays)
        if torch.is_grad_enabled() or (self.k is not None and self.k.shape[2] < self.max_len):
            self.k = k if self.k is None else torch.cat([self.k[:, :, :n], k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v[:, :, :n], v], dim=2)
        else:                           # speed-up: write in place into buffers of max_len positions
            if self.k is None:          # the buffers: max_len positions each
                shape = (*k.shape[:2], self.max_len, k.shape[3])
                self.k, self.v = k.new_empty(shape), v.new_empty(shape)
            self.k[:, :, n:n + T], self.v[:, :, n:n + T] = k, v
        self.length = n + T
        return self.k[:, :, :n + T], self.v[:, :, :n + T]


class InferenceCache:
    """What generation carries between calls: `layers`, one LayerCache per layer application (a
    core layer looped K times has K), in the order they run; `R`, T²MLR's state R_{t-1} (B, 1, C)
    or None."""

    def __init__(self, n_applications: int, max_len: int):
        self.layers, self.R = [LayerCache(max_len) for _ in range(n_applications)], None

    @property
    def length(self) -> int:
        """Positions already processed (the next token's position)."""
        return self.layers[-1].length


class Attention(nn.Module):
    """Causal self-attention: grouped-query heads (n_kv_head <= n_head), rotary, SDPA."""

    def __init__(self, cfg):
        super().__init__()
        C, self.n_head, self.n_kv_head = cfg.n_embd, cfg.n_head, cfg.n_kv_head
        self.head_dim = C // cfg.n_head
        self.qkv = nn.Linear(C, C + 2 * self.n_kv_head * self.head_dim, bias=cfg.bias)
        self.proj = nn.Linear(C, C, bias=cfg.bias)

    def forward(self, x, cos, sin, cache: Optional[LayerCache] = None):
        """x (B, T, C) at positions pos..pos+T-1, cos/sin (T, 1, rot_dim) for them -> (B, T, C)."""
        B, T, C = x.shape
        nh, nkv = self.n_head, self.n_kv_head
        qkv = self.qkv(x).view(B, T, nh + 2 * nkv, self.head_dim)
        qk, v = qkv[:, :, :nh + nkv], qkv[:, :, nh + nkv:].transpose(1, 2)   # v (B, nkv, T, hs)
        # rotary (RoPE, NeoX/LLaMA "rotate half") on the first rot_dim dims of q and k: with
        # [x1, x2] the halves, x -> [x1 cos - x2 sin, x2 cos + x1 sin]. Speed-up: roll() swaps the
        # halves and the sin table carries the minus sign ([-sin, sin]): one expression rotates all.
        if rot := cos.shape[-1]:                        # rot = 0 (rope_pct = 0) is NoPE
            r = qk[..., :rot]
            r = (r * cos + r.roll(rot // 2, dims=-1) * sin).to(qk.dtype)
            qk = r if rot == self.head_dim else torch.cat([r, qk[..., rot:]], dim=-1)   # NeoX: 25%
        q, k = qk.transpose(1, 2).split([nh, nkv], dim=1)                   # (B, nh | nkv, T, hs)
        past = 0 if cache is None else cache.length
        k, v = (k, v) if cache is None else cache.update(k, v)               # (B, nkv, past+T, hs)
        if past == 0 or T == 1:    # the plain causal mask, or one new token that sees all cached
            y = F.scaled_dot_product_attention(q, k, v, is_causal=past == 0, enable_gqa=True)
        else:                      # a chunk after a cached prefix: query i sees keys 0..past+i
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    """GELU (neox: down(gelu(up x))) or SwiGLU (llama: down(silu(gate x) * up x), gate and up in one
    Linear)."""

    def __init__(self, cfg):
        super().__init__()
        self.swiglu = cfg.flavour == "llama"
        self.up = nn.Linear(cfg.n_embd, (2 if self.swiglu else 1) * cfg.mlp_hidden, bias=cfg.bias)
        self.down = nn.Linear(cfg.mlp_hidden, cfg.n_embd, bias=cfg.bias)

    def forward(self, x):
        if self.swiglu:              # SwiGLU: silu(x W_g) * (x W_u), both halves of one matmul
            xg, xu = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(xg) * xu)
        return self.down(F.gelu(self.up(x)))


NORMS = {"neox": nn.LayerNorm, "llama": nn.RMSNorm}     # each flavour's norm


class Layer(nn.Module):
    """One transformer layer (B, T, C) -> (B, T, C), its residual included. neox (Pythia, the MeSH
    paper): parallel, x + attn(ln1 x) + mlp(ln2 x), LayerNorm. llama (SmolLM2, the T²MLR reference):
    sequential x += attn(ln1 x); x += mlp(ln2 x), RMSNorm."""

    def __init__(self, cfg):
        super().__init__()
        self.parallel = cfg.flavour == "neox"
        self.ln1, self.attn = NORMS[cfg.flavour](cfg.n_embd, eps=cfg.norm_eps), Attention(cfg)
        self.ln2, self.mlp = NORMS[cfg.flavour](cfg.n_embd, eps=cfg.norm_eps), MLP(cfg)

    def forward(self, x, cos, sin, cache=None):
        if self.parallel:
            return x + self.attn(self.ln1(x), cos, sin, cache) + self.mlp(self.ln2(x))
        x = x + self.attn(self.ln1(x), cos, sin, cache)
        return x + self.mlp(self.ln2(x))


# -----------------------------------------------------------------------------
# MeSH: the slot buffer between the loops of the core (MeSH paper §3.2, Eq. 3; README (M2))

class MeshMemory(nn.Module):
    """The slot buffer (n_slots, B, T, C) and its routers: one write and one read router per step
    (step 0 the transitional step, step t+1 the loop t: K + 1 steps), each Linear(C -> n_slots), a
    softmax over slots per token. n_slots = mesh_slots, by default K + 3 (MeSH §4.4, Table 3)."""

    def __init__(self, cfg):
        super().__init__()
        C, K = cfg.n_embd, cfg.n_loops
        self.n_slots = cfg.mesh_slots or K + 3
        self.write_routers = nn.ModuleList(nn.Linear(C, self.n_slots) for _ in range(K + 1))
        self.read_routers = nn.ModuleList(nn.Linear(C, self.n_slots) for _ in range(K + 1))

    def new_buffer(self, h_emb):
        """The buffer before step 0 (M2, "start"): h_emb in slot 0, zeros elsewhere. h_emb (B, T, C)
        -> (n_slots, B, T, C)."""
        buffer = h_emb.new_zeros(self.n_slots, *h_emb.shape)
        buffer[0] = h_emb
        return buffer

    def write_read(self, step: int, buffer, u, y):
        """One step k of Eq. 3 (M2, "step k"): write y_k softly into every slot, then read the
        next state from the UPDATED buffer, both routed by u_k. u, y (B, T, C); buffer
        (n_slots, B, T, C). Returns (new buffer, h_next (B, T, C))."""
        fp32 = torch.promote_types(u.dtype, torch.float32)  # the softmax in fp32 (autocast)
        w_write = F.softmax(self.write_routers[step](u), dim=-1, dtype=fp32)  # (B, T, n)
        w_read = F.softmax(self.read_routers[step](u), dim=-1, dtype=fp32)
        # the write, out of place (autograd), then the read
        buffer = buffer + w_write.permute(2, 0, 1).unsqueeze(-1) * y
        h_next = torch.einsum("btn,nbtc->btc", w_read, buffer)
        return buffer, h_next.to(y.dtype)


# -----------------------------------------------------------------------------
# T²MLR: the gate that mixes R_{t-1} into the input of l_start (README (T1))

class TemporalGate(nn.Module):
    """The reference's "gated" mixer, 5C² + 2C + 2 parameters: W_p (`proj`), A = [A_r; A_x] acting
    on g = [x; r~] with biases [b_r; b_x], and the global gates θ_r, θ_x (zero at init: an exact
    identity). A is held by the input it acts on: `A_on_x` its x columns with the biases, `A_on_r`
    its r~ columns. Speed-up, same values: a caller that runs the gate many times on the same x
    (every Jacobi sweep, every token) computes A_on_x(x) once."""

    def __init__(self, cfg):
        super().__init__()
        C = cfg.n_embd
        self.proj = nn.Linear(C, C, bias=False)                   # W_p
        self.A_on_x = nn.Linear(C, 2 * C)                         # A's x columns, and [b_r; b_x]
        self.A_on_r = nn.Linear(C, 2 * C, bias=False)             # A's r~ columns
        self.theta_r = nn.Parameter(torch.zeros(1))
        self.theta_x = nn.Parameter(torch.zeros(1))
        self.weight_gain, self.bias_prob = cfg.gate_weight_gain, cfg.gate_bias_prob

    @torch.no_grad()
    def reset_parameters(self):
        """The reference's initialisation: W_p the Linear default; A_r, A_x (C x 2C each)
        xavier-normal, std gain·sqrt(2/(3C)); b_r = b_x = logit(gate_bias_prob), p clamped to
        [1e-4, 1 - 1e-4], or if that is None a Linear(2C -> C)'s default U(±1/sqrt(2C)); θ = 0."""
        C = self.proj.in_features
        self.proj.reset_parameters()
        for linear in (self.A_on_x, self.A_on_r):
            nn.init.normal_(linear.weight, std=self.weight_gain * math.sqrt(2 / (3 * C)))
        if self.bias_prob is None:
            nn.init.uniform_(self.A_on_x.bias, -1 / math.sqrt(2 * C), 1 / math.sqrt(2 * C))
        else:
            p = min(max(self.bias_prob, 1e-4), 1 - 1e-4)
            nn.init.constant_(self.A_on_x.bias, math.log(p / (1 - p)))
        self.theta_r.zero_()
        self.theta_x.zero_()

    def forward(self, x, r, x_part=None):
        """x' from x (B, L, C), the input of l_start, and r = R_{t-1} (B, L or 1, C). x_part:
        A_on_x(x) if the caller computed it once (the speed-up), else None."""
        r_tilde = self.proj(r)                                                        # W_p R_{t-1}
        x_part = self.A_on_x(x) if x_part is None else x_part
        a_r, a_x = torch.sigmoid(x_part + self.A_on_r(r_tilde)).chunk(2, dim=-1)   # the local gates
        # θ are fp32 master weights; autocast leaves tanh in fp32 (as the reference)
        gamma_r = torch.tanh(self.theta_r).to(x.dtype)
        gamma_x = torch.tanh(self.theta_x).to(x.dtype)
        return x + gamma_r * a_r * r_tilde + gamma_x * a_x * x


# Control flow (the reference's c_t): per token 0 = padding, 1 = non-recurrent (e.g. a prompt),
# >= 2 = recurrent. Only recurrent tokens are mixed and merge the state; the others pass x through
# and write their raw l_end output. `recurrent_tokens` below is the mask (c > 1) (B, T, 1), or None
# when every token is recurrent.


# -----------------------------------------------------------------------------
# Configuration: the fields, their valid values, the layout

def require(valid: bool, message: str):
    """Refuse an invalid setting: ValueError(message), naming the value and what is valid."""
    if not valid:
        raise ValueError(message)


def parse_layout(layout: str):
    """'P+CRK+Q' (the MeSH paper's notation) -> (n_prelude, n_core, n_loops K, n_coda), e.g.
    '2+4R2+2' -> (2, 4, 2, 2). ValueError quoting the string if malformed, coreless or K < 1."""
    m = re.match(r"^(\d+)\+(\d+)R(\d+)\+(\d+)$", layout.replace(" ", ""))
    require(m is not None, f"layout {layout!r} is malformed; expected 'P+CRK+Q' with non-negative "
                           f"integers, e.g. '2+4R2+2'")
    n_prelude, n_core, K, n_coda = map(int, m.groups())
    require(n_core >= 1 and K >= 1, f"layout {layout!r} needs at least one core layer and K >= 1 "
                                    f"loops (the 'CRK' part), e.g. '2+4R2+2'")
    return n_prelude, n_core, K, n_coda


CHOICES = {"flavour": ("neox", "llama"), "jacobi_init": ("zero", "plain"),
           "state_passing": ("base", "residual", "anchor", "anchor_star", "mesh"),
           "mesh_trans_router_in": ("pre", "emb"), "weight_init": ("mesh", "reference")}
# The numeric fields by valid range: the range as the messages write it, its test, the fields. None
# passes (an Optional field left to its default); nan and ±inf never do. l_start and l_end take any
# int (negative counts from the end).
RANGES = {
    ">= 1": (lambda v: v >= 1, "vocab_size block_size n_layer n_head n_embd jacobi_sweeps"),
    ">= 1 or None": (lambda v: v >= 1, "n_kv_head mlp_hidden"),
    ">= 2 or None": (lambda v: v >= 2, "mesh_slots"),
    ">= 0": (lambda v: v >= 0, "jacobi_grad_sweeps"),
    "> 0": (lambda v: v > 0, "rope_theta norm_eps gate_weight_gain"),
    "in [0, 1] or None": (lambda v: 0 <= v <= 1, "rope_pct"),
    "in (0, 1) or None": (lambda v: 0 < v < 1, "gate_bias_prob"),
    "in [0, 1)": (lambda v: 0 <= v < 1, "jacobi_tol")}


@dataclass
class GPTConfig:
    """Every variant is a setting of these fields. __post_init__ fills the flavour's defaults,
    raises ValueError naming the bad value and what is valid, and derives the layer counts."""
    flavour: str = "neox"            # "neox" (Pythia, MeSH's base) or "llama" (SmolLM2, T²MLR's)
    vocab_size: int = 50304          # GPT-2's 50257 padded to a multiple of 64
    block_size: int = 1024           # maximum sequence length T
    n_layer: int = 12                # depth of a vanilla model (used when layout is "")
    layout: str = ""                 # recursive "P+CRK+Q": prelude, core, K loops, coda (MeSH)
    n_head: int = 12
    n_kv_head: Optional[int] = None  # grouped-query attention; None = n_head
    n_embd: int = 768                # C (the papers' d)
    mlp_hidden: Optional[int] = None  # MLP width; None = 4*n_embd (neox); required for llama
    rope_theta: float = 10000.0      # rotary base θ
    rope_pct: Optional[float] = None  # head dims rotated; None = 0.25 (neox) / 1.0 (llama)
    bias: Optional[bool] = None      # biases on linears; None = True (neox) / False (llama)
    tie_embeddings: Optional[bool] = None  # None = False (neox, Pythia) / True (llama, SmolLM2)
    norm_eps: float = 1e-5
    embed_scale: bool = True         # embeddings times sqrt(C) (MeSH §4.1); False: Pythia, SmolLM2
    weight_init: str = "mesh"        # "mesh" (GPT.init_weights) or "reference" (T²MLR's, HF Llama)
    # MeSH and the heuristic state passings (MeSH paper §3.1-3.2); state_passing "mesh" is MeSH
    state_passing: str = "base"      # h_sup: base 0, residual h(t), anchor h(0), anchor_star h_emb
    mesh_slots: Optional[int] = None  # n_slots (the paper's B); None = K + 3 (MeSH §4.4, Table 3)
    # the MeSH paper does not say which state feeds the transitional routers: "pre" is our reading
    mesh_trans_router_in: str = "pre"  # transitional routers' input: "pre" (h_pre) or "emb" (h_emb)
    # T²MLR (gate, state update and Jacobi training as the reference has them)
    t2mlr: bool = False              # temporal middle-layer recurrence on layers l_start..l_end
    l_start: int = 0                 # first recurrent layer (the gate at its input); < 0: from end
    l_end: int = -1                  # last recurrent layer (the state from its output); inclusive
    jacobi_sweeps: int = 16          # D: sweeps a step, the final one included (D exact positions)
    jacobi_grad_sweeps: int = 4      # b: sweeps before the final one that keep gradient (b <= D)
    jacobi_tol: float = 0.0          # > 0: stop no-grad sweeps once the state moves less (relative)
    jacobi_checkpoint: bool = False  # recompute the b gradient sweeps in backward (less memory)
    jacobi_init: str = "zero"        # R^(0): "zero" (ours) or "plain" (reference's, +1 middle pass)
    recurrent_residual: bool = True  # R_t = s·(h_t + R_{t-1}), not h_t (the reference's FineWeb)
    recurrent_detach: bool = False   # no gradient along the R chain (reference: FineWeb off, S5 on)
    gate_bias_prob: Optional[float] = None  # b_r = b_x = logit(p) (S5: 0.5); None = Linear default
    gate_weight_gain: float = 1.0    # xavier-normal gain of A_r, A_x (FineWeb, S5: 1.0; SFT: 1e-2)

    def __post_init__(self):
        llama = self.flavour == "llama"
        self.n_kv_head = self.n_head if self.n_kv_head is None else self.n_kv_head
        self.rope_pct = (1.0 if llama else 0.25) if self.rope_pct is None else self.rope_pct
        self.bias = (not llama) if self.bias is None else self.bias
        self.tie_embeddings = llama if self.tie_embeddings is None else self.tie_embeddings
        for name, valid in CHOICES.items():
            value = getattr(self, name)
            require(value in valid, f"{name} {value!r} is not one of {', '.join(map(repr, valid))}")
        require(self.mlp_hidden is not None or not llama, "flavour 'llama' needs mlp_hidden (the "
                "SwiGLU width, e.g. 1536 for SmolLM2-135M)")
        for valid, (test, names) in RANGES.items():
            for name in names.split():
                value = getattr(self, name)
                finite = not isinstance(value, float) or math.isfinite(value)
                require(value is None or finite and test(value), f"{name} = {value!r} must be "
                        f"{'' if finite else 'finite and '}{valid}")
        require(not (self.n_embd % self.n_head or self.n_head % self.n_kv_head), f"n_embd "
                f"({self.n_embd}) must divide by n_head ({self.n_head}), and n_head by n_kv_head "
                f"({self.n_kv_head})")
        self.mlp_hidden = self.mlp_hidden or 4 * self.n_embd
        # derived: the layout's (n_prelude, n_core, K loops, n_coda), (n_layer, 0, 0, 0) if flat;
        # T²MLR's (l_start, l_end) as layer indices, negative ones counted from the end as Python
        # indexes a list, never wrapped around (an index out of range stays out of range: refused)
        self.depth = parse_layout(self.layout) if self.layout else (self.n_layer, 0, 0, 0)
        P, n_core, K, Q = self.depth
        # K loops; the distinct (parameter) layers; the layer applications per token (compute depth)
        self.n_loops, self.n_unique, self.n_unrolled = K, P + n_core + Q, P + n_core * K + Q
        start, end = (i + self.n_layer if i < 0 else i for i in (self.l_start, self.l_end))
        self.recurrent_layers = start, end
        if self.t2mlr:
            require(not self.layout, f"t2mlr needs a flat stack (n_layer), not the recursive "
                    f"layout {self.layout!r}")
            require(0 <= start <= end < self.n_layer, f"l_start = {self.l_start}, l_end = "
                    f"{self.l_end} must give 0 <= l_start <= l_end < n_layer = {self.n_layer} "
                    f"(negative values count from the end: -1 .. -{self.n_layer})")
            require(self.jacobi_grad_sweeps <= self.jacobi_sweeps, f"jacobi_grad_sweeps = "
                    f"{self.jacobi_grad_sweeps} must be <= jacobi_sweeps = {self.jacobi_sweeps} "
                    f"(b sweeps before the final one keep gradient; b = D keeps the plain start's "
                    f"too)")


# -----------------------------------------------------------------------------
# The model

class GPT(nn.Module):
    """A decoder-only language model. Vanilla: every layer once. Recursive (layout "P+CRK+Q"): the
    prelude, the core K times with a state passing between loops, the coda. T²MLR: a stack whose
    layers l_start..l_end are recurrent in time."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_unique))   # each once, in order
        layers, self.mesh, self.gate = list(self.layers), None, None
        if cfg.layout:      # the layout's groups (MeSH §3.1), plain lists of the registered layers
            P, n_core = cfg.depth[:2]
            self.prelude, self.core, self.coda = layers[:P], layers[P:P+n_core], layers[P+n_core:]
            self.mesh = MeshMemory(cfg) if cfg.state_passing == "mesh" else None
        if cfg.t2mlr:       # below l_start, the recurrent l_start..l_end, above l_end
            start, end = cfg.recurrent_layers
            self.lower, self.middle = layers[:start], layers[start:end + 1]
            self.upper, self.gate = layers[end + 1:], TemporalGate(cfg)
        self.ln_f = NORMS[cfg.flavour](cfg.n_embd, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.rotary_cache = {}         # (dtype, device) -> (cos, sin) of block_size positions
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """One initialisation for every variant (the MeSH paper's recipe, with Huginn's base std,
        Geiping et al. 2025, where the paper states none): Linear/Embedding weights N(0, 2/(5C)),
        biases 0, norms 1; attention-out and MLP-down std / sqrt(2 · unrolled depth) (MeSH §4.1);
        the MeSH routers the same small normal, never zero (zero weights would keep the empty slots
        identical forever: our choice); the T²MLR gate its own (TemporalGate.reset_parameters). The
        embeddings are scaled in forward. weight_init "reference" is the T²MLR reference's instead
        (its models are Hugging Face Llama models): every weight N(0, 0.02²), no depth scaling; with
        embed_scale=False, as its embeddings are unscaled."""
        std = 0.02 if self.cfg.weight_init == "reference" else math.sqrt(2 / (5 * self.cfg.n_embd))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                nn.init.ones_(module.weight)
            if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if self.cfg.weight_init != "reference":      # depth-aware output projections (MeSH §4.1)
            for layer in self.layers:
                for proj in (layer.attn.proj, layer.mlp.down):
                    nn.init.normal_(proj.weight, std=std / math.sqrt(2 * self.cfg.n_unrolled))
        if self.gate is not None:
            self.gate.reset_parameters()

    # ---- forward: idx -> logits, one branch per variant ------------------------------------------

    def forward(self, idx, targets=None, mode=None, cache=None, control=None, tol: float = 0.0):
        """idx (B, T) token ids; targets (B, T), -1 ignored. With `cache` (an InferenceCache), idx
        continues the sequence it holds (positions cache.length..), and it is updated in place.
        mode (T²MLR only; the other models ignore it and control): "jacobi" (D parallel sweeps, how
        it trains), "exact" (token by token, the true model), "converged" (sweeps until the state
        moves less than `tol`, a prefill); None = "jacobi" in train() without a cache, else "exact".
        control (T²MLR only): (B, T) ints, the control flow (the note after TemporalGate); None =
        every token recurrent. Returns (logits (B, T, V), loss or None). Raises ValueError when the
        sequence exceeds block_size, the mode is unknown, "jacobi" is given a cache, "converged" a
        non-empty one, or control's shape is not idx's."""
        cfg, pos = self.cfg, cache.length if cache is not None else 0      # position of idx[:, 0]
        if pos + idx.shape[1] > cfg.block_size:
            raise ValueError(f"sequence of {pos + idx.shape[1]} tokens exceeds block_size = "
                             f"{cfg.block_size}")
        if control is not None and control.shape != idx.shape:
            raise ValueError(f"control has shape {tuple(control.shape)}; it must match idx, "
                             f"{tuple(idx.shape)}")
        # h_emb (B, T, C), scaled by sqrt(d) (MeSH paper §4.1) unless embed_scale=False
        h = self.wte(idx) * math.sqrt(cfg.n_embd) if cfg.embed_scale else self.wte(idx)
        if self.gate is not None:                                     # T²MLR: recurrence in time
            mode = mode or ("jacobi" if self.training and cache is None else "exact")
            h = (self.exact_forward(h, control, cache) if mode == "exact"      # token by token
                 else self.jacobi_forward(h, control, mode, tol, cache))      # parallel sweeps
        elif cfg.layout:                                            # recursive: looped depth (MeSH)
            h = self.recursive_forward(h, pos, cache)
        else:                                                         # vanilla: every layer once
            h = self.run_layers(h, self.layers, pos, cache.layers if cache is not None else None)
        logits = self.lm_head(self.ln_f(h))                           # (B, T, V)
        if targets is None:
            return logits, None
        # the loss in float32 at least (bf16 logits under autocast), float64 for a float64 model
        flat = logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, 1)
        return logits, F.cross_entropy(flat, targets.reshape(-1), ignore_index=-1)   # any strides

    def rotary(self, dtype, device, pos: int, T: int):
        """The rotary tables (cos, sin), each (T, 1, rot_dim), of positions pos..pos+T-1 for a
        residual stream of `dtype` on `device` (a torch.device, as a tensor reports it); rot_dim =
        head_dim·rope_pct rounded down to even, the sin table carrying the rotation's sign ([-sin,
        sin]: see Attention). Computed once per (dtype, device) over block_size positions, in
        float64 for a float64 stream and float32 otherwise, and kept off the buffers, so
        `model.to(dtype)` never casts them (float32 tables cast up are exact to ~1e-7)."""
        key = (torch.promote_types(dtype, torch.float32), device)
        if key not in self.rotary_cache:
            cfg, dtype = self.cfg, key[0]
            rot = int(cfg.n_embd // cfg.n_head * cfg.rope_pct) // 2 * 2
            inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rot, 2, dtype=dtype) / rot))
            angles = torch.outer(torch.arange(cfg.block_size, dtype=dtype), inv_freq)  # (T, rot/2)
            cos = torch.cat([angles.cos(), angles.cos()], dim=-1).unsqueeze(1)
            sin = torch.cat([-angles.sin(), angles.sin()], dim=-1).unsqueeze(1)
            self.rotary_cache[key] = (cos.to(device), sin.to(device))
        return tuple(table[pos:pos + T] for table in self.rotary_cache[key])

    def run_layers(self, h, layers, pos: int, caches=None):
        """Apply `layers` in order to h (B, T, C) at positions pos..pos+T-1 -> (B, T, C), with the
        rotary tables of those positions. caches: a list of one LayerCache (or None) per layer, or
        None for no caches; ValueError when its length is not len(layers)."""
        cos, sin = self.rotary(h.dtype, h.device, pos, h.shape[1])
        caches = [None] * len(layers) if caches is None else caches
        for layer, cache in zip(layers, caches, strict=True):
            h = layer(h, cos, sin, cache)
        return h

    # ---- depth: recursive transformers (MeSH paper §3; README (M1), (M2)) ------------------------

    def recursive_forward(self, h_emb, pos: int, cache=None):
        """h_emb (B, T, C) -> the coda's output (B, T, C): the prelude, the core K times with the
        state passing `state_passing` between loops (§3.1) or MeSH's buffer (§3.2), the coda."""
        cfg = self.cfg
        P, n_core, K, n_coda = cfg.depth                      # layers per group, loops of the core
        # one cache per layer application, in the order they run
        caches = cache.layers if cache is not None else [None] * (P + n_core * K + n_coda)
        h = self.run_layers(h_emb, self.prelude, pos, caches[:P])                  # h_pre
        if cfg.state_passing == "mesh":    # the transitional step: write y_0 = h_pre, read h(0)
            buffer = self.mesh.new_buffer(h_emb)
            u = h if cfg.mesh_trans_router_in == "pre" else h_emb
            buffer, h = self.mesh.write_read(0, buffer, u=u, y=h)
        h0 = h
        for t in range(K):                # K loops of the same weights, each with its own KV caches
            loop_caches = caches[P + t * n_core:P + (t + 1) * n_core]
            y = self.run_layers(h, self.core, pos, loop_caches)             # y = f_core(h(t))
            if cfg.state_passing == "mesh":    # write y_{t+1} = y, read h(t+1), routed by u = h(t)
                buffer, h = self.mesh.write_read(t + 1, buffer, u=h, y=y)
            elif cfg.state_passing == "base":        # h_sup = 0
                h = y
            elif cfg.state_passing == "residual":    # h_sup = h(t)
                h = y + h
            elif cfg.state_passing == "anchor":      # h_sup = h(0)
                h = y + h0
            else:                                    # anchor_star: h_sup = h_emb
                h = y + h_emb
        return self.run_layers(h, self.coda, pos, caches[P + K * n_core:])

    # ---- time: T²MLR (arXiv 2607.15178; README (T1)-(T3)) ----------------------------------------

    def middle_step(self, x, R_prev, pos: int = 0, caches=None, recurrent_tokens=None, x_part=None):
        """The recurrent middle at the positions of x: mix R_{t-1} into the input of l_start (the
        gate), run the middle layers l_start..l_end, write R_t from their output h_t. All T
        positions at once in a Jacobi sweep, one token at a time in the exact loop.
        x (B, L, C) the input of l_start; R_prev (B, L or 1, C) the state each position reads; pos:
        the position of x[:, 0]; caches: the middle layers' LayerCaches or None; recurrent_tokens
        (B, L, 1) bool or None (all); x_part: gate.A_on_x(x) if the caller computed it once.
        Returns (h (B, L, C), R (B, L, C) the state written at each position)."""
        cfg = self.cfg
        x_mixed = self.gate(x, R_prev, x_part)
        if recurrent_tokens is not None:                       # non-recurrent tokens pass x through
            x_mixed = torch.where(recurrent_tokens, x_mixed, x)
        h = self.run_layers(x_mixed, self.middle, pos, caches)
        # the state update (README (T2), as the reference writes it; 1e-6 inside the rms): s is a
        # stop-gradient constant, NOT an nn.RMSNorm (no weight, and the clamp bites at RMS(u) > 5)
        if not cfg.recurrent_residual:
            return h, h
        u = h + (R_prev.detach() if cfg.recurrent_detach else R_prev)
        s = u.detach().pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt().clamp(0.2, 5.0)
        if recurrent_tokens is None:
            return h, u * s
        return h, torch.where(recurrent_tokens, u * s, h)         # non-recurrent tokens: the raw h

    def jacobi_forward(self, h_emb, control=None, mode="jacobi", tol: float = 0.0, cache=None):
        """Parallel T²MLR by Jacobi sweeps, h_emb (B, T, C) -> the top output (B, T, C). A sweep
        runs middle_step over all positions at once, each reading the state the previous sweep wrote
        for the position before it; from R^(0) = 0 every sweep makes one more position exact (README
        (T3), the exactness front). The last sweep's output goes on, so positions < D are exact (all
        when D >= T); gradient flows through it and the b sweeps before it.
        mode "jacobi" runs the config's D, b and jacobi_tol (the early stop: a sweep without
        gradient that moved the state by at most tol relative to its RMS ends them); "converged" (a
        prefill) runs D = T, b = 0 and its own `tol`, and fills an empty `cache` with every layer's
        keys and values and R_{T-1}. Departure from the reference (same values and gradients): the
        lower layers run once and every sweep reuses their output x; the reference reruns the whole
        model in its final pass."""
        cfg = self.cfg
        if mode not in ("jacobi", "converged"):              # "exact" is exact_forward
            raise ValueError(f"mode {mode!r} is not one of 'jacobi', 'exact', 'converged'")
        if mode == "jacobi" and cache is not None:
            raise ValueError("mode 'jacobi' cannot continue a KV cache (its sweeps see the whole "
                             "sequence at once): use mode 'exact' (the default with a cache) or "
                             "'converged' for a prompt")
        if mode == "converged" and cache is not None and cache.length:
            raise ValueError(f"mode 'converged' fills an empty cache (a prompt); this one holds "
                             f"{cache.length} positions: continue it with mode 'exact'")
        if mode == "jacobi":
            D, b, tol = cfg.jacobi_sweeps, cfg.jacobi_grad_sweeps, cfg.jacobi_tol
        else:                                # converged: T sweeps make every position exact
            D, b = h_emb.shape[1], 0
        l_start, l_end = cfg.recurrent_layers
        caches = cache.layers if cache is not None else [None] * cfg.n_layer      # one per layer
        x = self.run_layers(h_emb, self.lower, 0, caches[:l_start])  # the same in every sweep
        x_part = self.gate.A_on_x(x)                                 # speed-up: A on x, once
        recurrent_tokens = None if control is None else (control > 1).unsqueeze(-1)

        def shift(R):     # R_t written at position t is read by token t + 1; token 0 reads R_{-1}=0
            return F.pad(R[:, :-1], (0, 0, 1, 0))

        def sweep(R_prev):  # R^(j) from R^(j-1), all positions in parallel
            _, R = self.middle_step(x, R_prev, recurrent_tokens=recurrent_tokens, x_part=x_part)
            return shift(R)

        grad = torch.is_grad_enabled()
        # R_prev = R^(j): the states every position reads, R^(0) = 0 or the reference's warm start
        # (jacobi_init "plain": the unmixed middle output, shifted; its gradient kept if b >= D)
        if cfg.jacobi_init == "plain":
            with torch.set_grad_enabled(grad and b >= D):
                R_prev = shift(self.run_layers(x, self.middle, 0))
        else:
            R_prev = torch.zeros_like(x)
        with torch.no_grad():            # sweeps 1..D-1-b refine the state without gradient
            for _ in range(D - 1 - min(b, D - 1)):
                new = sweep(R_prev)
                converged = tol > 0 and (new - R_prev).abs().max() <= tol * new.pow(2).mean().sqrt()
                R_prev = new
                if converged:
                    break
        for _ in range(min(b, D - 1)):   # the b sweeps before the final one keep their gradient
            if grad and cfg.jacobi_checkpoint:      # recomputed in backward: less memory, more time
                R_prev = checkpoint(sweep, R_prev, use_reentrant=False)
            else:
                R_prev = sweep(R_prev)
        # the final sweep: its middle output goes on (and fills the middle layers' caches)
        h, R = self.middle_step(x, R_prev, caches=caches[l_start:l_end + 1],
                                recurrent_tokens=recurrent_tokens, x_part=x_part)
        if cache is not None:
            cache.R = R[:, -1:]                                # R_{T-1}: decoding continues from it
        return self.run_layers(h, self.upper, 0, caches[l_end + 1:])

    def exact_forward(self, h_emb, control=None, cache=None):
        """The exact recurrence (the paper's definition; the reference evaluates so), h_emb (B, T,
        C) -> the top output (B, T, C): lower layers in parallel, the middle layers token by token
        (each token reads the R_{t-1} the token before it wrote, R_{-1} = 0, and attends to the
        cached keys of the earlier tokens), upper layers in parallel. With `cache` (generation)
        every layer keeps its keys and the state continues from cache.R; without one, the middle
        layers get caches for this call only. A span where no row is recurrent (control) needs no
        state: it goes through the middle layers in one chunk (a prompt)."""
        B, T, C = h_emb.shape
        pos = cache.length if cache is not None else 0
        l_start, l_end = self.cfg.recurrent_layers
        caches = cache.layers if cache is not None else [None] * self.cfg.n_layer   # one per layer
        x = self.run_layers(h_emb, self.lower, pos, caches[:l_start])
        # the middle layers' caches: a token attends to the keys of the tokens before it (for this
        # call only without a cache)
        middle_caches = caches[l_start:l_end + 1] if cache is not None else \
            [LayerCache(T) for _ in self.middle]
        x_part = self.gate.A_on_x(x)                                 # speed-up: A on x, once
        recurrent_tokens = None if control is None else (control > 1).unsqueeze(-1)
        R = cache.R if cache is not None and cache.R is not None else x.new_zeros(B, 1, C)
        # the chunks: one token each, except that a span where no row is recurrent is one chunk
        reads = [True] * T if recurrent_tokens is None else \
            recurrent_tokens.any(dim=0).view(-1).tolist()
        chunk_starts = [t for t in range(T) if t == 0 or reads[t] or reads[t - 1]]
        outputs = []
        for t, stop in zip(chunk_starts, chunk_starts[1:] + [T]):
            chunk = None if recurrent_tokens is None else recurrent_tokens[:, t:stop]
            h_t, R_t = self.middle_step(x[:, t:stop], R, pos=pos + t, caches=middle_caches,
                                        recurrent_tokens=chunk, x_part=x_part[:, t:stop])
            R = R_t[:, -1:]
            outputs.append(h_t)
        if cache is not None:
            cache.R = R
        return self.run_layers(torch.cat(outputs, dim=1), self.upper, pos, caches[l_end + 1:])

    # ---- generation -------------------------------------------------------------

    def new_cache(self, max_len: Optional[int] = None) -> InferenceCache:
        """An empty InferenceCache: a LayerCache of max_len (block_size) per layer application."""
        return InferenceCache(self.cfg.n_unrolled, max_len or self.cfg.block_size)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0,
                 top_k: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 recurrent_prompt: bool = False, prefill: str = "exact", prefill_tol: float = 0.0):
        """Continue idx (B, T) by max_new_tokens sampled tokens -> (B, T + max_new_tokens).

        Each token comes from the last logits of the model on the last block_size tokens, exactly
        what a full recompute gives (T²MLR: the exact recurrence from the window's first token).
        While the sequence fits in block_size a KV cache makes each step one token of work; beyond
        it every token of the slid window moves, so each step recomputes the window (nanoGPT's).
        temperature 0 = greedy; top_k None = all tokens, k keeps the k most likely. T²MLR: the
        prompt is non-recurrent (c = 1) as the reference generates, unless recurrent_prompt (c = 2,
        as train.py trains); generated tokens are recurrent; prefill "exact" (token by token) or
        "converged" (Jacobi sweeps until the state moves less than prefill_tol); decoding is exact.
        Raises ValueError for an unknown prefill, prefill_tol outside [0, 1), a negative or NaN
        temperature, top_k < 1."""
        require(prefill in ("exact", "converged"),
                f"prefill {prefill!r} is not one of 'exact', 'converged'")
        require(0 <= prefill_tol < 1,         # NaN is refused too, here and for temperature
                f"prefill_tol = {prefill_tol} must be in [0, 1) (0 = sweep until exact)")
        require(temperature >= 0, f"temperature = {temperature} must be >= 0 (0 = greedy)")
        require(top_k is None or top_k >= 1, f"top_k = {top_k} must be >= 1 (the number of most "
                f"likely tokens to sample from), or None for all tokens")
        window, cache = self.cfg.block_size, self.new_cache()   # every layer's keys, values; R
        control = torch.full_like(idx, 2 if recurrent_prompt else 1)   # (B, T), grows with idx
        for step in range(max_new_tokens):
            if step == 0:                 # the prompt, its last block_size tokens, fills the cache
                logits, _ = self(idx[:, -window:], mode=prefill, cache=cache,
                                 control=control[:, -window:], tol=prefill_tol)
            elif idx.shape[1] <= window:  # the cache holds all of idx: feed the new token only
                logits, _ = self(idx[:, -1:], mode="exact", cache=cache, control=control[:, -1:])
            else:                         # the window slid: recompute it, exactly, without a cache
                logits, _ = self(idx[:, -window:], mode="exact", control=control[:, -window:])
            # the next token (B, 1): greedy at temperature 0 (the first of exact ties), else a draw
            # from softmax((logits - max) / temperature) over the top_k, in float32 at least. With
            # the max at exactly 0 no temperature overflows: one so small that the division
            # underflows gives the greedy token, inf is uniform; -inf stays -inf (-inf / inf is NaN)
            last = logits[:, -1, :].to(torch.promote_types(logits.dtype, torch.float32))
            if temperature == 0:
                idx_next = last.argmax(dim=-1, keepdim=True)
            else:
                diff = last - last.amax(dim=-1, keepdim=True)
                scaled = torch.where((diff == 0) | (diff == -math.inf), diff, diff / temperature)
                if top_k is not None and top_k < last.size(-1):   # keep the k largest (and ties)
                    scaled = scaled.masked_fill(last < last.topk(top_k).values[:, -1:], -math.inf)
                idx_next = torch.multinomial(scaled.softmax(-1), 1, generator=generator)
            idx = torch.cat([idx, idx_next], dim=1)
            control = torch.cat([control, torch.full_like(idx_next, 2)], dim=1)   # generated: c = 2
        return idx

    # ---- released checkpoints --------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, name_or_path: str, **overrides) -> "GPT":
        """A released Pythia or SmolLM2 (a Hugging Face folder or hub id) as a GPT, its config plus
        `overrides`; e.g. the T²MLR paper's §3.4 retrofit, GPT.from_pretrained(
        "HuggingFaceTB/SmolLM2-135M", t2mlr=True, l_start=12, l_end=17). Loading lives in
        support/pretrained.py (imported here: model.py needs only torch). Raises ValueError."""
        from support.pretrained import from_pretrained
        return from_pretrained(name_or_path, **overrides)


if __name__ == "__main__":      # python model.py config/<name>.py: a summary of the architecture
    from configurator import load_config
    from support.accounting import main
    main(load_config)
