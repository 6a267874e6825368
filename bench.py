"""
Speed and memory of every variant, measured side by side in ONE process: each measurement is a round
robin over the variants (A, B, C, A, B, C, ...), repeated, and a ratio is the median over rounds of the
per-round ratio, so load from other processes hits both sides of every ratio alike.

    python bench.py                          # tiny models; about 2.5 minutes on 2 CPU cores
    python bench.py --size 160m --device cuda     # the 160M MeSH family and SmolLM2-135M T²MLR, bf16
    python bench.py --repeats 9 --out bench.json
    python bench.py --compile                # also every variant compiled, as train.py compiles it (minutes)

Variants. MeSH family (GPT-NeoX blocks, as the MeSH paper): vanilla, base recursion and MeSH at the same
unrolled depth (tiny: 8 layers vs 2+2R2+2). T²MLR family (LLaMA blocks): plain vs T²MLR Jacobi; the tiny
size is the setting in which we timed the T²MLR code (github.com/princeton-pli/T2MLR) on CPU
(d 128, 8 layers, 4 heads, vocab 512, SwiGLU 512, layers 2..5 recurrent, T 256, batch 4, D 16, b 4,
θ_r = θ_x = 0.5 so the recurrence is active), so its ratios compare directly with the T²MLR code's
(Jacobi 5.27×, decode 1.17×, exact prefill 14×).

Measurements, each the median of --repeats rounds after --warmup rounds:
- train step: forward + backward (the T²MLR code's "fwd+bwd"), and the full step with the AdamW update;
  ratios to the family's plain model, and MeSH against base recursion;
- memory: what one full step of one variant needs. On CUDA: the peak of torch.cuda.max_memory_allocated
  during the step above what was allocated before it (the other variants' weights, anything left over),
  plus the variant's own weights and optimizer state, allocated before the step but needed by it. On
  CPU torch keeps no allocator statistics, so it is the peak of the bytes of the distinct non-parameter
  tensors autograd holds for the backward pass (the activation memory, which peaks when backward
  starts; SavedTensorMeter) plus 16 bytes per parameter (fp32 weights, gradients, Adam's two moments).
  Peak RSS cannot be split between variants in one process and is not used;
- MFU: the model's own train_flops_per_token (6N plus attention, every loop and sweep counted) times
  tokens per second, over the FLOP/s of a large matmul in the training dtype timed in the same rounds;
- decode: ms per token with the KV cache, 64 new tokens (greedy) after a 64-token prompt, batch 1; base
  recursion and MeSH again at --exit_threshold (a position stops looping once its state changes by less
  than it): the mean loops a new token ran and the time per token against the same model at full depth;
- batched generation: 16 prompts of different lengths (tiny 8..64 tokens), 16 new tokens each (greedy), as
  one left-padded batch (GPT.generate) against one prompt at a time, per variant, in tokens per second;
- prefill: T²MLR's exact (token by token) prefill of 4 x 64 tokens into a cache, against the plain model's;
- T²MLR options, against the fixed-D Jacobi model with the same weights: a Jacobi step with jacobi_tol (the
  middle-layer passes it used and its time), sweep checkpointing (jacobi_checkpoint: memory and time), and
  the parallel Jacobi prefill (mode "converged", --prefill_tol) against exact prefill at prompts of 64, 256
  and 1024 tokens (batch 1: the latency-bound case), with the passes used and the largest logit difference;
- tokenizer: prepare_data.prepare (in-process, GPT-2 BPE, writing the .bin files) against a bare tiktoken
  encode_ordinary_batch of the same documents (Python's pydoc topics), in tokens per second.
- compiled (--compile, opt-in): fresh copies of vanilla, base, MeSH, plain and T²MLR compiled as train.py
  compiles them (support.runtime.compile_model: T²MLR's layers, gate and state update once each, the rest
  whole): the first training step (the compile included), fwd+bwd and MFU round robin, MeSH against base,
  and T²MLR's exact prefill against plain's, both compiled.
The speed targets are read from the eager measurements. On CUDA the models run under bf16 autocast and every
timer synchronises. Prints markdown tables and writes bench.json.
"""

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import weakref
from contextlib import nullcontext

import torch
from tqdm import tqdm

from model import GPT, GPTConfig, InferenceCache
from support.accounting import count_middle_passes, train_flops_per_token
from support.loop import configure_optimizers
from support.process import keeps_process_state
from support.runtime import compile_model

# Model shapes per size. "neox" holds the MeSH family's shared fields, "llama" the T²MLR family's.
SIZES = {
    "tiny": dict(batch=4, seq=256, prompt=64, new_tokens=64, prefill_batch=4, matmul=2048, gen=(16, 8, 64, 16),
                 prefill_lengths=(64, 256, 1024),
                 neox=dict(flavour="neox", vocab_size=320, n_embd=128, n_head=4),
                 vanilla=dict(n_layer=8), recursive=dict(layout="2+2R2+2"),
                 llama=dict(flavour="llama", vocab_size=512, n_embd=128, n_head=4, n_layer=8, mlp_hidden=512),
                 t2mlr=dict(l_start=2, l_end=5)),
    "160m": dict(batch=8, seq=1024, prompt=64, new_tokens=64, prefill_batch=4, matmul=8192, gen=(16, 16, 256, 64),
                 prefill_lengths=(64, 256, 1024),
                 neox=dict(flavour="neox", vocab_size=50304, n_embd=768, n_head=12),
                 vanilla=dict(n_layer=12), recursive=dict(layout="2+4R2+2"),
                 llama=dict(flavour="llama", vocab_size=50304, n_embd=576, n_head=9, n_kv_head=3, n_layer=30,
                            mlp_hidden=1536, rope_theta=100000.0),
                 t2mlr=dict(l_start=12, l_end=17)),
}
COMPILED = ("vanilla", "base", "mesh", "plain", "t2mlr")        # the variants of --compile
GENERATION = ("vanilla", "base", "mesh", "plain", "t2mlr")      # the variants of the batched-generation row
BASELINE = {"vanilla": "vanilla", "base": "vanilla", "mesh": "vanilla", "plain": "plain", "t2mlr": "plain",
            "t2mlr_tol": "plain", "t2mlr_ckpt": "plain"}
# the T²MLR code (github.com/princeton-pli/T2MLR), timed by us on CPU in this tiny setting with a harness
# around its own code (not in this repository): its ratios to a plain model of the same weights
T2MLR_CODE = {"t2mlr_jacobi": 5.27, "t2mlr_decode": 1.17, "t2mlr_prefill": 14.0}
TARGETS = [   # (key in the results, description, bound, "<=" or ">=", why it matters): our CPU speed goals
    ("t2mlr_jacobi", "T²MLR Jacobi fwd+bwd / plain", 4.8, "<=",
     "what training T²MLR in parallel costs (D sweeps of the middle layers); the T²MLR code pays 5.27×"),
    ("t2mlr_decode", "T²MLR decode / plain, per token", 1.05, "<=",
     "generating with the KV cache and one recurrent state should cost what a plain model's does"),
    ("t2mlr_prefill", "T²MLR exact prefill / plain prefill", 5.0, "<=",
     "reading a prompt exactly, one token at a time through the middle layers, must stay affordable"),
    ("mesh_vs_base", "MeSH step / base recursion step", 1.05, "<=",
     "MeSH's routers and slots should add little to a looped model's training step"),
    ("vanilla_mfu", "vanilla fwd+bwd MFU vs matmul peak", 0.60, ">=",
     "a plain model that uses the hardware well, so that no ratio above is flattered by a slow baseline"),
]


def build_models(size, seq, device, jacobi_tol=1e-3, prefill_lengths=None):
    """{variant: GPT} for one size, every model initialised from seed 0; block_size = the longest sequence
    used. t2mlr_tol and t2mlr_ckpt are t2mlr (same weights) with jacobi_tol and with jacobi_checkpoint."""
    s = SIZES[size]
    block = max(seq, s["prompt"] + s["new_tokens"], *(prefill_lengths or s["prefill_lengths"]))
    configs = {"vanilla": dict(**s["neox"], **s["vanilla"]),
               "base": dict(**s["neox"], **s["recursive"], state_passing="base"),
               "mesh": dict(**s["neox"], **s["recursive"], state_passing="mesh"),
               "plain": dict(s["llama"]),
               "t2mlr": dict(**s["llama"], **s["t2mlr"], t2mlr=True, jacobi_sweeps=16, jacobi_grad_sweeps=4)}
    configs["t2mlr_tol"] = dict(configs["t2mlr"], jacobi_tol=jacobi_tol)
    configs["t2mlr_ckpt"] = dict(configs["t2mlr"], jacobi_checkpoint=True)
    models = {}
    for name, fields in configs.items():
        torch.manual_seed(0)
        models[name] = GPT(GPTConfig(block_size=block, **fields)).to(device)
    with torch.no_grad():            # θ_r = θ_x = 0.5: the gate passes the state (at θ = 0 it is an identity)
        for name in ("t2mlr", "t2mlr_tol", "t2mlr_ckpt"):
            models[name].gate.theta_r.fill_(0.5)
            models[name].gate.theta_x.fill_(0.5)
    return models


# -----------------------------------------------------------------------------
# Timing: round robin over named callables

def sync(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def interleaved(fns, repeats, warmup, desc="measuring"):
    """Call every fn of {name: fn} once per round, warmup + repeats rounds (a progress bar with its ETA on
    stderr, named `desc`). Each fn returns {label: seconds} (it times itself, synchronising). Returns {name:
    {label: [seconds per measured round]}}."""
    times = {name: {} for name in fns}
    for r in tqdm(range(warmup + repeats), desc=desc, unit="round", file=sys.stderr):
        for name, fn in fns.items():
            for label, seconds in fn().items():
                if r >= warmup:
                    times[name].setdefault(label, []).append(seconds)
    return times


def ratio(a, b):
    """Median over rounds of a[i] / b[i] (two lists of timings from the same rounds)."""
    return statistics.median(x / y for x, y in zip(a, b))


def train_step_fn(model, optimizer, x, y, device, autocast):
    """One training step, timed in two parts: forward + backward, then the AdamW update and zero_grad."""
    def step():
        sync(device)
        t0 = time.perf_counter()
        with autocast:
            _, loss = model(x, y)
        loss.backward()
        sync(device)
        t1 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        t2 = time.perf_counter()
        return {"fwd_bwd": t1 - t0, "step": t2 - t0}
    return step


def decode_fn(model, prompt, new_tokens, device, autocast, exit_threshold=None):
    """Greedy decoding with the KV cache: prefill `prompt` (B, P) untimed, then time new_tokens single-token
    steps; with exit_threshold (recursive models) also the mean loops a new token ran."""
    @torch.no_grad()
    def decode():
        cache, depth, loops = InferenceCache(model.cfg.n_unrolled), {}, []
        if exit_threshold is not None:
            depth = dict(exit_threshold=exit_threshold, stats={})
        with autocast:
            logits, _ = model(prompt, cache=cache, **depth)
            sync(device)
            t0 = time.perf_counter()
            for _ in range(new_tokens):
                logits, _ = model(logits[:, -1:].argmax(-1), cache=cache, **depth)
                loops.append(depth["stats"]["loops"].float().mean().item() if depth else 0)
            sync(device)
        return {"per_token": (time.perf_counter() - t0) / new_tokens, "loops": statistics.mean(loops)}
    return decode


def generate_fn(model, prompts, new_tokens, device, autocast, batched):
    """Greedy GPT.generate of new_tokens after each of `prompts` (1-D, of different lengths): all of them as one
    left-padded batch, or one prompt at a time."""
    @torch.no_grad()
    def generate():
        sync(device)
        t0 = time.perf_counter()
        with autocast:
            for batch in [prompts] if batched else [[p] for p in prompts]:
                model.generate(batch, new_tokens, temperature=0)
        sync(device)
        return {"generate": time.perf_counter() - t0}
    return generate


def prefill_fn(model, idx, device, autocast, mode=None, tol=0.0):
    """Prefill idx (B, T) into an empty KV cache (T²MLR: the exact recurrence token by token, or with
    mode "converged" parallel Jacobi sweeps until the state moves less than tol)."""
    @torch.no_grad()
    def prefill():
        sync(device)
        t0 = time.perf_counter()
        with autocast:
            model(idx, cache=InferenceCache(model.cfg.n_unrolled), mode=mode, tol=tol)
        sync(device)
        return {"prefill": time.perf_counter() - t0}
    return prefill


def matmul_fn(n, device, dtype):
    """One (n x n) @ (n x n) matmul in `dtype`: 2 n³ FLOPs, the device's practical peak."""
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)

    def matmul():
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        return {"matmul": time.perf_counter() - t0}
    return matmul


# -----------------------------------------------------------------------------
# Memory

class SavedTensorMeter:
    """Bytes of the tensors autograd holds for the backward pass, now (`live`) and at most (`peak`).

    Inside `with meter:` a saved-tensor pack hook counts every distinct storage while autograd holds it
    (views of one tensor count once; the storages of `exclude`, the weights, never). The hook gives
    autograd a detached handle, never the tensor itself: a saved output holding its own grad_fn is a
    reference cycle that keeps a graph alive for good unless backward runs through it (a graph discarded
    after forward stayed, and stayed counted). A finalizer on the handle subtracts the bytes when autograd
    lets go of it: when backward has used it, or when the graph is discarded. So a discarded graph
    counts only while it exists, and one meter per step measures that step alone.
    """

    def __init__(self, exclude=()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.handles, self.nbytes = {}, {}             # storage data_ptr -> handles alive, storage bytes
        self.live = self.peak = 0

    def pack(self, t):
        handle, ptr = t.detach(), t.untyped_storage().data_ptr()
        if ptr not in self.exclude:
            if ptr not in self.handles:
                self.handles[ptr], self.nbytes[ptr] = 0, t.untyped_storage().nbytes()
                self.live += self.nbytes[ptr]
                self.peak = max(self.peak, self.live)
            self.handles[ptr] += 1
            weakref.finalize(handle, self.release, ptr)
        return handle

    def release(self, ptr):
        self.handles[ptr] -= 1
        if self.handles[ptr] == 0:
            del self.handles[ptr]
            self.live -= self.nbytes.pop(ptr)

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda handle: handle)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)


def train_memory_mb(model, optimizer, x, y, device, autocast):
    """Memory of one training step in MB, as described in the module docstring (CUDA: the step's own peak
    plus the variant's resident weights and optimizer state; CPU: peak saved activations + 16 B/param).
    Returns (peak MB, saved-activation MB)."""
    params = list(model.parameters())
    meter = SavedTensorMeter(exclude=params)
    optimizer.zero_grad(set_to_none=True)
    cuda = device.startswith("cuda")
    if cuda:
        # resident before the step: weights and any optimizer state (created during the step on the first
        # one, and then already in the step's peak)
        resident = sum(p.nbytes for p in params) + sum(v.nbytes for state in optimizer.state.values()
                                                       for v in state.values() if torch.is_tensor(v))
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    with meter, autocast:
        _, loss = model(x, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    activations = meter.peak / 2**20
    if cuda:
        return (torch.cuda.max_memory_allocated(device) - before + resident) / 2**20, activations
    return activations + 16 * sum(p.numel() for p in params) / 2**20, activations


# -----------------------------------------------------------------------------
# Tokenizer throughput

def tokenizer_fns():
    """{name: fn} timing prepare_data.prepare and a bare tiktoken encode_ordinary_batch on the pydoc topics,
    each returning seconds and counting tokens; None when the GPT-2 vocabulary cannot be loaded (offline)."""
    import prepare_data
    shared = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "shared", "tiktoken_cache")
    if os.path.isdir(shared):       # the offline GPT-2 files, for when tiktoken cannot download them
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", os.path.abspath(shared))
    try:
        tok = prepare_data.get_tokenizer("gpt2")
    except prepare_data.DataError as e:
        print(f"tokenizer benchmark skipped: {e}", file=sys.stderr)
        return None, 0
    docs = list(prepare_data.read_pydoc())
    # + one EOT per document, as prepare writes
    n_tokens = sum(map(len, tok.encode_batch(docs))) + len(docs)
    out = tempfile.mkdtemp(prefix="bench_prepare_")
    atexit.register(shutil.rmtree, out, ignore_errors=True)      # the token files are not kept

    def prepare():
        t0 = time.perf_counter()
        prepare_data.prepare([("pydoc", docs)], tok, out, val_fraction=0.05, num_proc=1)
        return {"tokenize": time.perf_counter() - t0}

    def plain():
        t0 = time.perf_counter()
        tok._enc.encode_ordinary_batch(docs)
        return {"tokenize": time.perf_counter() - t0}
    return {"prepare_data": prepare, "tiktoken": plain}, n_tokens


# -----------------------------------------------------------------------------
# The run


def run(
    size="tiny",
    device="auto",
    repeats=7,
    warmup=2,
    batch=None,
    seq=None,
    tokenizer=True,
    jacobi_tol=1e-3,
    prefill_tol=1e-4,
    prefill_lengths=None,
    exit_threshold=0.3,
    compile=False,
):
    """Every measurement of the module docstring. Returns the bench.json dict."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    cuda = device.startswith("cuda")
    dtype = torch.bfloat16 if cuda else torch.float32
    autocast = torch.autocast("cuda", dtype=dtype) if cuda else nullcontext()
    s = SIZES[size]
    B, T = batch or s["batch"], seq or s["seq"]
    load_before = os.getloadavg()[0]
    prefill_lengths = prefill_lengths or s["prefill_lengths"]
    models = build_models(size, T, device, jacobi_tol, prefill_lengths)
    gen = torch.Generator().manual_seed(0)
    vocab = min(m.cfg.vocab_size for m in models.values())
    x, y = (torch.randint(vocab, (B, T), generator=gen).to(device) for _ in range(2))
    result = {
        "size": size,
        "device": torch.cuda.get_device_name(device) if cuda else f"cpu ({torch.get_num_threads()} threads)",
        "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "batch": B,
        "seq_len": T,
        "repeats": repeats,
        "warmup": warmup,
        "jacobi_tol": jacobi_tol,
        "prefill_tol": prefill_tol,
        "variants": {},
    }

    # training steps and the matmul peak, one round robin
    optimizers = {
        n: configure_optimizers(m, 0.1, 1e-5, (0.9, 0.95), "cuda" if cuda else "cpu")
        for n, m in models.items()
    }
    for m in models.values():
        m.train()
    fns = {n: train_step_fn(m, optimizers[n], x, y, device, autocast) for n, m in models.items()}
    fns["matmul"] = matmul_fn(s["matmul"], device, dtype)
    passes = []                                  # middle-layer passes of every t2mlr_tol forward
    step_tol, counter = fns["t2mlr_tol"], count_middle_passes(models["t2mlr_tol"])

    def step_tol_counted():
        counter.n = 0
        times = step_tol()
        passes.append(counter.n)
        return times
    fns["t2mlr_tol"] = step_tol_counted
    t = interleaved(fns, repeats, warmup, "1/6 training steps")
    mm = t.pop("matmul")["matmul"]
    peak = 2 * s["matmul"] ** 3 / statistics.median(mm)
    result["matmul_peak_flops"] = peak
    for n, m in models.items():
        memory, activations = train_memory_mb(m, optimizers[n], x, y, device, autocast)
        flops = train_flops_per_token(m, T) * B * T
        base = BASELINE[n]
        result["variants"][n] = {
            "baseline": base, "params": sum(p.numel() for p in m.parameters()),
            "train_flops_per_token": train_flops_per_token(m, T),
            "fwd_bwd_ms": 1e3 * statistics.median(t[n]["fwd_bwd"]),
            "step_ms": 1e3 * statistics.median(t[n]["step"]),
            "fwd_bwd_ratio": ratio(t[n]["fwd_bwd"], t[base]["fwd_bwd"]),
            "step_ratio": ratio(t[n]["step"], t[base]["step"]),
            "flop_ratio": train_flops_per_token(m, T) / train_flops_per_token(models[base], T),
            # per round: (model FLOPs / step time) / (matmul FLOPs / matmul time) of the same round
            "mfu_fwd_bwd": flops / (2 * s["matmul"] ** 3) / ratio(t[n]["fwd_bwd"], mm),
            "mfu_step": flops / (2 * s["matmul"] ** 3) / ratio(t[n]["step"], mm),
            "memory_mb": memory, "activation_mb": activations}
    for n, v in result["variants"].items():
        v["memory_ratio"] = v["memory_mb"] / result["variants"][v["baseline"]]["memory_mb"]
    result["jacobi_options"] = {
        "tol": {
            "jacobi_tol": jacobi_tol,
            "passes_mean": statistics.mean(passes[warmup:]),
            "passes_fixed": 16,
            "fwd_bwd_vs_fixed": ratio(t["t2mlr_tol"]["fwd_bwd"], t["t2mlr"]["fwd_bwd"]),
        },
        "checkpoint": {
            "memory_vs_plain": result["variants"]["t2mlr_ckpt"]["memory_ratio"],
            "memory_vs_fixed": result["variants"]["t2mlr_ckpt"]["memory_mb"]
            / result["variants"]["t2mlr"]["memory_mb"],
            "fwd_bwd_vs_fixed": ratio(t["t2mlr_ckpt"]["fwd_bwd"], t["t2mlr"]["fwd_bwd"]),
        },
    }
    result["mesh_vs_base"] = ratio(t["mesh"]["fwd_bwd"], t["base"]["fwd_bwd"])
    result["mesh_vs_base_step"] = ratio(t["mesh"]["step"], t["base"]["step"])

    # decoding with the KV cache, batch 1
    for m in models.values():
        m.eval()
    prompt = torch.randint(vocab, (1, s["prompt"]), generator=gen).to(device)
    t = interleaved(
        {n: decode_fn(m, prompt, s["new_tokens"], device, autocast) for n, m in models.items()},
        repeats,
        warmup,
        "2/6 decoding",
    )
    for n, v in result["variants"].items():
        v["decode_ms_per_token"] = 1e3 * statistics.median(t[n]["per_token"])
        v["decode_ratio"] = ratio(t[n]["per_token"], t[v["baseline"]]["per_token"])

    # decoding at an exit threshold that saves loops, against the same model at its full K
    fns = {}
    for n in ("base", "mesh"):
        fns[n] = decode_fn(models[n], prompt, s["new_tokens"], device, autocast)
        fns[n + "_exit"] = decode_fn(models[n], prompt, s["new_tokens"], device, autocast, exit_threshold)
    t = interleaved(fns, repeats, warmup, "2/6 decoding at an exit threshold")
    result["exit_decode"] = {"exit_threshold": exit_threshold, "loops_full": models["base"].cfg.n_loops}
    for n in ("base", "mesh"):
        result["exit_decode"][n] = {"mean_loops": statistics.mean(t[f"{n}_exit"]["loops"]),
                                    "ms_per_token": 1e3 * statistics.median(t[f"{n}_exit"]["per_token"]),
                                    "vs_full": ratio(t[f"{n}_exit"]["per_token"], t[n]["per_token"])}

    # batched generation: prompts of different lengths in one batch against one at a time
    n_prompts, shortest, longest, new_tokens = s["gen"]
    lengths = torch.linspace(shortest, longest, n_prompts).round().long().tolist()
    prompts = [torch.randint(vocab, (n,), generator=gen).to(device) for n in lengths]
    fns = {}
    for n in GENERATION:
        fns[n] = generate_fn(models[n], prompts, new_tokens, device, autocast, batched=True)
        fns[n + "_alone"] = generate_fn(models[n], prompts, new_tokens, device, autocast, batched=False)
    t = interleaved(fns, max(3, repeats // 2), 1, "3/6 batched generation")
    result["batched_generation"] = {"prompts": n_prompts, "lengths": [shortest, longest], "new_tokens": new_tokens}
    for n in GENERATION:
        tokens = n_prompts * new_tokens
        result["batched_generation"][n] = {
            "batched_tok_s": tokens / statistics.median(t[n]["generate"]),
            "alone_tok_s": tokens / statistics.median(t[n + "_alone"]["generate"]),
            "speedup": ratio(t[n + "_alone"]["generate"], t[n]["generate"])}

    # prefill: T²MLR exact (token by token) against the plain model
    idx = torch.randint(vocab, (s["prefill_batch"], s["prompt"]), generator=gen).to(device)
    t = interleaved(
        {n: prefill_fn(models[n], idx, device, autocast) for n in ("plain", "t2mlr")}, repeats, warmup,
        "4/6 exact prefill",
    )
    result["prefill"] = {
        "tokens": list(idx.shape),
        "plain_ms": 1e3 * statistics.median(t["plain"]["prefill"]),
        "t2mlr_exact_ms": 1e3 * statistics.median(t["t2mlr"]["prefill"]),
        "ratio": ratio(t["t2mlr"]["prefill"], t["plain"]["prefill"]),
    }

    # the parallel Jacobi prefill against exact prefill, batch 1, at several prompt lengths
    result["jacobi_prefill"] = []
    t2 = models["t2mlr"]
    for n_tokens in prefill_lengths:
        idx = torch.randint(vocab, (1, n_tokens), generator=gen).to(device)
        with torch.no_grad(), autocast:
            exact = t2(idx, mode="exact")[0].float()
            with count_middle_passes(t2) as counter:
                diff = (t2(idx, mode="converged", tol=prefill_tol)[0].float() - exact).abs().max().item()
        used = counter.n
        t = interleaved(
            {m: prefill_fn(t2, idx, device, autocast, m, prefill_tol) for m in ("exact", "converged")},
            repeats,
            warmup,
            f"5/6 Jacobi prefill, {n_tokens} tokens",
        )
        result["jacobi_prefill"].append({"tokens": n_tokens, "passes": used, "max_logit_diff": diff,
                                         "exact_ms": 1e3 * statistics.median(t["exact"]["prefill"]),
                                         "converged_ms": 1e3 * statistics.median(t["converged"]["prefill"]),
                                         "ratio": ratio(t["converged"]["prefill"], t["exact"]["prefill"])})

    # tokenizer throughput
    fns, n_tokens = tokenizer_fns() if tokenizer else (None, 0)
    if fns:
        t = interleaved(fns, repeats, 1, "6/6 tokenizer")
        result["tokenizer"] = {
            "tokens": n_tokens,
            **{f"{n}_tok_s": n_tokens / statistics.median(t[n]["tokenize"]) for n in fns},
            "ratio": ratio(t["tiktoken"]["tokenize"], t["prepare_data"]["tokenize"]),
        }

    if compile:
        result["compiled"] = compiled_measurements(size, T, x, y, device, autocast, s, repeats, warmup,
                                                   gen, vocab)

    # other processes on the same cores make every op wait (OpenMP threads get descheduled): say so
    result["load_average"] = [load_before, os.getloadavg()[0]]
    result["cpu_count"] = os.cpu_count()
    v = result["variants"]
    result["t2mlr_jacobi"] = v["t2mlr"]["fwd_bwd_ratio"]
    result["t2mlr_decode"] = v["t2mlr"]["decode_ratio"]
    result["t2mlr_prefill"] = result["prefill"]["ratio"]
    result["vanilla_mfu"] = v["vanilla"]["mfu_fwd_bwd"]
    result["targets"] = {key: {"value": result[key], "bound": bound, "op": op,
                               "met": result[key] <= bound if op == "<=" else result[key] >= bound}
                         for key, _, bound, op, _ in TARGETS}
    return result


def compiled_measurements(size, T, x, y, device, autocast, s, repeats, warmup, gen, vocab):
    """--compile: fresh copies of COMPILED (the same weights), compiled as train.py compiles them; the first
    training step of each (compile included), then fwd+bwd round robin, then T²MLR's exact prefill against
    plain's, compiled."""
    models = {n: m for n, m in build_models(size, T, device).items() if n in COMPILED}
    compiled = {n: compile_model(m) for n, m in models.items()}
    # the four models of GPT share GPT.forward's code: each one's graphs count towards its recompile limit
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    out, first = {"variants": {}}, {}
    for n, m in tqdm(compiled.items(), desc="7/7 compiling (first step)"):
        m.train()
        sync(device)
        t0 = time.perf_counter()
        with autocast:
            m(x, y)[1].backward()
        sync(device)
        first[n] = time.perf_counter() - t0
        models[n].zero_grad(set_to_none=True)
    optimizers = {n: configure_optimizers(m, 0.1, 1e-5, (0.9, 0.95), device.split(":")[0])
                  for n, m in models.items()}
    fns = {n: train_step_fn(m, optimizers[n], x, y, device, autocast) for n, m in compiled.items()}
    fns["matmul"] = matmul_fn(s["matmul"], device, torch.bfloat16 if device.startswith("cuda") else torch.float32)
    t = interleaved(fns, repeats, warmup, "7/7 compiled training steps")
    mm = t.pop("matmul")["matmul"]
    for n, m in models.items():
        base = BASELINE[n]
        flops = train_flops_per_token(m, T) * x.numel()
        out["variants"][n] = {"baseline": base, "first_step_s": first[n],
                              "first_step_ratio": first[n] / first[base],
                              "fwd_bwd_ms": 1e3 * statistics.median(t[n]["fwd_bwd"]),
                              "fwd_bwd_ratio": ratio(t[n]["fwd_bwd"], t[base]["fwd_bwd"]),
                              "mfu_fwd_bwd": flops / (2 * s["matmul"] ** 3) / ratio(t[n]["fwd_bwd"], mm)}
    out["mesh_vs_base"] = ratio(t["mesh"]["fwd_bwd"], t["base"]["fwd_bwd"])
    for m in models.values():
        m.eval()
    idx = torch.randint(vocab, (s["prefill_batch"], s["prompt"]), generator=gen).to(device)
    t = interleaved({n: prefill_fn(compiled[n], idx, device, autocast) for n in ("plain", "t2mlr")}, repeats,
                    warmup + 1, "7/7 compiled exact prefill")
    out["prefill"] = {"tokens": list(idx.shape), "plain_ms": 1e3 * statistics.median(t["plain"]["prefill"]),
                      "t2mlr_exact_ms": 1e3 * statistics.median(t["t2mlr"]["prefill"]),
                      "ratio": ratio(t["t2mlr"]["prefill"], t["plain"]["prefill"])}
    return out


def markdown(r):
    """The results as markdown tables."""
    lines = [
        f"Device {r['device']}, {r['dtype']}, torch {r['torch']}; train batch {r['batch']} x {r['seq_len']} "
        "tokens; "
        f"median of {r['repeats']} interleaved rounds after {r['warmup']} warm-up; matmul peak "
        f"{r['matmul_peak_flops'] / 1e9:.1f} GFLOP/s.",
        "",
    ]
    # + 1: this process itself
    if r["device"].startswith("cpu") and max(r["load_average"]) > r["cpu_count"] + 1:
        lines += [
            f"**Warning:** load average {r['load_average'][0]:.1f} / {r['load_average'][1]:.1f} (start / "
            "end) on "
            f"{r['cpu_count']} cores: other processes share the CPU, the timings are unreliable.",
            "",
        ]
    lines += [
        "| variant | params | FLOPs/token (× base) | fwd+bwd ms (× base) | +AdamW ms (× base) | MFU fwd+bwd "
        "| "
        "memory MB (× base) | decode ms/token (× base) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, v in r["variants"].items():
        base = "" if n == v["baseline"] else f" vs {v['baseline']}"
        lines.append(
            f"| {n}{base} | {v['params'] / 1e6:.2f}M | {v['train_flops_per_token'] / 1e6:.1f}M "
            f"({v['flop_ratio']:.2f}×) | "
            f"{v['fwd_bwd_ms']:.1f} ({v['fwd_bwd_ratio']:.2f}×) | {v['step_ms']:.1f} "
            f"({v['step_ratio']:.2f}×) | "
            f"{100 * v['mfu_fwd_bwd']:.0f}% | {v['memory_mb']:.1f} ({v['memory_ratio']:.2f}×) | "
            f"{v['decode_ms_per_token']:.2f} ({v['decode_ratio']:.2f}×) |"
        )
    p = r["prefill"]
    lines += [
        "",
        f"MeSH / base recursion: fwd+bwd {r['mesh_vs_base']:.3f}×, full step {r['mesh_vs_base_step']:.3f}×. "
        f"Exact T²MLR prefill of {p['tokens'][0]} x {p['tokens'][1]} tokens: {p['t2mlr_exact_ms']:.1f} ms "
        "vs plain "
        f"{p['plain_ms']:.1f} ms ({p['ratio']:.2f}×).",
    ]
    e = r["exit_decode"]
    lines += [
        "",
        f"Decoding with exits at threshold {e['exit_threshold']:g} (loops of the core, {e['loops_full']} at full "
        "depth): " + "; ".join(f"{n} {e[n]['mean_loops']:.2f} loops per new token, {e[n]['ms_per_token']:.2f} "
                              f"ms/token ({e[n]['vs_full']:.2f}× its full depth)" for n in ("base", "mesh")) + ".",
    ]
    g = r["batched_generation"]
    lines += [
        "",
        f"| generation: {g['prompts']} prompts of {g['lengths'][0]}..{g['lengths'][1]} tokens, "
        f"{g['new_tokens']} new each (greedy) | one batch, tok/s | one at a time, tok/s | speed-up |",
        "|---|---|---|---|",
    ]
    lines += [f"| {n} | {g[n]['batched_tok_s']:.0f} | {g[n]['alone_tok_s']:.0f} | {g[n]['speedup']:.2f}× |"
              for n in GENERATION]
    o = r["jacobi_options"]
    lines += [
        "",
        f"T²MLR options against fixed D = 16 (same weights): jacobi_tol {o['tol']['jacobi_tol']:g} used "
        f"{o['tol']['passes_mean']:.1f} of 16 middle-layer passes, fwd+bwd "
        f"{o['tol']['fwd_bwd_vs_fixed']:.2f}×; "
        f"jacobi_checkpoint memory {o['checkpoint']['memory_vs_plain']:.2f}× plain "
        f"({o['checkpoint']['memory_vs_fixed']:.2f}× of fixed D), fwd+bwd "
        f"{o['checkpoint']['fwd_bwd_vs_fixed']:.2f}× of fixed D.",
        "",
        f"| parallel Jacobi prefill (tol {r['prefill_tol']:g}), batch 1 | passes used | max logit diff vs "
        "exact | "
        "exact ms | converged ms | converged / exact |",
        "|---|---|---|---|---|---|",
    ]
    for p in r["jacobi_prefill"]:
        lines.append(
            f"| {p['tokens']} tokens | {p['passes']} | {p['max_logit_diff']:.1e} | {p['exact_ms']:.1f} | "
            f"{p['converged_ms']:.1f} | {p['ratio']:.2f}× |"
        )
    if "tokenizer" in r:
        k = r["tokenizer"]
        lines.append(
            f"Tokenizer (GPT-2 BPE, pydoc, {k['tokens']:,} tokens): prepare_data "
            f"{k['prepare_data_tok_s'] / 1e6:.2f}M tok/s, "
            f"bare tiktoken encode_ordinary_batch {k['tiktoken_tok_s'] / 1e6:.2f}M tok/s ({k['ratio']:.2f}× "
            "of bare)."
        )
    if "compiled" in r:
        c = r["compiled"]
        lines += ["", "| compiled (support.runtime.compile_model) | first step s, compile included (× base) | "
                  "fwd+bwd ms (× base) | MFU fwd+bwd |", "|---|---|---|---|"]
        lines += [f"| {n} | {v['first_step_s']:.1f} ({v['first_step_ratio']:.2f}×) | {v['fwd_bwd_ms']:.1f} "
                  f"({v['fwd_bwd_ratio']:.2f}×) | {100 * v['mfu_fwd_bwd']:.0f}% |" for n, v in c["variants"].items()]
        p = c["prefill"]
        lines += ["", f"Compiled: MeSH / base recursion fwd+bwd {c['mesh_vs_base']:.3f}×; exact T²MLR prefill of "
                  f"{p['tokens'][0]} x {p['tokens'][1]} tokens {p['t2mlr_exact_ms']:.1f} ms vs plain "
                  f"{p['plain_ms']:.1f} ms ({p['ratio']:.2f}×)."]
    lines += [
        "",
        "Speed targets (our CPU goals, read from the eager measurements; a ratio is measured against the same "
        "run's plain model):",
        "",
        "| target | measured | target | met? | the T²MLR code (CPU) | why it matters |",
        "|---|---|---|---|---|---|",
    ]
    for key, desc, bound, op, why in TARGETS:
        tg = r["targets"][key]
        fmt = (lambda x: f"{100 * x:.0f}%") if key == "vanilla_mfu" else (lambda x: f"{x:.2f}×")
        ref = f"{T2MLR_CODE[key]:.2f}×" if key in T2MLR_CODE else ""
        lines.append(
            f"| {desc} | {fmt(tg['value'])} | {op} {fmt(bound)} | {'met' if tg['met'] else '**not met**'} | "
            f"{ref} | {why} |"
        )
    return "\n".join(lines)


@keeps_process_state
def main(argv=None):
    """Run the command line; returns the bench.json dict."""
    p = argparse.ArgumentParser(description="Speed and memory of every variant, interleaved in one process.")
    p.add_argument(
        "--size", choices=list(SIZES), default="tiny", help="default tiny (the T²MLR code's timings)"
    )
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1 ...")
    p.add_argument(
        "--repeats", type=int, default=7, help="measured rounds per measurement (median); default 7"
    )
    p.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first; default 2")
    p.add_argument("--batch_size", type=int, default=None, help="training batch; default per size (tiny 4)")
    p.add_argument(
        "--seq_len", type=int, default=None, help="training sequence length; default per size (tiny 256)"
    )
    p.add_argument("--no_tokenizer", action="store_true", help="skip the tokenizer measurement")
    p.add_argument(
        "--jacobi_tol", type=float, default=1e-3, help="jacobi_tol of the t2mlr_tol row; default 1e-3"
    )
    p.add_argument(
        "--prefill_tol",
        type=float,
        default=1e-4,
        help="tolerance of the parallel Jacobi prefill; default 1e-4",
    )
    p.add_argument(
        "--prefill_lengths",
        type=int,
        nargs="+",
        default=None,
        help="prompt lengths of the Jacobi prefill rows; " "default 64 256 1024",
    )
    p.add_argument("--exit_threshold", type=float, default=0.3,
                   help="the exit threshold of the decoding-with-exits rows (base, MeSH); default 0.3")
    p.add_argument("--compile", action="store_true",
                   help="also time every variant compiled (support.runtime.compile_model); minutes on a CPU")
    p.add_argument("--out", default="bench.json", help="default bench.json")
    args = p.parse_args(argv)
    t0 = time.time()
    result = run(
        args.size,
        args.device,
        args.repeats,
        args.warmup,
        args.batch_size,
        args.seq_len,
        not args.no_tokenizer,
        args.jacobi_tol,
        args.prefill_tol,
        args.prefill_lengths,
        args.exit_threshold,
        args.compile,
    )
    result["wall_s"] = time.time() - t0
    print(markdown(result))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {args.out} ({result['wall_s']:.0f} s)")
    return result


if __name__ == "__main__":
    main()
