"""One file, every variant: a vanilla GPT, recursive transformers with MeSH (arXiv 2510.07739), and
T²MLR (arXiv 2607.15178). Comments cite the README's equations (M1)-(M2), (T1)-(T3) and the papers'
sections; shapes: B batch, T positions of this call, C = n_embd (the width), V vocabulary.
"The T²MLR code" is the authors' public code; "our reading", a choice the papers leave open.
test_equivalence.py tests each variant against slow float64 definitions. Needs only torch
(from_pretrained and `python model.py` import the rest of the repository)."""

import math
import re
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


# -----------------------------------------------------------------------------
# The transformer layer: attention with rotary and an optional KV cache, the MLP

class InferenceCache:
    """Carried between generation's calls: `layers`, a dict per layer application (K per looped core
    layer) of "k", "v" (B, n_kv_head, length, hs); `length`, the columns so far; `R`, T²MLR's
    R_{t-1} (B, 1, C); `offsets` (B, 1), the left pads (position = column - offsets)."""

    def __init__(self, n_applications: int, offsets: Optional[torch.Tensor] = None):
        self.layers, self.length, self.R = [{} for _ in range(n_applications)], 0, None
        self.offsets = 0 if offsets is None or not offsets.any() else offsets[:, None]


class Layer(nn.Module):
    """One layer (B, T, C) -> (B, T, C), residual included: neox (Pythia, MeSH) x + attn(ln1 x) +
    mlp(ln2 x) with LayerNorm; llama (SmolLM2, T²MLR) x += attn(ln1 x); x += mlp(ln2 x), RMSNorm."""

    def __init__(self, cfg):
        super().__init__()
        C, self.n_head, self.n_kv_head = cfg.n_embd, cfg.n_head, cfg.n_kv_head
        self.head_dim, hidden = C // cfg.n_head, cfg.mlp_hidden
        self.parallel, self.swiglu = cfg.flavour == "neox", cfg.flavour == "llama"
        Norm = nn.LayerNorm if self.parallel else nn.RMSNorm          # the flavour's norm
        # weights as checkpoints name them: attn.qkv (q, k, v fused), attn.proj, mlp.up, mlp.down
        self.ln1 = Norm(C, eps=cfg.norm_eps)
        self.attn = nn.ModuleDict({
            "qkv": nn.Linear(C, C + 2 * self.n_kv_head * self.head_dim, bias=cfg.bias),
            "proj": nn.Linear(C, C, bias=cfg.bias)})
        self.ln2 = Norm(C, eps=cfg.norm_eps)
        self.mlp = nn.ModuleDict({                                   # SwiGLU: up = [W_g W_u]
            "up": nn.Linear(C, (2 if self.swiglu else 1) * hidden, bias=cfg.bias),
            "down": nn.Linear(hidden, C, bias=cfg.bias)})

    def forward(self, x, cos, sin, cache: Optional[dict] = None, held=None, pos=0):
        """x (B, T, C) at positions pos..pos+T-1 (an int, or (B, 1): a key at a position < 0 is a
        left pad, unseen) -> (B, T, C). Attention: causal, grouped-query heads (n_kv_head <=
        n_head), rotary with cos/sin ((B,) T, 1, rot_dim) the tables of these positions
        (GPT.run_layers), SDPA. cache: this layer application's KV cache, "k", "v" before ({} if
        none), extended in place. held: (done (B, 1, T, 1), the last loop's cache): a position done
        looping serves its last loop's keys and values (an exit)."""
        (B, T, C), nh, nkv = x.shape, self.n_head, self.n_kv_head
        qkv = self.attn.qkv(self.ln1(x)).view(B, T, nh + 2 * nkv, self.head_dim)
        qk, v = qkv[:, :, :nh + nkv], qkv[:, :, nh + nkv:].transpose(1, 2)   # v (B, nkv, T, hs)
        # rotary (RoPE, NeoX/LLaMA "rotate half") on the first rot_dim dims of each head of q and
        # k: a head's [a1, a2] (its halves) -> [a1, a2] cos + [-a2, a1] sin
        if rot := cos.shape[-1]:                        # rot = 0 (rope_pct = 0) is NoPE
            a1, a2 = qk[..., :rot].chunk(2, dim=-1)
            r = (qk[..., :rot] * cos + torch.cat([-a2, a1], dim=-1) * sin).to(qk.dtype)
            qk = r if rot == self.head_dim else torch.cat([r, qk[..., rot:]], dim=-1)   # NeoX: 25%
        q, k = qk.transpose(1, 2).split([nh, nkv], dim=1)                   # (B, nh | nkv, T, hs)
        if held is not None:          # exited positions: their last loop's keys and values
            done, last = held
            k, v = (torch.where(done, last[n][:, :, -T:], new) for n, new in (("k", k), ("v", v)))
        if cache is not None:         # the KV cache: the earlier positions' keys and values first
            if cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache.update(k=k, v=v)                                           # (B, nkv, past+T, hs)
        past = k.shape[2] - T
        # causal; a chunk after a cached prefix: query i sees keys 0..past+i (one token: all)
        mask = None if past == 0 or T == 1 else \
            torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(diagonal=past)
        if not isinstance(pos, int):   # left pads (position < 0): unseen, but a pad sees itself
            col = torch.arange(past + T, device=x.device)          # key columns; queries col[past:]
            seen = (col <= col[past:, None]) & (col >= past - pos)[:, None]   # (B, T, past+T)
            mask = (seen | (col == col[past:, None]))[:, None]                 # (B, 1, T, past+T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True,
                                           is_causal=past == 0 and mask is None)
        x_attn = x + self.attn.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        # the MLP, on the same x (neox: parallel residual) or on x_attn (llama: sequential)
        up = self.mlp.up(self.ln2(x if self.parallel else x_attn))
        if self.swiglu:              # SwiGLU (llama): down(silu(x W_g) * x W_u), up = [W_g W_u]
            xg, xu = up.chunk(2, dim=-1)
            return x_attn + self.mlp.down(F.silu(xg) * xu)
        return x_attn + self.mlp.down(F.gelu(up))                        # GELU (neox)


# -----------------------------------------------------------------------------
# Configuration: the fields of every variant (their valid values: check, at the end)

@dataclass
class GPTConfig:
    """Every variant is a setting of these fields. __post_init__ fills the flavour's defaults,
    raises ValueError naming the bad value and what is valid, and derives the layer counts."""
    flavour: str = "neox"            # "neox" (Pythia, MeSH's base) or "llama" (SmolLM2, T²MLR's)
    vocab_size: int = 50304          # GPT-2's 50257 padded to a multiple of 64
    block_size: int = 1024           # maximum sequence length T
    n_layer: int = 12                # depth of a vanilla model (used when layout is "")
    layout: str = ""                 # recursive "P+NRK+Q": prelude, core, K loops, coda (MeSH)
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
    weight_init: str = "mesh"        # "mesh" (GPT.init_weights) or "normal_0.02" (the T²MLR code's)
    state_passing: str = "base"      # h_sup of (M1): base, residual, anchor, anchor_star; mesh (M2)
    mesh_slots: Optional[int] = None  # n_slots (the paper's B); None = K + 3 (MeSH §4.4, Table 3)
    mesh_trans_router_in: str = "pre"  # transitional routers read h_pre (our reading) or "emb"
    max_loops: Optional[int] = None  # MeSH routers of steps 0..max_loops (None: K); more reuse it
    t2mlr: bool = False              # temporal middle-layer recurrence on layers l_start..l_end
    l_start: int = 0                 # first recurrent layer (the gate at its input); < 0: from end
    l_end: int = -1                  # last recurrent layer (the state from its output); inclusive
    jacobi_sweeps: int = 16          # D: sweeps a step, the final one included (D exact positions)
    jacobi_grad_sweeps: int = 4      # b: sweeps before the final one that keep gradient (b <= D)
    jacobi_lag: int = 0              # > 0: D = max(1, T - lag) for T tokens: D follows the length
    jacobi_tol: float = 0.0          # > 0: stop no-grad sweeps once the state moves less (relative)
    jacobi_checkpoint: bool = False  # recompute the b sweeps' middle layers in backward (memory)
    jacobi_init: str = "zero"        # R^(0): "zero" (ours) or "ungated" (the T²MLR code's, +1 pass)
    recurrent_residual: bool = True  # R_t = s·(h_t + R_{t-1}), not h_t (the T²MLR code's FineWeb)
    recurrent_detach: bool = False   # no gradient along R (the T²MLR code: FineWeb off, S5 on)
    gate_bias_prob: Optional[float] = None  # b_r = b_x = logit(p) (S5: 0.5); None = Linear default
    gate_weight_gain: float = 1.0    # xavier-normal gain of A_r, A_x (FineWeb, S5: 1.0; SFT: 1e-2)

    def __post_init__(self):
        llama = self.flavour == "llama"
        self.n_kv_head = self.n_head if self.n_kv_head is None else self.n_kv_head
        self.rope_pct = (1.0 if llama else 0.25) if self.rope_pct is None else self.rope_pct
        self.bias = (not llama) if self.bias is None else self.bias
        self.tie_embeddings = llama if self.tie_embeddings is None else self.tie_embeddings
        # T²MLR's (l_start, l_end) as layer indices; a negative one counts from the end (no wrap)
        self.recurrent_layers = tuple(i + self.n_layer if i < 0 else i
                                      for i in (self.l_start, self.l_end))
        # "P+NRK+Q" -> (n_prelude, n_core, K, n_coda): "2+4R2+2" -> (2, 4, 2, 2); None if malformed
        m = re.fullmatch(r"(\d+)\+(\d+)R(\d+)\+(\d+)", self.layout.replace(" ", ""))
        self.depth = m and tuple(map(int, m.groups())) if self.layout else (self.n_layer, 0, 0, 0)
        check(self, **vars(self))
        self.mlp_hidden = self.mlp_hidden or 4 * self.n_embd
        P, n_core, K, Q = self.depth
        # K loops; the distinct (parameter) layers; the layer applications per token (compute depth)
        self.n_loops, self.n_unique, self.n_unrolled = K, P + n_core + Q, P + n_core * K + Q
        self.max_loops = K if self.layout and self.max_loops is None else self.max_loops
        self.n_slots = self.mesh_slots or K + 3               # MeSH's buffer (MeSH §4.4, Table 3)


# -----------------------------------------------------------------------------
# The model

class GPT(nn.Module):
    """A decoder-only language model: vanilla (every layer once), recursive (layout "P+NRK+Q": the
    core looped K times, MeSH) or T²MLR (layers l_start..l_end recurrent in time)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg, self.wte = cfg, nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_unique))   # each once, in order
        layers, self.mesh, self.gate = list(self.layers), None, None
        if cfg.layout:      # the layout's groups (MeSH §3.1), lists of the registered layers
            P, n_core, K = cfg.depth[:3]
            self.prelude, self.core, self.coda = layers[:P], layers[P:P+n_core], layers[P+n_core:]
            if cfg.state_passing == "mesh":   # (M2): a write and a read router per step k = 0..K
                self.mesh = nn.ModuleDict({name: nn.ModuleList(   # Linear(C -> n_slots) each
                    nn.Linear(cfg.n_embd, cfg.n_slots) for _ in range(cfg.max_loops + 1))
                    for name in ("write_routers", "read_routers")})
        if cfg.t2mlr:       # below l_start, the recurrent l_start..l_end, above l_end
            s, e, C = *cfg.recurrent_layers, cfg.n_embd                        # l_start, l_end
            self.lower, self.middle, self.upper = layers[:s], layers[s:e + 1], layers[e + 1:]
            self.gate = nn.Module()     # holds (T1)'s weights, gate.*; (T1) is GPT.temporal_gate
            # W_p; A = [A_r; A_x] (2C x 2C) on g = [x; r~], biases [b_r; b_x]; θ_r, θ_x (0: off)
            self.gate.W_p, self.gate.A = nn.Linear(C, C, bias=False), nn.Linear(2 * C, 2 * C)
            self.gate.theta_r, self.gate.theta_x = (nn.Parameter(torch.zeros(1)) for _ in range(2))
        self.ln_f = type(self.layers[0].ln1)(cfg.n_embd, eps=cfg.norm_eps)     # the layers' norm
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.rotary_cache = {}         # (dtype, device) -> the rotary tables (cos, sin): run_layers
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """MeSH §4.1 (Huginn's base std where the paper gives none): weights N(0, 2/(5C)), biases 0,
        attention-out and MLP-down std / sqrt(2 · unrolled depth); the routers too (never zero:
        ours). weight_init "normal_0.02": the T²MLR code's N(0, 0.02²). Then (T1)'s gate, as the
        T²MLR code: W_p as nn.Linear; A xavier-normal, std gain·sqrt(2/(3C)), x columns first;
        b_r = b_x = logit(gate_bias_prob) (None: U(±1/sqrt(2C))); θ = 0 (the gate off)."""
        C, flat = self.cfg.n_embd, self.cfg.weight_init == "normal_0.02"
        std = 0.02 if flat else math.sqrt(2 / (5 * C))
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):       # norms keep their 1 and 0
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if not flat:      # depth-aware output projections (MeSH §4.1)
            for proj in (p for layer in self.layers for p in (layer.attn.proj, layer.mlp.down)):
                nn.init.normal_(proj.weight, std=std / math.sqrt(2 * self.cfg.n_unrolled))
        if self.gate is not None:       # T²MLR's gate (T1): its own, as the T²MLR code's
            gate = self.gate
            gate.W_p.reset_parameters()
            std = self.cfg.gate_weight_gain * math.sqrt(2 / (3 * C))
            on_x, on_r = (torch.empty(2 * C, C).normal_(std=std) for _ in range(2))
            gate.A.weight.copy_(torch.cat([on_x, on_r], dim=1))
            if self.cfg.gate_bias_prob is None:
                nn.init.uniform_(gate.A.bias, -1 / math.sqrt(2 * C), 1 / math.sqrt(2 * C))
            else:
                p = min(max(self.cfg.gate_bias_prob, 1e-4), 1 - 1e-4)
                nn.init.constant_(gate.A.bias, math.log(p / (1 - p)))
            gate.theta_r.zero_()
            gate.theta_x.zero_()

    # ---- forward: idx -> logits, one branch per variant ------------------------------------------

    def forward(self, idx, targets=None, mode=None, cache=None, control=None, tol: float = 0.0,
                n_loops=None, loops_backprop=None, exit_threshold=None, exits=None, stats=None):
        """idx (B, T) token ids; targets (B, T), -1 ignored -> (logits (B, T, V), loss or None);
        cache: an InferenceCache that idx continues, updated in place. T²MLR: mode "jacobi" (D
        sweeps: training), "exact" (token by token) or "converged" (sweeps until the state moves <
        tol: a prefill), None: "jacobi" in train() without a cache, else "exact"; control (B, T):
        c_t, 0 pad, 1 non-recurrent, >= 2 recurrent."""
        cfg, pos = self.cfg, 0 if cache is None else cache.length - cache.offsets   # idx[:, 0]'s
        depth = dict(n_loops=n_loops, loops_backprop=loops_backprop, exit_threshold=exit_threshold)
        if {*depth.values(), exits} != {None}:    # recursive only: see recursive_forward
            check(cfg, **depth)
            if not cfg.layout:
                raise ValueError("n_loops, loops_backprop, exit_threshold, exits: no loops to set")
        if (length := (cache.length if cache is not None else 0) + idx.shape[1]) > cfg.block_size:
            raise ValueError(f"{length} tokens exceeds block_size = {cfg.block_size}")
        if control is not None and control.shape != idx.shape:
            raise ValueError(f"control {tuple(control.shape)} is not idx's {tuple(idx.shape)}")
        h = self.wte(idx) * math.sqrt(cfg.n_embd) if cfg.embed_scale else self.wte(idx)  # (M1)
        if self.gate is not None:                                     # T²MLR: recurrence in time
            mode = mode or ("jacobi" if self.training and cache is None else "exact")
            c = None if control is None else control[..., None]               # c_t (B, T, 1)
            h = (self.exact_forward(h, pos, c, cache) if mode == "exact"       # token by token
                 else self.jacobi_forward(h, pos, c, mode, tol, cache))       # parallel sweeps
        elif cfg.layout:                                            # recursive: looped depth (MeSH)
            h = self.recursive_forward(h, pos, cache, exits=exits, stats=stats, **depth)
        else:                                                         # vanilla: every layer once
            h = self.run_layers(h, self.layers, pos, cache.layers if cache is not None else None)
        if cache is not None:
            cache.length += idx.shape[1]
        logits = self.lm_head(self.ln_f(h))                           # (B, T, V)
        if targets is None:
            return logits, None
        # the loss in float32 at least (bf16 logits under autocast), float64 for a float64 model
        flat = logits.to(torch.promote_types(logits.dtype, torch.float32)).flatten(0, 1)
        return logits, F.cross_entropy(flat, targets.reshape(-1), ignore_index=-1)   # any strides

    def run_layers(self, h, layers, pos: int, caches=None, held=None):
        """Apply `layers` in order to h (B, T, C) at positions pos..pos+T-1 -> (B, T, C); caches:
        one KV cache (a dict, see Layer.forward) or None per layer, or None; held: (done, the
        previous loop's caches), positions that serve their last loop's keys (Layer.forward)."""
        # rotary tables cos, sin (T, 1, rot_dim = head_dim·rope_pct, even) of positions pos..pos+T-1
        # ((B, T, 1, rot_dim) for pos (B, 1), a pad's at position 0), sliced from angles of every
        # position below block_size, made once per (dtype, device): float64 for a float64 stream,
        # else float32; no buffers, so no casts
        key = (torch.promote_types(h.dtype, torch.float32), h.device)
        if key not in self.rotary_cache:
            cfg, dtype = self.cfg, key[0]
            rot = int(cfg.n_embd // cfg.n_head * cfg.rope_pct) // 2 * 2
            inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, rot, 2, dtype=dtype) / rot))
            angles = torch.outer(torch.arange(cfg.block_size, dtype=dtype), inv_freq)  # (T, rot/2)
            angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)                 # (T, 1, rot)
            self.rotary_cache[key] = (angles.cos().to(h.device), angles.sin().to(h.device))
        T = h.shape[1]
        at = slice(pos, pos + T) if isinstance(pos, int) else \
            (pos + torch.arange(T, device=h.device)).clamp(min=0)       # a pad (position < 0) at 0
        cos, sin = (table[at] for table in self.rotary_cache[key])
        caches = [None] * len(layers) if caches is None else caches
        done, last = held or (None, caches)
        for layer, cache, previous in zip(layers, caches, last, strict=True):
            h = layer(h, cos, sin, cache, None if done is None else (done, previous), pos)
        return h

    # ---- depth: recursive transformers (MeSH paper §3; README (M1), (M2)) ------------------------

    def recursive_forward(self, h_emb, pos: int, cache=None, n_loops=None, loops_backprop=None,
                          exit_threshold=None, exits=None, stats=None):
        """h_emb (B, T, C) -> the coda's output (B, T, C): the prelude, the core K times with the
        state passing `state_passing` between loops (§3.1) or MeSH's buffer (§3.2), the coda. At
        test time: n_loops K' instead of K; exit_threshold τ: a position stops looping once its
        state moves by < τ, or after the loops `exits` (B, T) gives; stats gets "loops" (B, T).
        loops_backprop: only the last loops_backprop loops carry gradient."""
        cfg, mesh = self.cfg, self.cfg.state_passing == "mesh"
        P, n_core, _, Q = cfg.depth                            # layers per group
        K, T = n_loops or cfg.n_loops, h_emb.shape[1]          # loops of the core
        caches = cache.layers if cache is not None else [None] * (P + n_core * K + Q)
        if len(caches) != P + n_core * K + Q:
            raise ValueError(f"a cache of {len(caches)} layer applications for {K} loops")
        h, buffer = self.run_layers(h_emb, self.prelude, pos, caches[:P]), None    # h_pre
        if mesh:                           # (M2) start: h_emb in slot 0 of n_slots, zeros elsewhere
            u = h if cfg.mesh_trans_router_in == "pre" else h_emb     # the transitional step:
            buffer, h = self.mesh_write_read(0, h_emb, u=u, y=h)      # write y_0 = h_pre, read h(0)
        h0, buffer0, grad = h, buffer, torch.is_grad_enabled()
        # exits at test time: position (b, i) runs loops[b, i] loops, K' unless it exits
        exiting = exit_threshold is not None or exits is not None
        loops = exits if exits is not None else torch.full((h.shape[0], T), K, device=h.device)
        caches = [{} for _ in caches] if exiting and cache is None else caches   # keys per loop
        cut = K - min(loops_backprop or K, K)   # truncation: loops before `cut` have no gradient
        for k in range(K):                # K loops of the same weights, each with its own KV caches
            loop_caches = caches[P + k * n_core:P + (k + 1) * n_core]
            if k == cut > 0:   # the truncated loops' state, its gradient to h(0) as an identity
                h = h0 + (h - h0).detach()
                buffer = buffer0 + (buffer - buffer0).detach() if mesh else None
            h_prev, buffer_prev, active = h, buffer, loops > k        # active (B, T): looping
            held = (~active[:, None, :, None], caches[P + (k - 1) * n_core:P + k * n_core]) \
                if exiting and k > 0 else None
            with torch.set_grad_enabled(grad and k >= cut):
                y = self.run_layers(h, self.core, pos, loop_caches, held)   # y = f_core(h(k))
                if mesh:               # write y_{k+1} = y, read h(k+1), routed by u = h(k)
                    buffer, h = self.mesh_write_read(k + 1, buffer, h, y, last=k == K - 1)
                else:                  # (M1): h(k+1) = f_core(h(k)) + h_sup(k)
                    h_sup = {"base": 0, "residual": h, "anchor": h0, "anchor_star": h_emb}
                    h = y + h_sup[cfg.state_passing]
            if exiting:        # ---- an exited position keeps its state (and its MeSH buffer)
                if exit_threshold is not None:   # the relative change (Huginn's "latent-diff")
                    change = (h - h_prev).norm(dim=-1) / h.norm(dim=-1)
                    loops = torch.where(active & (change < exit_threshold), k + 1, loops)
                h = torch.where(active[..., None], h, h_prev)
                buffer = torch.where(active[..., None], buffer, buffer_prev) if mesh else None
                if not (loops > k + 1).any():   # all done: decoding saves the later loops, whose
                    later = caches[P + (k + 1) * n_core:P + K * n_core] if cache is not None else []
                    for c, last in zip(later, loop_caches * K):   # caches get this loop's keys
                        c.update({n: torch.cat([c[n], last[n][:, :, -T:]], 2) if c else
                                  last[n][:, :, -T:] for n in ("k", "v")})
                    break
        if stats is not None:
            stats["loops"] = loops                                         # (B, T)
        return self.run_layers(h, self.coda, pos, caches[P + K * n_core:])

    def mesh_write_read(self, step: int, buffer, u, y, last=False):
        """(M2) one step (MeSH Eq. 3; step 0 the transitional one, step k+1 after loop k): write y
        (B, T, C) into every slot of buffer (n_slots, B, T, C; step 0: h_emb, slot 0 of zeros), then
        read h_next (B, T, C) from the UPDATED buffer, both routed by u with the step's routers;
        last: not read again, the buffer is not written. Returns (buffer, h_next)."""
        # the softmax in fp32 (autocast); a loop past max_loops reuses the last routers
        fp32, step = torch.promote_types(u.dtype, torch.float32), min(step, self.cfg.max_loops)
        w_write = F.softmax(self.mesh.write_routers[step](u), dim=-1, dtype=fp32)  # (B, T, n)
        w_read = F.softmax(self.mesh.read_routers[step](u), dim=-1, dtype=fp32)
        if last:                           # the same read: Σ_n r_n (slot_n + w_n y) = ... + (r·w) y
            y_read = (w_read * w_write).sum(-1, keepdim=True) * y
            return buffer, (torch.einsum("btn,nbtc->btc", w_read, buffer) + y_read).to(y.dtype)
        written = torch.einsum("btn,btc->nbtc", w_write, y)       # slot n gets w_write[..., n] y
        buffer = buffer + written if buffer.dim() == 4 else \
            torch.cat([(buffer + written[0])[None], written[1:]])   # step 0: no zero slots built
        h_next = torch.einsum("btn,nbtc->btc", w_read, buffer)    # read: Σ_n w_read[..., n] m_n
        return buffer, h_next.to(y.dtype)

    # ---- time: T²MLR (arXiv 2607.15178; README (T1)-(T3)) ----------------------------------------

    def temporal_gate(self, x, r, control=None, x_part=None):
        """(T1), the T²MLR code's "gated" mixer: x' from x (B, T, C), the input of l_start, and r =
        R_{t-1} (B, T or 1, C); a token whose control flow c_t (control (B, T, 1),
        docs/control_flow.md) is 0 or 1 passes x. x_part: Jacobi's speed-up, see jacobi_forward."""
        gate = self.gate
        r_tilde = gate.W_p(r)                                         # W_p R_{t-1}, (B, T or 1, C)
        if x_part is None:
            a = gate.A(torch.cat([x, r_tilde.expand_as(x)], dim=-1))      # A g + b, g = [x; r~]
        else:                    # the same, A's x columns (and b) already applied to x: x_part
            a = x_part + F.linear(r_tilde, gate.A.weight[:, x.shape[-1]:])
        a_r, a_x = torch.sigmoid(a).chunk(2, dim=-1)                          # the local gates
        # θ are fp32 master weights; autocast leaves tanh in fp32 (as the T²MLR code)
        gamma_r, gamma_x = (torch.tanh(theta).to(x.dtype) for theta in (gate.theta_r, gate.theta_x))
        x_mixed = x + gamma_r * a_r * r_tilde + gamma_x * a_x * x
        return x_mixed if control is None else torch.where(control > 1, x_mixed, x)

    def state_update(self, h, R_prev, control=None):
        """(T2) as the T²MLR code writes it: R = s·(h + R_prev), s = clamp(1/rms, 0.2, 5) (1e-6
        inside the rms) a stop-gradient constant; h (B, T, C) the middle output, R_prev (B, T or 1,
        C) the state read -> R (B, T, C). R = h without recurrent_residual and where c_t = 1; a pad
        (c_t = 0) keeps R_prev."""
        R = h                                                     # option: R_t = h_t
        if self.cfg.recurrent_residual:
            summed = h + (R_prev.detach() if self.cfg.recurrent_detach else R_prev)  # h_t + R_{t-1}
            s = summed.detach().pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt().clamp(0.2, 5.0)
            R = s * summed                                        # R_t = s_t · (h_t + R_{t-1})
        if control is not None:         # c_t = 1 (not recurrent): R = h; c_t = 0 (a pad): R_prev
            R = torch.where(control > 1, R, torch.where(control > 0, h, R_prev))
        return R

    def jacobi_forward(self, h_emb, pos, c=None, mode="jacobi", tol: float = 0.0, cache=None):
        """(T3), h_emb (B, T, C) at pos, c (B, T, 1) -> the top output (B, T, C): the lower layers
        once, D sweeps of the middle ones, the upper layers on the final sweep's output. "jacobi"
        (training): the config's D and b; "converged" (a prompt into an empty cache): D = T, b = 0,
        and a sweep that moves the state by <= tol of its RMS ends the sweeps before the final."""
        cfg, T = self.cfg, h_emb.shape[1]
        if mode not in ("jacobi", "converged"):              # "exact" is exact_forward
            raise ValueError(f"mode = {mode!r} must be one of 'jacobi', 'exact', 'converged'")
        if cache is not None and (mode == "jacobi" or cache.length):
            raise ValueError(f"mode {mode!r} cannot continue a cache of {cache.length} positions: "
                             f"use mode 'exact' ('converged' fills an empty one, for a prompt)")
        if mode == "jacobi":            # D: jacobi_sweeps, or T - jacobi_lag (D follows the length)
            D = max(1, T - cfg.jacobi_lag) if cfg.jacobi_lag else cfg.jacobi_sweeps
            b, tol = cfg.jacobi_grad_sweeps, cfg.jacobi_tol
        else:                           # converged: T sweeps make every position exact
            D, b = T, 0
        l_start, l_end = cfg.recurrent_layers
        caches = cache.layers if cache is not None else [None] * cfg.n_layer      # one per layer
        x = self.run_layers(h_emb, self.lower, pos, caches[:l_start])  # the same in every sweep
        # speed-up: (T1)'s terms in x alone, A[:, :C] x + b, once for the D sweeps (B, T, 2C)
        x_part = F.linear(x, self.gate.A.weight[:, :x.shape[-1]], self.gate.A.bias)
        grad, settled = torch.is_grad_enabled(), False
        R_prev = torch.zeros_like(x)                                                 # R^(0) = 0
        if cfg.jacobi_init == "ungated":     # option: R^(0) the middle layers' ungated output
            with torch.set_grad_enabled(grad and b >= D):
                R_prev = F.pad(self.run_layers(x, self.middle, pos)[:, :-1], (0, 0, 1, 0))
        for j in range(1, D + 1):       # sweep j: R^(j) from R^(j-1), every position at once
            # (T3)'s gradient cut: the final sweep and the b before it keep their gradient
            keep_grad, final = j >= D - b, j == D
            if settled and not keep_grad:                     # option tol: the state stopped moving
                continue
            with torch.set_grad_enabled(grad and keep_grad):
                x_mixed = self.temporal_gate(x, R_prev, c, x_part)                           # (T1)
                if cfg.jacobi_checkpoint and grad and keep_grad and not final:   # option: memory
                    h = torch.utils.checkpoint.checkpoint(      # recomputed in backward, more time
                        self.run_layers, x_mixed, self.middle, pos, use_reentrant=False)
                else:                   # h = middle(x'); the final sweep fills their caches, if any
                    h = self.run_layers(x_mixed, self.middle, pos,
                                        caches[l_start:l_end + 1] if final else None)
                R = self.state_update(h, R_prev, c)                                          # (T2)
            # R^(j): R_t, written at position t, is read by token t + 1; token 0 reads R_{-1} = 0
            R_j = F.pad(R[:, :-1], (0, 0, 1, 0))
            settled = tol > 0 and not keep_grad and \
                (R_j - R_prev).abs().max() <= tol * R_j.pow(2).mean().sqrt()            # option tol
            R_prev = R_j
        if cache is not None:
            cache.R = R[:, -1:]                                # R_{T-1}: decoding continues from it
        return self.run_layers(h, self.upper, pos, caches[l_end + 1:])

    def exact_forward(self, h_emb, pos, c=None, cache=None):
        """The exact recurrence, h_emb (B, T, C) at pos, c (B, T, 1) -> the top output (B, T, C):
        the middle layers token by token, each reading R_{t-1} and the keys written before it. R
        continues from cache.R."""
        B, T, C = h_emb.shape
        l_start, l_end = self.cfg.recurrent_layers
        caches = cache.layers if cache is not None else [None] * self.cfg.n_layer   # one per layer
        x = self.run_layers(h_emb, self.lower, pos, caches[:l_start])
        middle_caches = [{} for _ in self.middle] if cache is None else caches[l_start:l_end + 1]
        R = cache.R if cache is not None and cache.R is not None else x.new_zeros(B, 1, C)
        starts = list(range(T))                                     # token by token, t = 0..T-1
        if c is not None:    # speed-up: a span of equal c_t where no row recurs (a prompt) at once
            cols = [tuple(v) for v in c[:, :, 0].T.tolist()]
            starts = [t for t in starts if t == 0 or max(cols[t]) > 1 or cols[t] != cols[t - 1]]
        outputs = []
        for t, stop in zip(starts, starts[1:] + [T]):         # token t (or the span t..stop-1)
            chunk = None if c is None else c[:, t:stop]
            x_mixed = self.temporal_gate(x[:, t:stop], R, chunk)                            # (T1)
            h_t = self.run_layers(x_mixed, self.middle, pos + t, middle_caches)
            R = self.state_update(h_t, R, chunk)[:, -1:]                  # (T2): R_t, (B, 1, C)
            outputs.append(h_t)
        if cache is not None:
            cache.R = R
        return self.run_layers(torch.cat(outputs, dim=1), self.upper, pos, caches[l_end + 1:])

    # ---- generation -------------------------------------------------------------

    @torch.no_grad()
    def generate(self, prompts, max_new_tokens: int, temperature: float = 1.0, top_k=None,
                 generator=None, recurrent_prompt=False, prefill="exact", prefill_tol=0.0,
                 lengths=None, n_loops=None, exit_threshold=None, stop_token=None, stats=None):
        """Continue each prompt by up to max_new_tokens sampled tokens. prompts: a list of 1-D id
        tensors -> a list, each prompt and its continuation (through stop_token); or (B, T), row
        b's prompt its last lengths[b] columns -> (B, T + new), stopped rows filled with stop_token.
        Left pads are masked out of attention, keep the T²MLR state (c = 0) and do not move a row's
        positions: a row gets what it gets alone. temperature 0: greedy; top_k: the k most likely.
        T²MLR: the prompt c = 1 (as the T²MLR code) or recurrent_prompt c = 2, prefilled "exact" or
        "converged". n_loops, exit_threshold: recursive_forward's; stats["mean_loops"] of tokens."""
        check(self.cfg, prefill=prefill, prefill_tol=prefill_tol, temperature=temperature,
              top_k=top_k, stop_token=stop_token)
        listed, window = isinstance(prompts, (list, tuple)), self.cfg.block_size
        idx = nn.utils.rnn.pad_sequence(prompts, True, padding_side="left") if listed else prompts
        B, T = idx.shape
        lengths = torch.as_tensor([len(p) for p in prompts] if listed else
                                  [T] * B if lengths is None else lengths, device=idx.device)
        if lengths.shape != (B,) or not ((lengths >= 1) & (lengths <= T)).all():
            raise ValueError(f"prompt lengths {lengths.tolist()} must be one per row, in 1..{T}")
        if lengths.max() > window:
            warnings.warn(f"a {int(lengths.max())}-token prompt > block_size: last {window} kept")
        P, n_core, K, Q = self.cfg.depth                  # a flat stack: (n_layer, 0, 0, 0)
        real = torch.arange(T, device=idx.device) >= T - lengths[:, None]       # (B, T): not a pad
        control = real * (2 if recurrent_prompt else 1)        # c_t: 0 at a pad; grows with idx
        stopped, n_new = torch.zeros_like(lengths, dtype=torch.bool), torch.zeros_like(lengths)
        depth, runs = dict(n_loops=n_loops, exit_threshold=exit_threshold), []
        for step in range(max_new_tokens):
            run, start = {}, max(0, idx.shape[1] - window)           # the window's first column
            if step == 0 or start:      # the prompt, or a window that slid: recomputed, cached
                pads = (T - lengths - start).clamp(min=0)            # (B,) left pads in the window
                cache = InferenceCache(P + n_core * (n_loops or K) + Q, pads)
            cols = slice(start, None) if step == 0 or start else slice(-1, None)   # or the new one
            logits, _ = self(idx[:, cols], mode=prefill if step == 0 else "exact", cache=cache,
                             control=control[:, cols], tol=prefill_tol, stats=run, **depth)
            if run:                     # (none in a flat stack) the loops of the tokens run
                runs.append(run["loops"][(control[:, cols] > 0) & ~stopped[:, None]].float())
            # the next token (B, 1): greedy, or a draw from softmax((logits - max) / temperature)
            # over the top_k; the max at exactly 0 and -inf kept, no temperature overflows
            last = logits[:, -1, :].to(torch.promote_types(logits.dtype, torch.float32))
            if temperature == 0:
                idx_next = last.argmax(dim=-1, keepdim=True)
            else:
                diff = last - last.amax(dim=-1, keepdim=True)
                scaled = torch.where((diff == 0) | (diff == -math.inf), diff, diff / temperature)
                if top_k is not None and top_k < last.size(-1):   # keep the k largest (and ties)
                    scaled = scaled.masked_fill(last < last.topk(top_k).values[:, -1:], -math.inf)
                idx_next = torch.multinomial(scaled.softmax(-1), 1, generator=generator)
            n_new += ~stopped                             # (B,): each row's tokens, its stop too
            if stop_token is not None:    # a stopped row is never changed: it repeats stop_token
                idx_next = idx_next.masked_fill(stopped[:, None], stop_token)
                stopped |= idx_next[:, 0] == stop_token
            idx = torch.cat([idx, idx_next], dim=1)
            control = torch.cat([control, torch.full_like(idx_next, 2)], dim=1)   # generated: c = 2
            if stopped.all():
                break
        if stats is not None and runs:
            stats["mean_loops"] = torch.cat(runs).mean().item()
        return idx if not listed else [row[T - n:T + m] for row, n, m in
                                       zip(idx, lengths.tolist(), n_new.tolist())]

    @classmethod
    def from_pretrained(cls, name_or_path: str, **overrides) -> "GPT":
        """A released Pythia or SmolLM2 (HF folder or hub id) and overrides: docs/pretrained.md."""
        from support.pretrained import from_pretrained
        return from_pretrained(name_or_path, **overrides)


# -----------------------------------------------------------------------------
# Validation: every setting's valid values in one table (GPTConfig, forward, generate)

def check(cfg=None, **values):
    """Refuse a setting outside its valid values (nan fails every test): ValueError "<name> =
    <value> must be <what is valid>". The settings of GPTConfig, forward and generate, in the
    table's order; a name without a rule is free if it is a field of cfg (the config the tests
    read), else a TypeError."""
    # names -> the valid values (a tuple), or (test(value, config), what is valid: text or text(c))
    rules = {name: rule for names, rule in {
        "flavour": ("neox", "llama"), "weight_init": ("mesh", "normal_0.02"),
        "state_passing": ("base", "residual", "anchor", "anchor_star", "mesh"),
        "mesh_trans_router_in": ("pre", "emb"), "jacobi_init": ("zero", "ungated"),
        "prefill": ("exact", "converged"),
        "vocab_size block_size n_layer n_embd jacobi_sweeps": ((lambda v, c: v >= 1), ">= 1"),
        "jacobi_lag": ((lambda v, c: v >= 0), ">= 0 (0: D = jacobi_sweeps)"),
        "n_head": (lambda v, c: v >= 1 and c.n_embd % v == 0, "a divisor of n_embd"),
        "n_kv_head": (lambda v, c: v >= 1 and c.n_head % v == 0, "a divisor of n_head"),
        "mlp_hidden": (lambda v, c: v >= 1 if v is not None else c.flavour == "neox",
                       ">= 1 (None = 4 n_embd, neox only: llama needs its SwiGLU width)"),
        "mesh_slots": (lambda v, c: v is None or v >= 2, ">= 2 or None"),
        "rope_theta norm_eps gate_weight_gain": ((lambda v, c: 0 < v < math.inf), "finite and > 0"),
        "rope_pct": (lambda v, c: 0 <= v <= 1, "in [0, 1] or None"),
        "gate_bias_prob": (lambda v, c: v is None or 0 < v < 1, "in (0, 1) or None"),
        "jacobi_tol prefill_tol": ((lambda v, c: 0 <= v < 1), "in [0, 1)"),
        "jacobi_grad_sweeps": (lambda v, c: 0 <= v <= c.jacobi_sweeps,
                               lambda c: f"in [0, jacobi_sweeps = {c.jacobi_sweeps}]"),
        "layout": (lambda v, c: v == "" or c.depth is not None and min(c.depth[1:3]) >= 1,
                   "'' (flat) or 'P+NRK+Q': N >= 1 core layers looped K >= 1 times, "
                   "e.g. '2+4R2+2'"),
        "t2mlr": (lambda v, c: not (v and c.layout),
                  "False with a layout: T²MLR needs a flat stack"),
        "max_loops": (lambda v, c: v is None or bool(c.layout) and v >= c.depth[2],  # after layout
                      lambda c: f">= the layout's K = {c.depth[2]}" if c.layout
                      else "None: no loops"),
        "n_loops loops_backprop": ((lambda v, c: v is None or v >= 1), ">= 1 or None"),
        "exit_threshold": ((lambda v, c: v is None or v >= 0), ">= 0 (0: never exit) or None"),
        "l_start": (lambda v, c: not c.t2mlr or 0 <= min(c.recurrent_layers)
                    and c.recurrent_layers[0] <= c.recurrent_layers[1] < c.n_layer,
                    lambda c: f"<= l_end = {c.l_end}, both in -{c.n_layer} .. {c.n_layer - 1}"),
        "temperature": ((lambda v, c: v >= 0), ">= 0 (0 = greedy)"),
        "top_k": (lambda v, c: v is None or v >= 1, ">= 1 (sample from the k most likely) or None"),
        "stop_token": (lambda v, c: v is None or 0 <= v < c.vocab_size, "a token id or None"),
    }.items() for name in names.split()}
    if unknown := [name for name in values if name not in rules and not hasattr(cfg, name)]:
        raise TypeError(f"check: no rule for {', '.join(unknown)}")
    for name, rule in rules.items():              # in this order: layout before max_loops
        if name in values:
            test, text = rule if callable(rule[0]) else \
                ((lambda v, c: v in rule), "one of " + ", ".join(map(repr, rule)))
            if not test(values[name], cfg):
                raise ValueError(f"{name} = {values[name]!r} must be "
                                 f"{text(cfg) if callable(text) else text}")


if __name__ == "__main__":      # python model.py config/<name>.py: a summary of the architecture
    from configurator import load_config
    from support.accounting import main
    main(load_config)
