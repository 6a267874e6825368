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
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from configurator import ConfigError, check_ranges, given_values, load_config
from model import GPT, GPTConfig
from support.accounting import count_middle_passes, param_counts, train_flops_per_token
from support.checkpoints import init_weights_from, load_checkpoint, recorded_tokenizer, rng_states, state_differences
from support.data import get_batch, load_meta, step_starts, val_starts
from support.loop import Trainer, evaluate, make_trainer, optimizer_step, resume, run_steps, save_state
from support.pretrained import config_from_hf, hf_checkpoint, load_hf_weights
from support.runtime import RunError, peak_flops, resolve_device, resolve_dtype


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
    gate_lr_multiplier: float = 1.0       # T²MLR: the gate's parameters (W_p, A, b, θ) at this times the LR
    # train_mode, T²MLR only (the other models ignore it, as val_mode): 'jacobi' (D parallel sweeps; exact at
    # positions < D) or 'exact' (the recurrence token by token with autograd: every position's state exact,
    # the middle layers once per token)
    train_mode: str = "jacobi"            # T²MLR only: 'jacobi' or 'exact'
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
        choices = {"val_mode": ("exact", "jacobi", "converged"), "train_mode": ("jacobi", "exact"),
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
    "gate_lr_multiplier": "> 0",
    "seed": "[0, 4294967295]",
    "peak_flops": "> 0",
    "val_tol": "[0, 1)",
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
# The config, settled in one pass before anything is built

@dataclass
class Settled:
    """A run's final configuration (settle_config)."""
    model_cfg: GPTConfig
    cfg: TrainConfig
    given: set                            # the keys the user set (configurator.load_config's record)
    grad_accum: int                       # micro-steps per optimizer step on each rank
    ckpt: Optional[dict]                  # init_from='resume': the checkpoint to continue
    hf_weights: Optional[list]            # init_from='hf:...': the released model's safetensors files


def settle_config(argv, world_size=1) -> Settled:
    """The run's final GPTConfig and TrainConfig from argv (config files and --key=value), top to bottom:

    1. the keys given, in config files and on the command line (configurator.load_config); TrainConfig is
       built and checked here, the model keys wait for the defaults they go on;
    2. the model config: the given model keys on GPTConfig's defaults or, with --init_from=hf:..., on the
       released model's config.json (support.pretrained); GPTConfig checks them and the shapes;
    3. with --init_from=resume, out_dir/ckpt.pt: its model config (a model key given with another value is
       refused) and its data, batch and schedule settings (the keys given again win);
    4. the batch: gradient-accumulation steps for total_batch_size tokens over world_size ranks.

    Raises ConfigError for a bad key, value or combination; RunError for a checkpoint or a released model
    that cannot be read or does not fit."""
    (model_keys, cfg), given = load_config(argv, GPTConfig, TrainConfig, defer=(GPTConfig,))
    hf_weights = None
    if cfg.init_from.startswith("hf:"):
        try:
            hf_config, hf_weights = hf_checkpoint(cfg.init_from[3:])
            model_cfg = config_from_hf(hf_config, **model_keys)
        except ValueError as e:
            raise RunError(f"--init_from={cfg.init_from}: {e}") from None
    else:
        try:
            model_cfg = GPTConfig(**model_keys)
        except ValueError as e:                       # e.g. n_embd must divide by n_head
            raise ConfigError(str(e)) from None
    ckpt = None
    # the architecture and the run's settings come from the checkpoint
    if cfg.init_from == "resume":
        ckpt = load_checkpoint(os.path.join(cfg.out_dir, "ckpt.pt"))
        model_cfg = model_config_from_checkpoint(ckpt, model_cfg, given)
        cfg = train_config_from_checkpoint(ckpt, cfg, given)
    grad_accum = grad_accum_steps(cfg.total_batch_size, cfg.batch_size, model_cfg.block_size, world_size)
    return Settled(model_cfg, cfg, given, grad_accum, ckpt, hf_weights)


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


# -----------------------------------------------------------------------------
# The run: setup, then per step evaluate_and_save (every eval_interval) and train_step (support/loop.py)

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
    ckpt_path: str
    log_path: str
    resumed: bool
    grad_accum: int                       # micro-steps per optimizer step on each rank
    meta: dict                            # the data's meta.json
    train_path: str
    val_path: str
    data_dtype: object
    val_windows: list                     # this rank's fixed val windows
    train_mode: Optional[str]             # T²MLR: cfg.train_mode ("jacobi": D sweeps, "exact"); None otherwise
    val_mode: Optional[str]               # T²MLR: cfg.val_mode; None for the other models
    val_label: str
    data_gen: torch.Generator             # the data order (the same on every rank: see step_starts)
    trainer: Trainer                      # raw_model, the model that trains, optimizer, scaler, autocast
    pass_counter: Optional[object]        # T²MLR: support.accounting.count_middle_passes of raw_model
    eval_model: torch.nn.Module
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
    t_start, timing = time.time(), {"eval_seconds": 0.0, "n_evals": 0}

    def evaluate_timed(step):
        t_eval = time.time()
        evaluate_and_save(run, step)
        timing["eval_seconds"] += time.time() - t_eval
        timing["n_evals"] += 1

    def train_logged(step):
        logged = step % cfg.log_interval == 0 or step == cfg.max_iters - 1
        row = train_step(run, step, logged)
        bar.update()
        if logged:
            # ETA: the mean step times the steps left, plus the mean evaluation times the evaluations left
            # (the multiples of eval_interval still ahead, and the final one)
            eval_seconds, n_evals = timing["eval_seconds"], timing["n_evals"]
            per_step = (time.time() - t_start - eval_seconds) / (step + 1 - run.start_step)
            evals_left = (cfg.max_iters - 1) // cfg.eval_interval - step // cfg.eval_interval + 1
            eta = per_step * (cfg.max_iters - step - 1) + eval_seconds / max(n_evals, 1) * evals_left
            run.log(
                row,
                f"step {step}: loss {row['loss']:.4f}, lr {row['lr']:.3g}, grad norm {row['grad_norm']:.3f}, "
                f"{row['ms']:.0f} ms, {row['tok_s']:,.0f} tok/s, "
                + (f"MFU {100 * row['mfu']:.1f}%" if run.peak else f"{row['flops'] / 1e12:.3g} TFLOP/s")
                + (f", {'Jacobi' if run.train_mode == 'jacobi' else 'token'} passes {row['jacobi_passes']:.2f}"
                   if run.model_cfg.t2mlr else "")
                + f", ETA {eta / 60:.1f} min",
            )

    # exactly max_iters optimizer steps, each evaluation and save after `step` updates; the step a run
    # resumed from was evaluated already
    run_steps(cfg, run.start_step, run.start_step if run.resumed else None, train_logged, evaluate_timed)
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
    """Config (settle_config), distributed setup, data, model and optimizer (and, with --init_from=resume,
    the whole saved state). Every check runs before anything is written. Raises ConfigError or RunError."""
    ddp = "RANK" in os.environ                        # set by torchrun
    rank, local_rank, world_size = (
        (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")) if ddp else (0, 0, 1)
    )
    master = rank == 0
    settled = settle_config(argv, world_size)
    cfg, model_cfg, ckpt = settled.cfg, settled.model_cfg, settled.ckpt
    resumed, T = ckpt is not None, model_cfg.block_size

    # ---- device and distributed setup ----------------------------------------------------------------
    device = resolve_device(cfg.device, local_rank if ddp else None)
    device_type = device.split(":")[0]
    if ddp:
        if device_type == "cuda":
            torch.cuda.set_device(device)
        # gloo makes DDP testable on CPU
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    ptdtype = resolve_dtype(cfg.dtype, device_type)
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    ckpt_path, log_path = os.path.join(cfg.out_dir, "ckpt.pt"), os.path.join(cfg.out_dir, "log.jsonl")

    # ---- data ----------------------------------------------------------------------------------------
    data_dir = cfg.data_dir or os.path.join("data", cfg.dataset)
    meta = load_meta(data_dir, T, cfg.init_from if settled.hf_weights else None)
    if meta["vocab_size"] > model_cfg.vocab_size:
        raise RunError(
            f"the data's vocab_size {meta['vocab_size']} (meta.json) exceeds the model's vocab_size "
            f"{model_cfg.vocab_size}; set vocab_size >= {meta['vocab_size']}"
        )
    if settled.hf_weights and not meta["tokenizer"].startswith("hf:"):
        raise RunError(
            f"{data_dir} holds {meta['tokenizer']} tokens, but a released model reads its own: prepare the "
            f"data with `prepare_data.py --tokenizer {cfg.init_from}`"
        )
    if resumed and recorded_tokenizer(ckpt, ckpt_path) != meta["tokenizer"]:
        raise RunError(f"{data_dir} holds {meta['tokenizer']} tokens but the checkpoint was trained on "
                       f"{ckpt['tokenizer']} tokens; resume with the run's dataset")
    # the fixed val windows, dealt out to the ranks; evaluate() sums over ranks
    val_windows = val_starts(meta["val_tokens"], T, cfg.eval_iters * cfg.batch_size)[rank::world_size]
    train_mode = cfg.train_mode if model_cfg.t2mlr else None   # T²MLR: Jacobi sweeps or the exact recurrence
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
    # fill the rotary table cache (model.GPT.run_layers, here with no layers) now: filled inside
    # torch.compile's trace, it would recompile once
    raw_model.run_layers(torch.zeros(1, 1, model_cfg.n_embd, device=device), [], 0)
    trainer = make_trainer(raw_model, cfg, device, ptdtype, ckpt_path)
    start_step, best_val = 0, float("inf")
    if resumed:                                       # everything, so the run continues as if never stopped
        start_step = resume(trainer, ckpt, ckpt_path, rank, world_size, data_gen)
        best_val = ckpt["best_val_loss"]
        del ckpt                                      # free the host copy of the weights
        settled.ckpt = None
    elif cfg.init_from.endswith(".pt"):               # new run, weights from another (e.g. a T²MLR retrofit)
        init_weights_from(raw_model, cfg.init_from)
    # new run from a released model (the T²MLR paper's §3.4 retrofit)
    elif settled.hf_weights:
        try:
            load_hf_weights(raw_model, settled.hf_weights)
        except ValueError as e:
            raise RunError(f"--init_from={cfg.init_from}: {e}") from None
    # T²MLR: counts the middle-layer passes (a hook, registered once, before compiling)
    pass_counter = count_middle_passes(raw_model) if model_cfg.t2mlr else None
    # compile None: on for CUDA, except for exact training (its Python loop over tokens would unroll T steps)
    use_compile = device_type == "cuda" and train_mode != "exact" if cfg.compile is None else cfg.compile
    compiled = torch.compile(raw_model) if use_compile else raw_model
    # Every parameter gets a gradient on every step (MeSH routers and T²MLR gates always run), so DDP
    # needs no find_unused_parameters.
    device_ids = [local_rank] if device_type == "cuda" else None
    trainer.model = DDP(compiled, device_ids=device_ids) if ddp else compiled
    trainer.ddp = ddp
    # The exact T²MLR forward loops over tokens in Python; compiling it would unroll T steps.
    eval_model = compiled if val_mode == "jacobi" else raw_model
    flops_per_token = train_flops_per_token(raw_model if train_mode != "exact" else exact_twin(model_cfg))
    peak = peak_flops(device, cfg.peak_flops)
    if master:
        counts = param_counts(raw_model)
        os.makedirs(cfg.out_dir, exist_ok=True)
        print(f"config (given): {given_values(settled.given, model_cfg, cfg)}")
        print(
            f"device {device}, dtype {str(ptdtype).removeprefix('torch.')}, compile {use_compile}, world "
            f"size {world_size}"
        )
        print(f"params: total {counts['total']:,}, non-embedding {counts['non_embedding']:,}, unrolled depth "
              f"{model_cfg.n_unrolled} layers, {flops_per_token:.3g} train FLOPs/token")
        print(
            f"batch: {cfg.total_batch_size:,} tokens/step = {cfg.batch_size} seqs x {T} tokens x "
            f"{world_size} ranks"
            f" x {settled.grad_accum} accumulation steps; data {data_dir} ({meta['train_tokens']:,} train "
            f"tokens)"
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
        ckpt_path=ckpt_path,
        log_path=log_path,
        resumed=resumed,
        grad_accum=settled.grad_accum,
        meta=meta,
        train_path=os.path.join(data_dir, "train.bin"),
        val_path=os.path.join(data_dir, "val.bin"),
        data_dtype=np.dtype(meta["dtype"]),
        val_windows=val_windows,
        train_mode=train_mode,
        val_mode=val_mode,
        val_label=val_label,
        data_gen=data_gen,
        trainer=trainer,
        pass_counter=pass_counter,
        eval_model=eval_model,
        start_step=start_step,
        best_val=best_val,
        flops_per_token=flops_per_token,
        peak=peak,
    )


def exact_twin(model_cfg):
    """A model on the meta device whose training FLOPs equal exact training's (train_mode 'exact'): the
    middle layers once forward and once backward per token, the gate once, as Jacobi with D = 1
    (support.accounting counts Jacobi sweeps)."""
    with torch.device("meta"):
        return GPT(replace(model_cfg, jacobi_sweeps=1, jacobi_grad_sweeps=0, jacobi_tol=0.0,
                           jacobi_checkpoint=False, jacobi_init="zero"))


def evaluate_and_save(run: Run, step: int):
    """The val loss after `step` updates (logged), then the whole state to ckpt.pt (atomically, rank 0)."""
    cfg, T, windows = run.cfg, run.model_cfg.block_size, run.val_windows

    def batches():
        for i in range(0, len(windows), cfg.batch_size):
            if run.pass_counter is not None:          # from 0 in each forward, as in train_step
                run.pass_counter.n = 0
            yield get_batch(run.val_path, run.data_dtype, windows[i:i + cfg.batch_size], T, run.device)

    val_loss = evaluate(run.eval_model, batches(), run.device, run.trainer.autocast, run.val_mode,
                        cfg.val_tol)
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
        save_state(run.trainer, step, [g[0] for g in gathered], best_val_loss=run.best_val, val_loss=val_loss,
                   model_config=asdict(run.model_cfg), train_config=asdict(cfg),
                   tokenizer=run.meta["tokenizer"])


def train_step(run: Run, step: int, logged: bool) -> Optional[dict]:
    """One optimizer step (support.loop.optimizer_step) on this rank's share of the step's windows.
    Returns the log row when `logged` (loss, lr, grad norm, time, throughput; T²MLR: mean middle-layer
    passes), else None: only a logged step syncs the device for its timing and reads the grad norm.
    Raises RunError, before the update, when the loss is not finite."""
    cfg, T = run.cfg, run.model_cfg.block_size
    t0 = time.time()
    starts = step_starts(
        run.meta["train_tokens"], T, cfg.batch_size, run.grad_accum, run.world_size, run.rank, run.data_gen
    )
    passes = []                                       # T²MLR: the middle-layer passes of each micro-step

    def micro_loss(model, micro):
        x, y = get_batch(run.train_path, run.data_dtype, starts[micro], T, run.device)
        if run.pass_counter is None:
            return model(x, y, mode=run.train_mode)[1]
        # counted from 0 in each forward (torch.compile specialises on the count: one graph), forwards only
        run.pass_counter.n = 0
        loss = model(x, y, mode=run.train_mode)[1]
        passes.append(run.pass_counter.n)
        return loss

    train_loss, grad_norm, lr = optimizer_step(run.trainer, step, run.grad_accum, micro_loss)
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
        # mean middle-layer passes per micro-step (D, +1 with the plain start, fewer where jacobi_tol stopped;
        # train_mode exact: one per token, T)
        row["jacobi_passes"] = sum(passes) / run.grad_accum
    return row


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ConfigError, RunError) as e:
        sys.exit(f"error: {e}")
