"""
Train a GPT: vanilla, recursive with MeSH or a fixed state passing (layout "P+CRK+Q"), or T²MLR.

Single device:     python train.py config/mesh_160m.py
CPU smoke test:    python train.py config/tiny_mesh.py --device=cpu --compile=False --max_iters=20
One node, 8 GPUs:  torchrun --standalone --nproc_per_node=8 train.py config/mesh_160m.py
Two nodes:         torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --master_addr=10.0.0.1 \
                       --master_port=29500 train.py config/mesh_160m.py   (--node_rank=1 on the other)
Resume:            python train.py config/mesh_160m.py --init_from=resume
Retrofit T²MLR:    python train.py config/tiny_t2mlr.py --init_from=out/tiny_llama/ckpt.pt
                   (the weights of a trained vanilla model; the new gate starts as an exact identity)
From SmolLM2:      python train.py config/smollm2_135m_retrofit.py
                   (--init_from=hf:HuggingFaceTB/SmolLM2-135M)
Every key:         python train.py --help

Writes out_dir/ckpt.pt (the latest state, written atomically at every evaluation) and appends one JSON
row per log or evaluation step to out_dir/log.jsonl.
"""

import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import ConfigError, check_ranges, given_values, load_config
from model import GPT, GPTConfig, RENAMED_FIELDS, config_from_hf, hf_checkpoint, state_differences


# -----------------------------------------------------------------------------
# Defaults: every key of a run besides the model's (GPTConfig in model.py). Config files and
# --key=value override both (configurator.py); `python train.py --help` lists them all.

@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out"                  # ckpt.pt and log.jsonl go here
    # 'scratch' (out_dir must hold no ckpt.pt), 'resume' (all of out_dir/ckpt.pt), path/to/ckpt.pt (its
    # weights), or 'hf:<hub id or folder>' (a released Pythia/SmolLM2: config, weights; GPT.from_pretrained)
    init_from: str = "scratch"            # 'scratch', 'resume', path/to/ckpt.pt or 'hf:<hub id or folder>'
    dataset: str = "pydoc"                # reads data/<dataset>/{train,val}.bin + meta.json (prepare_data.py)
    data_dir: Optional[str] = None        # read this folder instead of data/<dataset>
    # evaluation and logging
    eval_interval: int = 250              # evaluate and checkpoint every this many steps, and at the end
    eval_iters: int = 20                  # val batches: eval_iters * batch_size fixed windows over all ranks
    # val_mode, T²MLR only: 'exact' (token by token: the true loss), 'jacobi' (D sweeps), or 'converged'
    # (parallel Jacobi sweeps until the state moves less than val_tol)
    val_mode: str = "exact"               # T²MLR only: 'exact', 'jacobi' or 'converged'
    val_tol: float = 0.0                  # val_mode 'converged': the change that stops the sweeps; 0 = exact
    log_interval: int = 10                # print and log the train loss every this many steps
    progress: bool = True                 # tqdm progress bar on rank 0 (when stderr is a terminal)
    # batch, in tokens (build-nanogpt); gradient accumulation is derived from it
    total_batch_size: int = 524288        # tokens per optimizer step, over all ranks and micro-steps
    batch_size: int = 16                  # sequences per micro-step per rank
    # optimizer and schedule, counted in optimizer steps (never micro-steps)
    max_iters: int = 5000                 # number of optimizer steps
    lr_decay_iters: Optional[int] = None  # the cosine ends here; None = max_iters (to stop early and resume)
    learning_rate: float = 6e-4           # peak LR, reached after warmup
    min_lr: float = 6e-5                  # cosine floor, reached at the last step
    warmup_iters: int = 200               # linear warmup steps
    weight_decay: float = 0.1             # AdamW, on >= 2-D tensors only
    beta1: float = 0.9                    # AdamW β1
    beta2: float = 0.95                   # AdamW β2
    grad_clip: float = 1.0                # clip the global grad norm to this; 0 = off (the norm is logged)
    # system
    device: str = "auto"                  # 'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
    dtype: str = "auto"                   # 'auto' (bf16 on CUDA if supported, else fp32), float32, bfloat16
    compile: Optional[bool] = None        # torch.compile; None = on for CUDA only
    seed: int = 1337                      # model init, global RNGs and the data sampler (same on every rank)
    peak_flops: Optional[float] = None    # peak FLOP/s of one device, for MFU; None = table for known GPUs

    def __post_init__(self):
        if not (self.init_from in ("scratch", "resume") or self.init_from.endswith(".pt")
                or (self.init_from.startswith("hf:") and len(self.init_from) > 3)):
            raise ValueError(
                f"init_from {self.init_from!r} is not 'scratch', 'resume', a checkpoint path ending in .pt "
                f"or 'hf:<hub id or folder>'"
            )
        choices = {"val_mode": ("exact", "jacobi", "converged"),
                   "dtype": ("auto", "float32", "bfloat16", "float16")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name} {getattr(self, name)!r} is not one of {', '.join(map(repr, allowed))}"
                )
        check_ranges(self, TRAIN_RANGES)
        if self.min_lr > self.learning_rate:
            raise ValueError(f"min_lr = {self.min_lr} must be <= learning_rate = {self.learning_rate}")


# The valid range of every numeric field of TrainConfig (configurator.check_ranges: None passes, nan and
# inf never). seed: what np.random.seed accepts.
TRAIN_RANGES = {
    "eval_interval": ">= 1",
    "eval_iters": ">= 1",
    "log_interval": ">= 1",
    "total_batch_size": ">= 1",
    "batch_size": ">= 1",
    "max_iters": ">= 0",
    "lr_decay_iters": ">= 1",
    "learning_rate": ">= 0",
    "min_lr": ">= 0",
    "warmup_iters": ">= 0",
    "weight_decay": ">= 0",
    "beta1": "[0, 1)",
    "beta2": "[0, 1)",
    "grad_clip": ">= 0",
    "seed": "[0, 4294967295]",
    "peak_flops": "> 0",
    "val_tol": "[0, 1)",
}


class RunError(RuntimeError):
    """A problem with the data, a checkpoint or the run itself; printed as one line `error: ...`."""


# Dense bf16 tensor-core peak FLOP/s per GPU, matched against torch.cuda.get_device_name() in this
# order (so "H100 PCIe" before "H100", "L40S" before "L4"). With dtype=float32 MFU reads low.
PEAK_FLOPS = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
}


def grad_accum_steps(total_batch_size, batch_size, block_size, world_size):
    """Micro-steps per optimizer step so that one step sees exactly total_batch_size tokens.
    Raises ConfigError, showing the numbers, when total_batch_size is not a multiple of the tokens
    of one micro-step over all ranks."""
    per_micro = batch_size * block_size * world_size
    if total_batch_size < per_micro or total_batch_size % per_micro:
        raise ConfigError(
            f"total_batch_size = {total_batch_size} tokens is not a multiple of batch_size * block_size"
            f" * world_size = {batch_size} * {block_size} * {world_size} = {per_micro}"
        )
    return total_batch_size // per_micro


# -----------------------------------------------------------------------------
# Device and precision

def resolve_device(name, local_rank=None):
    """'auto' -> the best available device; under DDP plain 'cuda' becomes this rank's GPU
    'cuda:<local_rank>'."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    return name


def resolve_dtype(name, device_type):
    """The autocast dtype: 'auto' = bf16 on CUDA when supported, else fp32 (CPU/MPS: fp32 is the safe
    default). fp16 needs a GradScaler and is CUDA-only; asking for it elsewhere raises ConfigError."""
    if name == "auto":
        return torch.bfloat16 if device_type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    if name == "float16" and device_type != "cuda":
        raise ConfigError(
            "dtype 'float16' needs CUDA (it trains with a GradScaler); use bfloat16 or float32 on "
            f"{device_type}"
        )
    return getattr(torch, name)


def autocast_context(device_type, dtype):
    """Mixed precision for the forward pass; a no-op in fp32. The model computes the loss in fp32."""
    return nullcontext() if dtype == torch.float32 else torch.autocast(device_type, dtype=dtype)


# -----------------------------------------------------------------------------
# Data: flat token files from prepare_data.py, read through np.memmap

def prepare_command(data_dir, tokenizer=None):
    """The prepare_data.py command that writes data_dir (= OUT_DIR/NAME), with `tokenizer` (e.g. a released
    model's 'hf:...') when the run needs one other than the default."""
    parent, name = os.path.split(os.path.normpath(data_dir))
    source = {"pydoc": "--source pydoc --tokenizer byte", "fineweb_edu": "--source fineweb-edu"}.get(
        name, f"--input <your files> --name {name}")
    if tokenizer:
        source = source.replace(" --tokenizer byte", "") + f" --tokenizer {tokenizer}"
    return f"python prepare_data.py {source}" + (f" --out_dir {parent or '.'}" if parent != "data" else "")


def load_meta(data_dir, block_size, tokenizer=None):
    """Read data_dir/meta.json and check both splits against it.
    Raises RunError when the folder or meta.json is missing (naming the prepare command), when a .bin
    file's size disagrees with meta.json (incomplete data), when the vocabulary does not fit the token
    dtype, or when a split is shorter than block_size + 1."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):        # prepare_data.py deletes it first and writes it last
        interrupted = os.path.isdir(data_dir) and any(f.endswith(".tmp") for f in os.listdir(data_dir))
        raise RunError(
            f"no {path}"
            + (" (an interrupted prepare_data.py run left *.tmp files)" if interrupted else "")
            + f": prepare the data first with `{prepare_command(data_dir, tokenizer)}`"
        )
    with open(path) as f:
        meta = json.load(f)
    itemsize = np.dtype(meta["dtype"]).itemsize
    if meta["vocab_size"] > 2 ** (8 * itemsize):   # ids >= 2**bits would have wrapped around when written
        raise RunError(
            f"vocab_size {meta['vocab_size']} does not fit {meta['dtype']} tokens (ids up to "
            f"{2 ** (8 * itemsize) - 1}); re-run `{prepare_command(data_dir)}`, which picks uint32"
        )
    for split in ("train", "val"):
        bin_path, n = os.path.join(data_dir, f"{split}.bin"), meta[f"{split}_tokens"]
        size = os.path.getsize(bin_path) if os.path.exists(bin_path) else 0
        if size != n * itemsize:
            raise RunError(
                f"{bin_path} has {size} bytes but meta.json says {n} tokens x {itemsize} bytes: the data "
                f"is incomplete, re-run `{prepare_command(data_dir)}`"
            )
        if n < block_size + 1:          # one window needs block_size inputs plus the next token as target
            raise RunError(f"the {split} split has {n} tokens, fewer than block_size + 1 = {block_size + 1}")
    return meta


def random_starts(n_tokens, block_size, batch_size, generator):
    """batch_size window starts drawn uniformly from [0, n_tokens - block_size - 1]: the targets of the
    last window end at start + block_size = n_tokens - 1, the final token."""
    return torch.randint(n_tokens - block_size, (batch_size,), generator=generator).tolist()


def step_starts(n_tokens, block_size, batch_size, grad_accum, world_size, rank, generator):
    """This rank's window starts for one optimizer step: grad_accum lists of batch_size. Every rank draws the
    whole global batch of the step from the same generator state, then takes its share: micro-step m of rank
    r is global micro-batch m * world_size + r. So a step sees the same windows whatever the world size
    (2 ranks x 2 micro-steps = 1 process x 4), and the data position is one state, equal on all ranks."""
    starts = random_starts(n_tokens, block_size, grad_accum * world_size * batch_size, generator)
    return [starts[(m * world_size + rank) * batch_size:][:batch_size] for m in range(grad_accum)]


def val_starts(n_tokens, block_size, n_windows):
    """n_windows evenly strided window starts from 0 to n_tokens - block_size - 1, both included. They are
    fixed, so every run and every variant is scored on the same tokens."""
    last = n_tokens - block_size - 1
    return [i * last // max(n_windows - 1, 1) for i in range(n_windows)]


def get_batch(path, dtype, starts, block_size, device):
    """Inputs x and targets y, both (len(starts), block_size) int64 on device; y is x shifted by one token."""
    # Re-open the memmap for every batch to avoid a memory leak, as nanoGPT does:
    # https://stackoverflow.com/questions/45132940/numpy-memmap-memory-usage-want-to-iterate-once/61472122
    data = np.memmap(path, dtype=dtype, mode="r")
    x = torch.stack([torch.from_numpy(data[s:s + block_size].astype(np.int64)) for s in starts])
    y = torch.stack([torch.from_numpy(data[s + 1:s + 1 + block_size].astype(np.int64)) for s in starts])
    if device.startswith("cuda"):       # pinned memory lets the copy overlap with compute
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


# -----------------------------------------------------------------------------
# Schedule and evaluation

def get_lr(step, cfg):
    """Learning rate of optimizer step `step` (0-based): linear warmup from learning_rate/(warmup_iters+1)
    (never 0), then cosine from learning_rate at step warmup_iters down to min_lr at step L - 1,
    L = lr_decay_iters or max_iters; min_lr beyond. No zero-length span divides: warmup_iters = 0 starts
    at the peak, warmup_iters >= L never decays. A run stopped early on the schedule of L and resumed
    follows the uninterrupted run's LRs."""
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    decay_end = cfg.lr_decay_iters or cfg.max_iters
    progress = min(1.0, (step - cfg.warmup_iters) / max(1, decay_end - 1 - cfg.warmup_iters))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.learning_rate - cfg.min_lr)


@torch.no_grad()
def evaluate(model, path, dtype, starts, batch_size, block_size, device, autocast, mode=None, tol=0.0):
    """Mean loss per token over the windows `starts` (this rank's share), summed over all ranks when
    distributed, so the value does not depend on the world size. mode and tol are passed to T²MLR models."""
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, device=device)             # (sum of token losses, number of tokens)
    for i in range(0, len(starts), batch_size):
        x, y = get_batch(path, dtype, starts[i:i + batch_size], block_size, device)
        with autocast:
            _, loss = model(x, y, mode=mode, tol=tol)
        totals[0] += loss.float() * y.numel()
        totals[1] += y.numel()
    if dist.is_initialized():
        dist.all_reduce(totals)
    model.train(was_training)
    return (totals[0] / totals[1]).item()


# -----------------------------------------------------------------------------
# Checkpoints: plain dicts of tensors and Python values, so torch.load(weights_only=True) reads them

def rng_states(data_gen):
    """This process's RNG states (torch, CUDA, numpy, Python, data) as tensors, lists and ints."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
        "python": random.getstate(),
        "data": data_gen.get_state(),
    }


def set_rng_states(states, data_gen):
    """Restore what rng_states() captured."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])
    data_gen.set_state(states["data"])


def save_checkpoint(path, ckpt):
    """Write ckpt to a temporary file, then rename it over `path`: a process killed mid-write never leaves a
    truncated ckpt.pt (os.replace is atomic on one file system). fsync before the rename, so that after a
    machine crash the new name never points at data still in the page cache."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path):
    """The checkpoint dict at `path`, on the CPU. Raises RunError naming the path if it is missing or
    unreadable."""
    if not os.path.isfile(path):
        raise RunError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    # truncated or foreign files fail in many ways (EOFError, UnpicklingError, ...)
    except Exception as e:
        raise RunError(
            f"cannot read checkpoint {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        )
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("model"), dict)):
        raise RunError(f"{path} is not a checkpoint of train.py: it has no 'model' state dict")
    ckpt["model"] = clean_state_dict(ckpt["model"], path)
    if isinstance(ckpt.get("model_config"), dict):       # fields renamed since the checkpoint was written
        ckpt["model_config"] = {RENAMED_FIELDS.get(k, k): v for k, v in ckpt["model_config"].items()}
    return ckpt


# Wrapped models save every key with a prefix: torch.compile `_orig_mod.`, DDP and DataParallel `module.`.
# train.py saves the raw model, but other nanoGPT-style tools save the wrapper's state dict.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def clean_state_dict(state, path):
    """The state dict `state` of the checkpoint at `path` with the WRAPPER_PREFIXES, in any nesting (e.g.
    `module._orig_mod.`), removed from every key. load_checkpoint applies it, so every loader (resume,
    --init_from=x.pt, sample.py, probe.py) reads the same keys. Raises RunError when two keys become one."""
    clean = {}
    for key, value in state.items():
        name = key
        while name.startswith(WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        if name in clean:
            raise RunError(
                f"{path} holds {name} twice (once as {key}): it is not the state dict of one model"
            )
        clean[name] = value
    return clean


def tie_embeddings_state(state, model, path):
    """`state` made to fit how `model` ties its output head to the token embedding (tie_embeddings).

    A tied model holds ONE tensor, wte.weight = lm_head.weight, so it can take the checkpoint's head only
    when that equals its embedding (a tied checkpoint) or is absent (a tied model saved without the
    duplicate; the head is then wte.weight, for a tied or an untied model alike). An untied checkpoint
    with its own head cannot be mapped exactly into a tied model: RunError naming --tie_embeddings=False.
    A tied checkpoint maps exactly into an untied model: both tensors get its values. Returns a dict."""
    wte, head = state.get("wte.weight"), state.get("lm_head.weight")
    if wte is None:
        return state
    if head is None:
        return {**state, "lm_head.weight": wte}
    if model.cfg.tie_embeddings and wte.shape == head.shape and not torch.equal(wte, head):
        raise RunError(
            f"{path} has an output head lm_head.weight that differs from its token embedding wte.weight "
            f"(an untied model), but this model ties them (tie_embeddings=True) into one tensor that "
            f"cannot hold both: set --tie_embeddings=False"
        )
    return state


def load_weights(model, state, path):
    """Copy every tensor of the state dict `state` (from the checkpoint at `path`) into `model`, with the
    embedding tie mapped by tie_embeddings_state. Raises RunError naming missing, unexpected or differently
    shaped tensors."""
    state = tie_embeddings_state(state, model, path)
    problems = state_differences(state, model.state_dict())
    if problems:
        more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise RunError(f"{path} does not fit this model: " + "; ".join(problems[:5]) + more)
    model.load_state_dict(state)


def load_model(path, device="cpu"):
    """(model in eval mode on device, checkpoint dict) from the train.py checkpoint at `path`, for sample.py
    and probe.py. Raises RunError when the file is missing, unreadable, or does not fit this model.py."""
    ckpt = load_checkpoint(path)
    try:
        model = GPT(GPTConfig(**ckpt["model_config"]))
    except (KeyError, TypeError, ValueError) as e:   # a checkpoint from another version or tool
        raise RunError(f"{path} does not fit this model.py: {type(e).__name__}: {' '.join(str(e).split())}")
    load_weights(model, ckpt["model"], path)
    return model.to(device).eval(), ckpt


def init_weights_from(model, path):
    """Load the weights of the checkpoint at `path` into `model`, e.g. a trained vanilla model into a T²MLR
    model of the same shape (a retrofit). Parameters the checkpoint lacks keep their initialisation only if
    they belong to the T²MLR gate, which starts as an exact identity (θ = 0), so the first forward equals
    the source model's; the embedding tie is mapped exactly or refused (tie_embeddings_state). Raises
    RunError naming missing, unexpected or differently shaped tensors, or a tie that cannot be mapped."""
    source = tie_embeddings_state(load_checkpoint(path)["model"], model, path)
    problems = state_differences(source, model.state_dict(), lambda k: k.startswith("gate."))   # gate: x' = x
    if problems:
        raise RunError(f"cannot initialise from {path}, the architectures differ: " + "; ".join(problems[:5]))
    model.load_state_dict(source, strict=False)


def train_config_from_checkpoint(ckpt, cfg, given):
    """The TrainConfig of a resumed run: the checkpoint's data, batch and schedule settings, overridden by
    the keys given again (`given`, load_config's record of the keys set in a config file or on the
    command line, whatever their value), so a resume without the config file continues the same run
    instead of falling back to the defaults. This launch's own system settings (out_dir, device, dtype,
    compile, progress) always apply. cfg: this launch's TrainConfig. Raises ConfigError when a given
    value does not fit the checkpoint's others (e.g. a learning_rate below its min_lr)."""
    system = ("init_from", "out_dir", "device", "dtype", "compile", "progress")
    stored = {k: v for k, v in ckpt["train_config"].items() if k not in system}
    try:
        return TrainConfig(**{**asdict(cfg), **stored, **given_values(given, cfg)})
    except ValueError as e:
        raise ConfigError(f"{e} (with the checkpoint's other settings)") from None


def model_config_from_checkpoint(ckpt, model_cfg, given):
    """GPTConfig stored in ckpt. The keys the user set (`given`, load_config's record, whatever their value)
    must agree with it, keys not given are not compared; otherwise RunError names every differing key and
    the first differing tensor shapes. model_cfg: this launch's GPTConfig."""
    if "model_config" not in ckpt:
        raise RunError("the checkpoint has no model_config: only a checkpoint of train.py can be resumed")
    stored = ckpt["model_config"]
    diff = [
        f"{k} (given {v!r}, checkpoint {stored.get(k)!r})"
        for k, v in given_values(given, model_cfg).items()
        if stored.get(k) != v
    ]
    if diff:
        try:                                        # the checkpoint's config with the given keys applied...
            asked = GPTConfig(**{**stored, **given_values(given, model_cfg)})
        except (TypeError, ValueError):             # ...or, where they do not combine, this launch's own
            asked = model_cfg
        with torch.device("meta"):                  # its shapes, without allocating
            shapes = state_differences(ckpt["model"], GPT(asked).state_dict(), optional=lambda k: True)
        more = f" and {len(shapes) - 4} more" if len(shapes) > 4 else ""
        raise RunError(
            "the model config differs from the checkpoint's in "
            + ", ".join(diff)
            + (
                f"; tensor shapes (checkpoint vs given): {', '.join(shapes[:4])}{more}"
                if shapes
                else "; the tensor shapes agree"
            )
        )
    try:
        return GPTConfig(**stored)
    except (TypeError, ValueError) as e:
        raise RunError(f"the checkpoint's model config does not fit this model.py: {e}")


def launch_model_config(keys, init_from):
    """(GPTConfig, weight files) of this launch: the model keys given (load_config's deferred dict) on the
    defaults, with no weight files; or, for init_from 'hf:<hub id or folder>', on the released model's
    config.json (model.config_from_hf), with its safetensors files. Raises ConfigError for an invalid
    config, RunError for a released model that cannot be found or mapped."""
    if not init_from.startswith("hf:"):
        try:
            return GPTConfig(**keys), None
        except ValueError as e:                       # e.g. n_embd must divide by n_head
            raise ConfigError(str(e)) from None
    try:
        hf_config, weight_files = hf_checkpoint(init_from[3:])
        return config_from_hf(hf_config, **keys), weight_files
    except ValueError as e:
        raise RunError(f"--init_from={init_from}: {e}") from None


# -----------------------------------------------------------------------------
# The run: setup, then per step evaluate_and_save (every eval_interval) and train_step

@dataclass
class Run:
    """Everything a training run carries from step to step (built by setup)."""
    cfg: TrainConfig
    model_cfg: GPTConfig
    ddp: bool                             # launched by torchrun
    rank: int
    world_size: int
    master: bool                          # rank 0 prints, logs and writes checkpoints
    device: str
    device_type: str                      # cuda, mps and cpu differ in autocast, pinning, fused AdamW
    autocast: object                      # the mixed-precision context of forward passes
    ckpt_path: str
    log_path: str
    resumed: bool
    grad_accum: int                       # micro-steps per optimizer step on each rank
    meta: dict                            # the data's meta.json
    train_path: str
    val_path: str
    data_dtype: object
    val_windows: list                     # this rank's fixed val windows
    train_mode: Optional[str]             # T²MLR: "jacobi" (D sweeps); None for the other models
    val_mode: Optional[str]               # T²MLR: cfg.val_mode; None for the other models
    val_label: str
    data_gen: torch.Generator             # the data order (the same on every rank: see step_starts)
    raw_model: GPT                        # never compiled or wrapped: saved, evaluated exactly
    model: torch.nn.Module                # what trains: compiled and/or DDP-wrapped raw_model
    eval_model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    start_step: int
    best_val: float
    flops_per_token: float
    peak: Optional[float]                 # FLOP/s of one device, for MFU

    def log(self, row, text):
        """Print `text` and append `row` to log.jsonl (rank 0 only)."""
        if self.master:
            tqdm.write(text)
            with open(self.log_path, "a") as f:
                f.write(json.dumps(row) + "\n")


def main(argv):
    """Train as configured by argv (config files and --key=value). Raises ConfigError or RunError."""
    run = setup(argv)
    cfg = run.cfg
    bar = tqdm(
        total=cfg.max_iters, initial=run.start_step, unit="step",
        disable=not (run.master and cfg.progress and sys.stderr.isatty()),
    )
    t_start, eval_seconds, n_evals = time.time(), 0.0, 0
    # exactly max_iters optimizer steps, then a final evaluation and save
    for step in range(run.start_step, cfg.max_iters + 1):
        last = step == cfg.max_iters
        # evaluate and save after `step` updates; the step a run resumed from was evaluated already
        if last or (step % cfg.eval_interval == 0 and (step > run.start_step or not run.resumed)):
            t_eval = time.time()
            evaluate_and_save(run, step)
            eval_seconds, n_evals = eval_seconds + time.time() - t_eval, n_evals + 1
        if last:
            break
        logged = step % cfg.log_interval == 0 or step == cfg.max_iters - 1
        row = train_step(run, step, logged)
        bar.update()
        if logged:
            # ETA: the mean step times the steps left, plus the mean evaluation times the evaluations left
            # (the multiples of eval_interval still ahead, and the final one)
            per_step = (time.time() - t_start - eval_seconds) / (step + 1 - run.start_step)
            evals_left = (cfg.max_iters - 1) // cfg.eval_interval - step // cfg.eval_interval + 1
            eta = per_step * (cfg.max_iters - step - 1) + eval_seconds / max(n_evals, 1) * evals_left
            run.log(
                row,
                f"step {step}: loss {row['loss']:.4f}, lr {row['lr']:.3g}, grad norm {row['grad_norm']:.3f}, "
                f"{row['ms']:.0f} ms, {row['tok_s']:,.0f} tok/s, "
                + (f"MFU {100 * row['mfu']:.1f}%" if run.peak else f"{row['flops'] / 1e12:.3g} TFLOP/s")
                + (f", Jacobi passes {row['jacobi_passes']:.2f}" if run.model_cfg.t2mlr else "")
                + f", ETA {eta / 60:.1f} min",
            )
    bar.close()
    if run.master:
        print(
            f"done: {cfg.max_iters} steps, best {run.val_label} {run.best_val:.4f}, checkpoint "
            f"{run.ckpt_path}"
        )
    if run.ddp:
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        # after a clean run gloo sometimes aborts at interpreter teardown; exiting now avoids it
        os._exit(0)


def setup(argv) -> Run:
    """Config, distributed setup, data, model and optimizer (and, with --init_from=resume, the whole saved
    state). Every check runs before anything is written. Raises ConfigError or RunError."""
    # ---- config and distributed setup ----------------------------------------------------------------
    (model_keys, cfg), given = load_config(argv, GPTConfig, TrainConfig, defer=(GPTConfig,))
    model_cfg, hf_weights = launch_model_config(model_keys, cfg.init_from)
    ddp = "RANK" in os.environ                        # set by torchrun
    rank, local_rank, world_size = (
        (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")) if ddp else (0, 0, 1)
    )
    master = rank == 0
    device = resolve_device(cfg.device, local_rank if ddp else None)
    device_type = device.split(":")[0]
    if ddp:
        if device_type == "cuda":
            torch.cuda.set_device(device)
        # gloo makes DDP testable on CPU
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    ptdtype = resolve_dtype(cfg.dtype, device_type)
    autocast = autocast_context(device_type, ptdtype)
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    ckpt_path, log_path = os.path.join(cfg.out_dir, "ckpt.pt"), os.path.join(cfg.out_dir, "log.jsonl")
    resumed = cfg.init_from == "resume"
    ckpt = load_checkpoint(ckpt_path) if resumed else None
    # the architecture and the run's settings come from the checkpoint
    if resumed:
        model_cfg = model_config_from_checkpoint(ckpt, model_cfg, given)
        cfg = train_config_from_checkpoint(ckpt, cfg, given)
    T = model_cfg.block_size
    grad_accum = grad_accum_steps(cfg.total_batch_size, cfg.batch_size, T, world_size)

    # ---- data ----------------------------------------------------------------------------------------
    data_dir = cfg.data_dir or os.path.join("data", cfg.dataset)
    meta = load_meta(data_dir, T, cfg.init_from if hf_weights else None)
    if meta["vocab_size"] > model_cfg.vocab_size:
        raise RunError(
            f"the data's vocab_size {meta['vocab_size']} (meta.json) exceeds the model's vocab_size "
            f"{model_cfg.vocab_size}; set vocab_size >= {meta['vocab_size']}"
        )
    if hf_weights and not meta["tokenizer"].startswith("hf:"):
        raise RunError(
            f"{data_dir} holds {meta['tokenizer']} tokens, but a released model reads its own: prepare the "
            f"data with `prepare_data.py --tokenizer {cfg.init_from}`"
        )
    if resumed and "tokenizer" not in ckpt:             # e.g. an s5_retrieval.py run
        raise RunError(f"{ckpt_path} names no tokenizer: it is not a checkpoint of train.py")
    if resumed and ckpt["tokenizer"] != meta["tokenizer"]:
        raise RunError(f"{data_dir} holds {meta['tokenizer']} tokens but the checkpoint was trained on "
                       f"{ckpt['tokenizer']} tokens; resume with the run's dataset")
    # the fixed val windows, dealt out to the ranks; evaluate() sums over ranks
    val_windows = val_starts(meta["val_tokens"], T, cfg.eval_iters * cfg.batch_size)[rank::world_size]
    train_mode = "jacobi" if model_cfg.t2mlr else None   # T²MLR trains by parallel Jacobi sweeps
    val_mode = cfg.val_mode if model_cfg.t2mlr else None
    val_label = (
        f"val loss ({cfg.val_mode}" + (f", tol {cfg.val_tol:g})" if cfg.val_mode == "converged" else ")")
        if model_cfg.t2mlr
        else "val loss"
    )
    # Last of the checks, all before anything is written: a relaunch that forgot --init_from=resume must not
    # wipe a run.
    if not resumed and os.path.exists(ckpt_path):
        raise RunError(f"{ckpt_path} exists: continue it with --init_from=resume, or choose another out_dir")

    # ---- model and optimizer ---------------------------------------------------------------------------
    torch.manual_seed(cfg.seed)       # the same init, and the same global RNG stream, on every rank
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    data_gen = torch.Generator().manual_seed(cfg.seed)   # identical on all ranks: see step_starts
    raw_model = GPT(model_cfg).to(device)
    # fill the rotary table cache (model.GPT.rotary) now: filled inside torch.compile's trace, it would
    # recompile once
    raw_model.rotary(0, 1, torch.float32, raw_model.wte.weight.device)
    optimizer = raw_model.configure_optimizers(
        cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type
    )
    scaler = torch.amp.GradScaler("cuda", enabled=ptdtype == torch.float16)   # a no-op unless fp16
    start_step, best_val = 0, math.inf
    if resumed:                                       # everything, so the run continues as if never stopped
        load_weights(raw_model, ckpt["model"], ckpt_path)
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        start_step, best_val = ckpt["step"], ckpt["best_val_loss"]
        if len(ckpt["rng"]) != world_size:           # another world size cannot replay the same batches
            raise RunError(f"{ckpt_path} was written by {len(ckpt['rng'])} ranks, this run has {world_size}")
        set_rng_states(ckpt["rng"][rank], data_gen)
        del ckpt                                      # free the host copy of the weights
    elif cfg.init_from.endswith(".pt"):               # new run, weights from another (e.g. a T²MLR retrofit)
        init_weights_from(raw_model, cfg.init_from)
    # new run from a released model (the T²MLR paper's §3.4 retrofit)
    elif hf_weights:
        try:
            raw_model.load_hf_weights(hf_weights)
        except ValueError as e:
            raise RunError(f"--init_from={cfg.init_from}: {e}") from None
    use_compile = device_type == "cuda" if cfg.compile is None else cfg.compile
    compiled = torch.compile(raw_model) if use_compile else raw_model
    # Every parameter gets a gradient on every step (MeSH routers and T²MLR gates always run), so DDP
    # needs no find_unused_parameters.
    model = DDP(compiled, device_ids=[local_rank] if device_type == "cuda" else None) if ddp else compiled
    # The exact T²MLR forward loops over tokens in Python; compiling it would unroll T steps.
    eval_model = compiled if val_mode == "jacobi" else raw_model
    flops_per_token = raw_model.train_flops_per_token()
    peak = cfg.peak_flops or (
        next((v for k, v in PEAK_FLOPS.items() if k in torch.cuda.get_device_name(device)), None)
        if device_type == "cuda"
        else None
    )
    if master:
        counts = raw_model.param_counts()
        os.makedirs(cfg.out_dir, exist_ok=True)
        print(f"config (given): {given_values(given, model_cfg, cfg)}")
        print(
            f"device {device}, dtype {str(ptdtype).removeprefix('torch.')}, compile {use_compile}, world "
            f"size {world_size}"
        )
        print(f"params: total {counts['total']:,}, non-embedding {counts['non_embedding']:,}, unrolled depth "
              f"{model_cfg.n_unrolled} layers, {flops_per_token:.3g} train FLOPs/token")
        print(
            f"batch: {cfg.total_batch_size:,} tokens/step = {cfg.batch_size} seqs x {T} tokens x "
            f"{world_size} ranks"
            f" x {grad_accum} accumulation steps; data {data_dir} ({meta['train_tokens']:,} train tokens)"
        )
        print(
            f"MFU against {peak:.3g} FLOP/s per device"
            if peak
            else "MFU n/a: pass --peak_flops=<FLOP/s of one device>"
        )
        with open(log_path, "a" if resumed else "w") as f:  # a resumed run appends, never truncates
            f.write(json.dumps({"step": start_step, "init_from": cfg.init_from, "world_size": world_size,
                                "model_config": asdict(model_cfg), "train_config": asdict(cfg)}) + "\n")
    return Run(
        cfg=cfg,
        model_cfg=model_cfg,
        ddp=ddp,
        rank=rank,
        world_size=world_size,
        master=master,
        device=device,
        device_type=device_type,
        autocast=autocast,
        ckpt_path=ckpt_path,
        log_path=log_path,
        resumed=resumed,
        grad_accum=grad_accum,
        meta=meta,
        train_path=os.path.join(data_dir, "train.bin"),
        val_path=os.path.join(data_dir, "val.bin"),
        data_dtype=np.dtype(meta["dtype"]),
        val_windows=val_windows,
        train_mode=train_mode,
        val_mode=val_mode,
        val_label=val_label,
        data_gen=data_gen,
        raw_model=raw_model,
        model=model,
        eval_model=eval_model,
        optimizer=optimizer,
        scaler=scaler,
        start_step=start_step,
        best_val=best_val,
        flops_per_token=flops_per_token,
        peak=peak,
    )


def evaluate_and_save(run: Run, step: int):
    """The val loss after `step` updates (logged), then the whole state to ckpt.pt (atomically, rank 0)."""
    cfg = run.cfg
    val_loss = evaluate(run.eval_model, run.val_path, run.data_dtype, run.val_windows, cfg.batch_size,
                        run.model_cfg.block_size, run.device, run.autocast, run.val_mode, cfg.val_tol)
    run.best_val = min(run.best_val, val_loss)
    gathered = [(rng_states(run.data_gen), val_loss)] * run.world_size
    # rank 0 saves every rank's RNGs and logs every rank's val loss
    if run.ddp:
        dist.all_gather_object(gathered, gathered[run.rank])
    run.log({"step": step, "val_loss": val_loss, "val_mode": run.val_mode, "best_val_loss": run.best_val}
            | ({"val_tol": cfg.val_tol} if run.val_mode == "converged" else {})
            | ({"val_loss_by_rank": [g[1] for g in gathered]} if run.ddp else {}),
            f"step {step}: {run.val_label} {val_loss:.4f} (best {run.best_val:.4f})")
    if run.master:
        save_checkpoint(
            run.ckpt_path,
            {
                "model": run.raw_model.state_dict(),
                "optimizer": run.optimizer.state_dict(),
                "scaler": run.scaler.state_dict(),
                "step": step,
                "best_val_loss": run.best_val,
                "val_loss": val_loss,
                "rng": [g[0] for g in gathered],
                "model_config": asdict(run.model_cfg),
                "train_config": asdict(cfg),
                "tokenizer": run.meta["tokenizer"],
            },
        )


def train_step(run: Run, step: int, logged: bool) -> Optional[dict]:
    """One optimizer step: grad_accum micro-steps of forward and backward, gradient clipping, the update.
    Returns the log row when `logged` (loss, lr, grad norm, time, throughput; T²MLR: mean middle-layer
    passes), else None: only a logged step syncs the device for its timing and reads the grad norm.
    Raises RunError, before the update, when the loss is not finite."""
    cfg, model, optimizer, scaler = run.cfg, run.model, run.optimizer, run.scaler
    t0 = time.time()
    lr = get_lr(step, cfg)
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=run.device)    # summed on the device: no host sync per micro-step
    # T²MLR: middle-layer passes per micro-step (< D with jacobi_tol)
    passes = 0
    T = run.model_cfg.block_size
    starts = step_starts(
        run.meta["train_tokens"], T, cfg.batch_size, run.grad_accum, run.world_size, run.rank, run.data_gen
    )
    for micro in range(run.grad_accum):
        x, y = get_batch(run.train_path, run.data_dtype, starts[micro], T, run.device)
        # DDP arms its gradient all-reduce during the forward pass, so whether this micro-step syncs
        # is decided before it: only the last one does, and no_sync wraps forward AND backward.
        with model.no_sync() if run.ddp and micro < run.grad_accum - 1 else nullcontext():
            with run.autocast:
                _, loss = model(x, y, mode=run.train_mode)
            loss_sum += loss.detach()
            passes += getattr(run.raw_model, "jacobi_passes", 0)
            scaler.scale(loss / run.grad_accum).backward()
    if run.ddp:
        dist.all_reduce(loss_sum)
        loss_sum /= run.world_size
    train_loss = loss_sum / run.grad_accum            # the exact mean over all micro-steps and ranks
    # One host sync per step: a NaN/inf loss (the same on every rank after the all-reduce) stops the
    # run before the update, leaving ckpt.pt at the last good evaluation.
    if not torch.isfinite(train_loss):
        raise RunError(
            f"non-finite train loss {train_loss.item()} at step {step}; stopped before the update, "
            f"{run.ckpt_path} holds the last good state"
        )
    scaler.unscale_(optimizer)                        # clip the true gradients, not fp16-scaled ones
    grad_norm = torch.nn.utils.clip_grad_norm_(
        run.raw_model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf
    )
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    if not logged:
        return None
    if run.device_type == "cuda":
        torch.cuda.synchronize()
    dt = time.time() - t0
    tok_s = cfg.total_batch_size / dt
    flops = run.flops_per_token * tok_s / run.world_size   # achieved FLOP/s per device
    row = {"step": step, "loss": train_loss.item(), "lr": lr, "grad_norm": grad_norm.item(), "ms": 1000 * dt,
           "tok_s": tok_s, "flops": flops, "mfu": flops / run.peak if run.peak else None}
    if run.model_cfg.t2mlr:
        # mean middle-layer passes per micro-step (D, +1 with the plain start, fewer where jacobi_tol stopped)
        row["jacobi_passes"] = passes / run.grad_accum
    return row


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ConfigError, RunError) as e:
        sys.exit(f"error: {e}")
