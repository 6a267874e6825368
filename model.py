"""
One file, every variant: a vanilla GPT, recursive transformers with MeSH, and T²MLR.

MeSH (Yu et al., arXiv 2510.07739): a prelude, ONE weight-shared core looped K times, a coda; between the loops
a buffer of n_slots slots with a write and a read router per step carries the state.
T²MLR (arXiv 2607.15178): the output of layer l_end at token t-1, merged into the recurrent state R_{t-1}, is
gated into the input of layer l_start at token t; trained by parallel Jacobi sweeps, run exactly token by token.

The README holds the equations (each once), the reading map and the glossary; the comments here cite the
papers' sections ("MeSH §3.2") and give shapes: B batch, T positions of this call, C = n_embd, V vocabulary.
"The reference" is the public T²MLR code (github.com/princeton-pli/T2MLR); "our reading" marks a choice the
papers leave open; "speed-up" marks an optimisation written after the direct form it computes.
test_equivalence.py checks every variant against slow, obvious definitions in float64.
"""

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from support.checks import LAYOUT_RE, check_config, check_forward, check_generate


# -----------------------------------------------------------------------------
# The transformer layer: attention with rotary and an optional KV cache, MLP

class LayerCache:
    """Keys and values of one layer application, at most `max_len` positions. update(k, v) appends
    (B, n_kv_head, T, hs) tensors and returns all cached ones; RuntimeError when it would overflow."""

    def __init__(self, max_len: int):
        self.max_len, self.k, self.v, self.length = max_len, None, None, 0

    def update(self, k, v):
        T = k.shape[2]
        if self.length + T > self.max_len:
            raise RuntimeError(f"KV cache full: {self.length} + {T} > {self.max_len} positions")
        if torch.is_grad_enabled():     # the direct form, autograd-safe (training through the exact loop)
            self.k = k if self.k is None else torch.cat([self.k[:, :, :self.length], k], dim=2)
            self.v = v if self.v is None else torch.cat([self.v[:, :, :self.length], v], dim=2)
        else:                           # speed-up: write in place into a buffer of max_len positions
            if self.k is None or self.k.shape[2] < self.max_len:
                self.k, self.v = (self._grow(new, old) for new, old in ((k, self.k), (v, self.v)))
            self.k[:, :, self.length:self.length + T] = k
            self.v[:, :, self.length:self.length + T] = v
        self.length += T
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def _grow(self, new, old):
        buffer = new.new_empty(*new.shape[:2], self.max_len, new.shape[3])
        if old is not None:
            buffer[:, :, :self.length] = old[:, :, :self.length]
        return buffer


class InferenceCache:
    """What generation carries between calls: `layers`, one LayerCache per layer application (a core layer
    looped K times has K), in the order they run; `R`, T²MLR's recurrent state R_{t-1} (B, 1, C) or None."""

    def __init__(self, n_applications: int, max_len: int):
        self.layers = [LayerCache(max_len) for _ in range(n_applications)]
        self.R = None

    @property
    def length(self) -> int:
        """Positions already processed (the next token's position)."""
        return self.layers[-1].length


class Attention(nn.Module):
    """Causal self-attention: grouped-query heads (n_kv_head <= n_head), rotary, SDPA."""

    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.n_embd // cfg.n_head
        self.qkv = nn.Linear(cfg.n_embd, cfg.n_embd + 2 * self.n_kv_head * self.head_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)

    def forward(self, x, cos, sin, cache: Optional[LayerCache] = None):
        """x (B, T, C) at positions pos..pos+T-1, cos/sin (T, 1, rot_dim) for them -> (B, T, C)."""
        B, T, C = x.shape
        nh, nkv = self.n_head, self.n_kv_head
        qkv = self.qkv(x).view(B, T, nh + 2 * nkv, self.head_dim)
        qk, v = qkv[:, :, :nh + nkv], qkv[:, :, nh + nkv:].transpose(1, 2)   # v (B, nkv, T, hs)
        # rotary (RoPE, NeoX/LLaMA "rotate half") on the first rot_dim dims of queries and keys: with
        # [x1, x2] the halves, x -> [x1 cos - x2 sin, x2 cos + x1 sin]. Speed-up: roll() swaps the halves and
        # the sin table carries the minus sign ([-sin, sin]), so one expression rotates all pairs.
        rot = cos.shape[-1]
        if rot:                                         # rope_pct = 0 is NoPE
            r = qk[..., :rot]
            r = (r * cos + r.roll(rot // 2, dims=-1) * sin).to(qk.dtype)
            qk = r if rot == self.head_dim else torch.cat([r, qk[..., rot:]], dim=-1)   # NeoX: 25% rotated
        q, k = qk.transpose(1, 2).split([nh, nkv], dim=1)                   # (B, nh | nkv, T, hs)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(k, v)                                        # (B, nkv, past+T, hs)
        if past == 0:      # the plain causal mask
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        elif T == 1:       # one new token sees everything cached
            y = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        else:              # a chunk after a cached prefix: query i sees keys 0..past+i
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    """GELU (neox: down(gelu(up x))) or SwiGLU (llama: down(silu(gate x) * up x), gate and up in one Linear)."""

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


class Layer(nn.Module):
    """One transformer layer (B, T, C) -> (B, T, C), its residual included. neox (Pythia, the MeSH paper):
    parallel, x + attn(ln1 x) + mlp(ln2 x), LayerNorm. llama (SmolLM2, the T²MLR reference): sequential
    x += attn(ln1 x); x += mlp(ln2 x), RMSNorm."""

    def __init__(self, cfg):
        super().__init__()
        self.parallel = cfg.flavour == "neox"
        self.ln1, self.attn = cfg.norm_class(cfg.n_embd, eps=cfg.norm_eps), Attention(cfg)
        self.ln2, self.mlp = cfg.norm_class(cfg.n_embd, eps=cfg.norm_eps), MLP(cfg)

    def forward(self, x, cos, sin, cache=None):
        if self.parallel:
            return x + self.attn(self.ln1(x), cos, sin, cache) + self.mlp(self.ln2(x))
        x = x + self.attn(self.ln1(x), cos, sin, cache)
        return x + self.mlp(self.ln2(x))


# -----------------------------------------------------------------------------
# MeSH: the slot buffer between the loops of the core (MeSH paper §3.2, Eq. 3; README (M2))

class MeshMemory(nn.Module):
    """The slot buffer (n_slots, B, T, C) and its routers: one write and one read router per step (step 0
    the transitional step, step t+1 the loop t: K + 1 steps), each Linear(C -> n_slots), a softmax over
    slots per token. n_slots = mesh_slots, by default K + 3 (MeSH paper §4.4, Table 3)."""

    def __init__(self, cfg):
        super().__init__()
        K = cfg.n_loops
        self.n_slots = cfg.mesh_slots or K + 3
        self.write_routers = nn.ModuleList(nn.Linear(cfg.n_embd, self.n_slots) for _ in range(K + 1))
        self.read_routers = nn.ModuleList(nn.Linear(cfg.n_embd, self.n_slots) for _ in range(K + 1))

    def new_buffer(self, h_emb):
        """The buffer before step 0 (M2, "start"). h_emb (B, T, C) -> (n_slots, B, T, C)."""
        buffer = h_emb.new_zeros(self.n_slots, *h_emb.shape)
        buffer[0] = h_emb
        return buffer

    def write_read(self, step: int, buffer, router_in, written):
        """One step of Eq. 3 (M2, "step k"): write `written` softly into every slot, then read the next state
        from the UPDATED buffer, both routed by router_in. router_in, written (B, T, C); buffer (n_slots, B, T,
        C). Returns (new buffer, h_next (B, T, C))."""
        fp32 = torch.promote_types(router_in.dtype, torch.float32)       # the softmax in fp32 under autocast
        w_write = F.softmax(self.write_routers[step](router_in), dim=-1, dtype=fp32)    # (B, T, n_slots)
        w_read = F.softmax(self.read_routers[step](router_in), dim=-1, dtype=fp32)
        buffer = buffer + w_write.permute(2, 0, 1).unsqueeze(-1) * written   # the write, out of place (autograd)
        h_next = torch.einsum("btn,nbtc->btc", w_read, buffer)               # the read
        return buffer, h_next.to(written.dtype)


# -----------------------------------------------------------------------------
# T²MLR: the gate that mixes R_{t-1} into the input of l_start (README (T1))

class TemporalGate(nn.Module):
    """The reference's "gated" mixer, 5C² + 2C + 2 parameters: W_p (`proj`), A = [A_r; A_x] acting on
    [x; r~] with biases [b_r; b_x], and the global gates θ_r, θ_x (zero at init: an exact identity).
    Speed-up, same values: A's x columns and the biases are `gates_x`, its r~ columns `gates_r`, so a caller
    that runs the gate many times on the same x (every Jacobi sweep, every token) computes gates_x(x) once."""

    def __init__(self, cfg):
        super().__init__()
        C = cfg.n_embd
        self.proj = nn.Linear(C, C, bias=False)                   # W_p
        self.gates_x = nn.Linear(C, 2 * C)                        # [A_r^x; A_x^x] x + [b_r; b_x]
        self.gates_r = nn.Linear(C, 2 * C, bias=False)            # [A_r^r; A_x^r] r~
        self.theta_r = nn.Parameter(torch.zeros(1))
        self.theta_x = nn.Parameter(torch.zeros(1))
        self.weight_gain, self.bias_prob = cfg.gate_weight_gain, cfg.gate_bias_prob

    @torch.no_grad()
    def reset_parameters(self):
        """The reference's initialisation: W_p the Linear default; A_r, A_x (C x 2C each) xavier-normal,
        std gain·sqrt(2/(3C)); b_r = b_x = logit(gate_bias_prob), p clamped to [1e-4, 1 - 1e-4], or when that
        is None a Linear(2C -> C)'s default U(±1/sqrt(2C)); θ_r = θ_x = 0."""
        C = self.proj.in_features
        self.proj.reset_parameters()
        for linear in (self.gates_x, self.gates_r):
            nn.init.normal_(linear.weight, std=self.weight_gain * math.sqrt(2 / (3 * C)))
        if self.bias_prob is None:
            nn.init.uniform_(self.gates_x.bias, -1 / math.sqrt(2 * C), 1 / math.sqrt(2 * C))
        else:
            p = min(max(self.bias_prob, 1e-4), 1 - 1e-4)
            nn.init.constant_(self.gates_x.bias, math.log(p / (1 - p)))
        self.theta_r.zero_()
        self.theta_x.zero_()

    def forward(self, x, r, x_part=None):
        """x' from x (B, L, C), the input of l_start, and r = R_{t-1} (B, L or 1, C). x_part: gates_x(x) if the
        caller computed it once (the speed-up), else None."""
        r_tilde = self.proj(r)                                                        # W_p R_{t-1}
        x_part = self.gates_x(x) if x_part is None else x_part
        a_r, a_x = torch.sigmoid(x_part + self.gates_r(r_tilde)).chunk(2, dim=-1)    # the local gates
        # θ are fp32 master weights; autocast leaves tanh in fp32 (as the reference)
        gamma_r, gamma_x = torch.tanh(self.theta_r).to(x.dtype), torch.tanh(self.theta_x).to(x.dtype)
        return x + gamma_r * a_r * r_tilde + gamma_x * a_x * x


# Control flow (the reference's c_t): per token 0 = padding, 1 = non-recurrent (e.g. a prompt), >= 2 =
# recurrent. Only recurrent tokens are mixed and merge the state; the others pass x through and write their
# raw l_end output. `recurrent_tokens` below is the mask (c > 1) (B, T, 1), or None when every token is recurrent.


# -----------------------------------------------------------------------------
# Configuration

@dataclass
class GPTConfig:
    """Every variant is a setting of these fields. __post_init__ fills the flavour's defaults and raises
    ValueError, naming the bad value and what is valid (the checks: support/checks.py)."""
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
    weight_init: str = "mesh"        # "mesh" (GPT.init_weights) or "reference": the T²MLR reference's (HF Llama)
    # MeSH and the heuristic state passings (MeSH paper §3.1-3.2)
    state_passing: str = "base"      # h_sup: base 0 | residual h(t) | anchor h(0) | anchor_star h_emb | mesh
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
    recurrent_residual: bool = True  # R_t = s·(h_t + R_{t-1}), not h_t (on in the reference's FineWeb run)
    recurrent_detach: bool = False   # no gradient along the R chain (reference: off for FineWeb, on for S5)
    gate_bias_prob: Optional[float] = None  # b_r = b_x = logit(p) (S5: 0.5); None = Linear default (FineWeb)
    gate_weight_gain: float = 1.0    # xavier-normal gain of A_r, A_x (FineWeb, S5: 1.0; reference SFT: 1e-2)

    def __post_init__(self):
        llama = self.flavour == "llama"
        self.n_kv_head = self.n_head if self.n_kv_head is None else self.n_kv_head
        self.rope_pct = (1.0 if llama else 0.25) if self.rope_pct is None else self.rope_pct
        self.bias = (not llama) if self.bias is None else self.bias
        self.tie_embeddings = llama if self.tie_embeddings is None else self.tie_embeddings
        check_config(self)
        self.mlp_hidden = self.mlp_hidden or 4 * self.n_embd

    @property
    def norm_class(self):
        """The norm class: LayerNorm with bias (neox) or RMSNorm (llama)."""
        return nn.RMSNorm if self.flavour == "llama" else nn.LayerNorm

    @property
    def depth(self):
        """(n_prelude, n_core, n_loops K, n_coda) of the layout "P+CRK+Q" (the MeSH paper's notation: "2+4R2+2"
        -> (2, 4, 2, 2)); a vanilla stack is (n_layer, 0, 0, 0)."""
        if not self.layout:
            return self.n_layer, 0, 0, 0
        return tuple(map(int, LAYOUT_RE.match(self.layout.replace(" ", "")).groups()))

    @property
    def n_loops(self):
        """K, the loops of the core (0 for a flat stack)."""
        return self.depth[2]

    @property
    def recurrent_layers(self):
        """T²MLR's (l_start, l_end) as layer indices, negative ones counted from the end as Python indexes a
        list; never wrapped around (an index out of range stays out of range and is refused)."""
        return tuple(i + self.n_layer if i < 0 else i for i in (self.l_start, self.l_end))

    @property
    def n_unique(self):
        """Distinct (parameter) layers, n_prelude + n_core + n_coda."""
        return sum(self.depth) - self.depth[2]

    @property
    def n_unrolled(self):
        """Layer applications per token, n_prelude + n_core·K + n_coda (the compute depth)."""
        n_prelude, n_core, K, n_coda = self.depth
        return n_prelude + n_core * K + n_coda


# -----------------------------------------------------------------------------
# The model

class GPT(nn.Module):
    """A decoder-only language model. Vanilla: every layer once. Recursive (layout "P+CRK+Q"): the prelude,
    the core K times with a state passing between loops, the coda. T²MLR: a stack whose layers
    l_start..l_end are recurrent in time."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_unique))   # registered once, in order
        layers, self.mesh, self.gate = list(self.layers), None, None
        if cfg.layout:      # the layout's groups (MeSH §3.1), plain lists of the registered layers
            n_prelude, n_core = cfg.depth[:2]
            self.prelude, self.core = layers[:n_prelude], layers[n_prelude:n_prelude + n_core]
            self.coda = layers[n_prelude + n_core:]
            self.mesh = MeshMemory(cfg) if cfg.state_passing == "mesh" else None
        if cfg.t2mlr:       # below l_start, the recurrent l_start..l_end, above l_end
            l_start, l_end = cfg.recurrent_layers
            self.lower, self.middle, self.upper = layers[:l_start], layers[l_start:l_end + 1], layers[l_end + 1:]
            self.gate = TemporalGate(cfg)
        self.ln_f = cfg.norm_class(cfg.n_embd, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.rotary_cache = {}         # (dtype, device) -> (cos, sin) over block_size positions; see rotary()
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """One initialisation for every variant (the MeSH paper's recipe, with Huginn's base std, Geiping et
        al. 2025, where the paper states none): Linear/Embedding weights N(0, 2/(5C)), biases 0, norms 1;
        attention-out and MLP-down std / sqrt(2 · unrolled depth) (MeSH §4.1); the MeSH routers the same
        small normal, never zero (zero weights would keep the empty slots identical forever: our choice);
        the T²MLR gate its own (TemporalGate.reset_parameters). The embeddings are scaled in forward.
        weight_init "reference" is the T²MLR reference's instead (its models are Hugging Face Llama models):
        every weight N(0, 0.02²), no depth scaling; with embed_scale=False, as its embeddings are unscaled."""
        reference = self.cfg.weight_init == "reference"
        std = 0.02 if reference else math.sqrt(2 / (5 * self.cfg.n_embd))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                nn.init.ones_(module.weight)
            if isinstance(module, (nn.Linear, nn.LayerNorm)) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if not reference:                    # depth-aware output projections (MeSH §4.1)
            for layer in self.layers:
                for proj in (layer.attn.proj, layer.mlp.down):
                    nn.init.normal_(proj.weight, mean=0.0, std=std / math.sqrt(2 * self.cfg.n_unrolled))
        if self.gate is not None:
            self.gate.reset_parameters()

    # ---- forward: idx -> logits, one branch per variant -------------------------------------------------

    def forward(self, idx, targets=None, mode=None, cache: Optional[InferenceCache] = None, control=None,
                tol: float = 0.0):
        """idx (B, T) token ids; targets (B, T), -1 ignored. With `cache`, idx continues the sequence the cache
        holds (positions cache.length..), and the cache is updated in place.
        mode (T²MLR only; the other models ignore it and control): "jacobi" (D parallel sweeps, how it
        trains), "exact" (token by token, the true model), "converged" (sweeps until the state moves less
        than `tol`, a prefill); None = "jacobi" in train() without a cache, else "exact". control (T²MLR
        only): (B, T) ints, the control flow (the note after TemporalGate); None = every token recurrent.
        Returns (logits (B, T, V), loss or None). Raises ValueError when the sequence exceeds block_size,
        the mode is unknown, "jacobi" is given a cache, "converged" a non-empty one, or control's shape is
        not idx's."""
        pos = cache.length if cache is not None else 0               # position of idx[:, 0]
        check_forward(self.cfg, idx, pos, control)
        h = self.wte(idx)                                             # h_emb (B, T, C)
        if self.cfg.embed_scale:
            h = h * math.sqrt(self.cfg.n_embd)                        # scaled by sqrt(d) (MeSH paper §4.1)
        if self.gate is not None:                                     # T²MLR: recurrence in time
            mode = mode or ("jacobi" if self.training and cache is None else "exact")
            if mode not in ("jacobi", "exact", "converged"):
                raise ValueError(f"mode {mode!r} is not one of 'jacobi', 'exact', 'converged'")
            h = (self.exact_forward(h, control, cache) if mode == "exact"             # token by token
                 else self.jacobi_forward(h, control, mode, tol, cache))             # parallel sweeps
        elif self.cfg.layout:                                         # recursive: depth by looping (MeSH)
            h = self.recursive_forward(h, pos, cache)
        else:                                                         # vanilla: every layer once
            h = self.run_layers(h, self.layers, pos, cache.layers if cache is not None else None)
        logits = self.lm_head(self.ln_f(h))                           # (B, T, V)
        loss = None
        if targets is not None:      # in float32 at least (bf16 logits under autocast), float64 if the model is
            logits_loss = logits.to(torch.promote_types(logits.dtype, torch.float32))
            loss = F.cross_entropy(logits_loss.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def run_layers(self, h, layers, pos: int, caches=None):
        """Apply `layers` in order to h (B, T, C) at positions pos..pos+T-1 -> (B, T, C). caches: a list of one
        LayerCache (or None) per layer, or None for no caches; ValueError when its length is not len(layers).

        The rotary tables cos/sin (T, 1, rot_dim) of these positions, rot_dim = head_dim·rope_pct rounded down to
        even, the sin table carrying the rotation's sign ([-sin, sin]: see Attention), are computed once per
        (dtype, device) over block_size positions: in float64 for a float64 model, float32 otherwise, and kept
        off the buffers, so `model.to(dtype)` never casts them (float32 tables cast up are exact to ~1e-7)."""
        key = (torch.promote_types(h.dtype, torch.float32), h.device)
        if key not in self.rotary_cache:
            cfg, dtype = self.cfg, key[0]
            rot = int(cfg.n_embd // cfg.n_head * cfg.rope_pct) // 2 * 2
            inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rot, 2, dtype=dtype) / rot))
            angles = torch.outer(torch.arange(cfg.block_size, dtype=dtype), inv_freq)   # (block_size, rot/2)
            cos = torch.cat([angles.cos(), angles.cos()], dim=-1).unsqueeze(1)
            sin = torch.cat([-angles.sin(), angles.sin()], dim=-1).unsqueeze(1)
            self.rotary_cache[key] = (cos.to(h.device), sin.to(h.device))
        cos, sin = (table[pos:pos + h.shape[1]] for table in self.rotary_cache[key])
        for layer, cache in zip(layers, [None] * len(layers) if caches is None else caches, strict=True):
            h = layer(h, cos, sin, cache)
        return h

    # ---- depth: recursive transformers (MeSH paper §3; README (M1), (M2)) ------------------------------

    def recursive_forward(self, h_emb, pos: int, cache=None):
        """h_emb (B, T, C) -> the coda's output (B, T, C): the prelude, the core K times with the state
        passing `state_passing` between loops (§3.1) or MeSH's buffer (§3.2), the coda."""
        cfg = self.cfg
        P, n_core, K = len(self.prelude), len(self.core), cfg.n_loops      # layers per group, loops
        caches = cache.layers if cache is not None else [None] * cfg.n_unrolled    # one per layer application
        h = self.run_layers(h_emb, self.prelude, pos, caches[:P])                  # h_pre
        if cfg.state_passing == "mesh":    # the transitional step: write h_pre into the buffer, read h(0)
            buffer = self.mesh.new_buffer(h_emb)
            router_in = h if cfg.mesh_trans_router_in == "pre" else h_emb
            buffer, h = self.mesh.write_read(0, buffer, router_in=router_in, written=h)
        h0 = h
        for t in range(K):                 # K loops of the same weights, each loop with its own KV caches
            h_core = self.run_layers(h, self.core, pos, caches[P + t * n_core:P + (t + 1) * n_core])  # f_core(h(t))
            if cfg.state_passing == "mesh":          # write f_core(h(t)), read h(t+1); the routers see h(t)
                buffer, h = self.mesh.write_read(t + 1, buffer, router_in=h, written=h_core)
            elif cfg.state_passing == "base":        # h_sup = 0
                h = h_core
            elif cfg.state_passing == "residual":    # h_sup = h(t)
                h = h_core + h
            elif cfg.state_passing == "anchor":      # h_sup = h(0)
                h = h_core + h0
            else:                                    # anchor_star: h_sup = h_emb
                h = h_core + h_emb
        return self.run_layers(h, self.coda, pos, caches[P + K * n_core:])

    # ---- time: T²MLR (arXiv 2607.15178; README (T1)-(T3)) -------------------------------------------

    def middle_step(self, x, R_prev, pos: int = 0, caches=None, recurrent_tokens=None, x_part=None):
        """The recurrent middle at the positions of x: mix R_{t-1} into the input of l_start (the gate), run
        the middle layers l_start..l_end, write R_t from their output h_t. All T positions at once in a Jacobi
        sweep, one token at a time in the exact loop.
        x (B, L, C) the input of l_start; R_prev (B, L or 1, C) the state each position reads; pos: the position
        of x[:, 0]; caches: the middle layers' LayerCaches or None; recurrent_tokens (B, L, 1) bool or None (all);
        x_part: gate.gates_x(x) when the caller computed it once (the speed-up).
        Returns (h (B, L, C), R (B, L, C) the state written at each position)."""
        cfg = self.cfg
        x_mixed = self.gate(x, R_prev, x_part)
        if recurrent_tokens is not None:                            # non-recurrent tokens pass x through
            x_mixed = torch.where(recurrent_tokens, x_mixed, x)
        h = self.run_layers(x_mixed, self.middle, pos, caches)
        # the state update (README (T2), as the reference writes it; 1e-6 inside the rms): s is a stop-gradient
        # constant, NOT an nn.RMSNorm (no weight, and the clamp bites at RMS(u) > 5)
        if not cfg.recurrent_residual:
            return h, h
        u = h + (R_prev.detach() if cfg.recurrent_detach else R_prev)
        s = u.detach().pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt().clamp(0.2, 5.0)
        return h, (u * s if recurrent_tokens is None else torch.where(recurrent_tokens, u * s, h))   # else raw h

    def jacobi_forward(self, h_emb, control=None, mode="jacobi", tol: float = 0.0, cache=None):
        """Parallel T²MLR by Jacobi sweeps, h_emb (B, T, C) -> the top output (B, T, C). A sweep runs
        middle_step over all positions at once, each reading the state the previous sweep wrote for the
        position before it; from R^(0) = 0 every sweep makes one more position exact (README (T3), the
        exactness front). The last sweep's output goes on, so positions < D are exact (all when D >= T); gradient flows
        through it and the b sweeps before it.
        mode "jacobi" runs the config's D, b and jacobi_tol (the early stop: a sweep without gradient that
        moved the state by at most tol relative to its RMS ends them); "converged" (a prefill) runs D = T,
        b = 0 and its own `tol`, and fills an empty `cache` with every layer's keys and values and R_{T-1}.
        Departure from the reference (same values and gradients): the lower layers run once and every sweep
        reuses their output x; the reference reruns the whole model in its final pass."""
        cfg = self.cfg
        if mode == "jacobi" and cache is not None:
            raise ValueError("mode 'jacobi' cannot continue a KV cache (its sweeps see the whole sequence at "
                             "once): use mode 'exact' (the default with a cache) or 'converged' for a prompt")
        if mode == "converged" and cache is not None and cache.length:
            raise ValueError(f"mode 'converged' fills an empty cache (a prompt); this one holds {cache.length} "
                             f"positions: continue it with mode 'exact'")
        D, b, tol = (cfg.jacobi_sweeps, cfg.jacobi_grad_sweeps, cfg.jacobi_tol) if mode == "jacobi" else \
            (h_emb.shape[1], 0, tol)
        l_start, l_end = cfg.recurrent_layers
        caches = cache.layers if cache is not None else [None] * cfg.n_layer      # one per layer
        x = self.run_layers(h_emb, self.lower, 0, caches[:l_start])  # the same in every sweep
        x_part = self.gate.gates_x(x)                                # speed-up: the gate's x half, once
        recurrent_tokens = None if control is None else (control > 1).unsqueeze(-1)

        def shift(R):      # R_t written at position t is read by token t + 1; token 0 reads R_{-1} = 0
            return F.pad(R[:, :-1], (0, 0, 1, 0))

        def sweep(R_prev):  # R^(j) from R^(j-1), all positions in parallel
            return shift(self.middle_step(x, R_prev, recurrent_tokens=recurrent_tokens, x_part=x_part)[1])

        grad = torch.is_grad_enabled()
        # R_prev = R^(j): the states every position reads, R^(0) = 0 or the reference's warm start
        # (jacobi_init "plain": the unmixed middle output, shifted; its gradient kept only when b >= D)
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
            if grad and cfg.jacobi_checkpoint:          # recomputed in backward: less memory, more time
                R_prev = checkpoint(sweep, R_prev, use_reentrant=False)
            else:
                R_prev = sweep(R_prev)
        # the final sweep: its middle output goes on (and fills the middle layers' caches)
        h, R = self.middle_step(x, R_prev, caches=caches[l_start:l_end + 1], recurrent_tokens=recurrent_tokens,
                                x_part=x_part)
        if cache is not None:
            cache.R = R[:, -1:]                                      # R_{T-1}: decoding continues from it
        return self.run_layers(h, self.upper, 0, caches[l_end + 1:])

    def exact_forward(self, h_emb, control=None, cache=None):
        """The exact recurrence (the paper's definition; the reference evaluates so), h_emb (B, T, C) -> the top
        output (B, T, C): lower layers in parallel, the middle layers token by token (each token reads the
        R_{t-1} the token before it wrote, R_{-1} = 0, and attends to the cached keys of the earlier tokens),
        upper layers in parallel. With `cache` (generation) every layer keeps its keys and the state continues
        from cache.R; without one, the middle layers get caches for this call only. A span where no row is
        recurrent (control) needs no state: it goes through the middle layers in one chunk (a prompt)."""
        B, T, C = h_emb.shape
        pos = cache.length if cache is not None else 0
        l_start, l_end = self.cfg.recurrent_layers
        caches = cache.layers if cache is not None else [None] * self.cfg.n_layer   # one per layer
        x = self.run_layers(h_emb, self.lower, pos, caches[:l_start])
        # the middle layers' caches: a token attends to the keys of the tokens before it (for this call only
        # without a cache)
        middle_caches = caches[l_start:l_end + 1] if cache is not None else [LayerCache(T) for _ in self.middle]
        x_part = self.gate.gates_x(x)                                # speed-up: the gate's x half, once
        recurrent_tokens = None if control is None else (control > 1).unsqueeze(-1)
        R = cache.R if cache is not None and cache.R is not None else x.new_zeros(B, 1, C)
        # the chunks: one token each, except that a span where no row is recurrent is one chunk
        reads = [True] * T if recurrent_tokens is None else recurrent_tokens.any(dim=0).view(-1).tolist()
        chunk_starts = [t for t in range(T) if t == 0 or reads[t] or reads[t - 1]]
        outputs = []
        for t, stop in zip(chunk_starts, chunk_starts[1:] + [T]):
            chunk = None if recurrent_tokens is None else recurrent_tokens[:, t:stop]
            h_t, R_t = self.middle_step(x[:, t:stop], R, pos=pos + t, caches=middle_caches, recurrent_tokens=chunk,
                                        x_part=x_part[:, t:stop])
            R = R_t[:, -1:]
            outputs.append(h_t)
        if cache is not None:
            cache.R = R
        return self.run_layers(torch.cat(outputs, dim=1), self.upper, pos, caches[l_end + 1:])

    # ---- generation -------------------------------------------------------------

    def new_cache(self, max_len: Optional[int] = None) -> InferenceCache:
        """An empty InferenceCache, one LayerCache per layer application (max_len default block_size)."""
        return InferenceCache(self.cfg.n_unrolled, max_len or self.cfg.block_size)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens: int, temperature: float = 1.0, top_k: Optional[int] = None,
                 generator: Optional[torch.Generator] = None, recurrent_prompt: bool = False,
                 prefill: str = "exact", prefill_tol: float = 0.0):
        """Continue idx (B, T) by max_new_tokens sampled tokens -> (B, T + max_new_tokens).

        Each token comes from the last logits of the model on the last block_size tokens, exactly what a
        full recompute gives (T²MLR: the exact recurrence from the window's first token). While the sequence
        fits in block_size a KV cache makes each step one token of work; beyond it every token of the slid
        window changes position, so each step recomputes the window (nanoGPT's cost).
        temperature 0 = greedy; top_k None = all tokens, k keeps the k most likely. T²MLR: the prompt is non-recurrent
        (c = 1) as the reference generates, unless recurrent_prompt (c = 2, as train.py trains); generated
        tokens are recurrent; prefill "exact" (token by token) or "converged" (Jacobi sweeps until the state
        moves less than prefill_tol); decoding is always exact.
        Raises ValueError for an unknown prefill, prefill_tol outside [0, 1), a negative or NaN temperature,
        top_k < 1."""
        check_generate(temperature, top_k, prefill, prefill_tol)
        window = self.cfg.block_size
        control = torch.full_like(idx, 2 if recurrent_prompt else 1)   # (B, T), grows with idx
        cache = InferenceCache(self.cfg.n_unrolled, window)   # every layer application's keys and values, R
        logits, _ = self(idx[:, -window:], mode=prefill, cache=cache, control=control[:, -window:], tol=prefill_tol)
        for step in range(max_new_tokens):
            # the next token (B, 1): greedy at temperature 0 (the first of exact ties), else a draw from
            # softmax((logits - max) / temperature) over the top_k, in float32 at least. With the max at
            # exactly 0 no temperature overflows: one so small that the division underflows gives the greedy
            # token, inf is uniform; a -inf logit stays -inf (-inf / inf would be NaN)
            last = logits[:, -1, :].to(torch.promote_types(logits.dtype, torch.float32))
            if temperature == 0:
                idx_next = last.argmax(dim=-1, keepdim=True)
            else:
                diff = last - last.amax(dim=-1, keepdim=True)
                scaled = torch.where((diff == 0) | (diff == -math.inf), diff, diff / temperature)
                if top_k is not None and top_k < last.size(-1):     # keep the k largest (and their ties)
                    scaled = scaled.masked_fill(last < torch.topk(last, top_k, dim=-1).values[:, -1:], -math.inf)
                idx_next = torch.multinomial(F.softmax(scaled, dim=-1), num_samples=1, generator=generator)
            idx = torch.cat([idx, idx_next], dim=1)
            control = torch.cat([control, torch.full_like(idx_next, 2)], dim=1)         # generated: recurrent
            if step == max_new_tokens - 1:
                break
            if idx.shape[1] <= window:    # the cache holds all of idx: feed the new token only
                logits, _ = self(idx_next, mode="exact", cache=cache, control=control[:, -1:])
            else:                         # the window slid: recompute it, exactly, without a cache
                logits, _ = self(idx[:, -window:], mode="exact", control=control[:, -window:])
        return idx

    # ---- released checkpoints ---------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, name_or_path: str, **overrides) -> "GPT":
        """A released Pythia or SmolLM2 (a Hugging Face folder or hub id) as a GPT, its config plus
        `overrides`; e.g. the T²MLR paper's §3.4 retrofit, GPT.from_pretrained("HuggingFaceTB/SmolLM2-135M",
        t2mlr=True, l_start=12, l_end=17). Loading lives in support/pretrained.py. Raises ValueError."""
        from support.pretrained import from_pretrained
        return from_pretrained(name_or_path, **overrides)


if __name__ == "__main__":      # python model.py config/<name>.py: a summary of the architecture
    from support.accounting import main
    main()
