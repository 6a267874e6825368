"""
Train a GPT: vanilla, recursive with MeSH or a fixed state passing (layout "P+NRK+Q"), or T²MLR.

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

Writes out_dir/ckpt.pt at every evaluation (atomically; the one before kept as ckpt.prev.pt) and a JSON row
per log or evaluation step to out_dir/log.jsonl. One run at a time holds an out_dir (out_dir/.lock).
"""

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

from configurator import ConfigError, given_values, load_config
from model import GPT, GPTConfig
from support.accounting import count_middle_passes
from support.checkpoints import (RESUME_KEYS, init_weights_from, load_checkpoint, load_resumable, lock_out_dir,
                                 refuse_if_locked, require_keys, rng_states, state_differences)
from support.config import check_settings
from support.data import check_token_ids, get_batch, load_meta, step_starts, val_starts
from support.loop import (LOOPS_SAMPLERS, check_finite, draw_loops, evaluate, get_lr, make_trainer, mean_over_ranks,
                          resume, save_state, set_lr)
from support.pretrained import config_from_hf, hf_checkpoint, load_hf_weights
from support.process import keeps_process_state
from support.runlog import RunLog
from support.runtime import RunError, StopRequest, compile_model, resolve_device, resolve_dtype, resume_command


# -----------------------------------------------------------------------------
# Defaults: every key of a run besides the model's (GPTConfig in model.py). Config files and
# --key=value override both (configurator.py); `python train.py --help` lists them all.

@dataclass
class TrainConfig:
    # I/O
    out_dir: str = "out"                  # ckpt.pt and log.jsonl go here
    init_from: str = "scratch"            # 'scratch', 'resume', path/to/ckpt.pt or 'hf:<hub id or folder>'
    dataset: str = "pydoc"                # reads data/<dataset>/{train,val}.bin + meta.json (prepare_data.py)
    data_dir: Optional[str] = None        # read this folder instead of data/<dataset>
    # evaluation and logging
    eval_interval: int = 250              # evaluate and checkpoint every this many steps, and at the end
    eval_iters: int = 20                  # val batches: eval_iters * batch_size fixed windows over all ranks
    val_mode: str = "exact"               # T²MLR: 'exact' (token by token: the true loss), 'jacobi', 'converged'
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
    # train_mode, T²MLR only: 'jacobi' (D parallel sweeps; exact at positions < D) or 'exact' (the recurrence
    # token by token with autograd: every position's state exact, the middle layers once per token)
    train_mode: str = "jacobi"            # T²MLR only: 'jacobi' or 'exact'
    # random-depth training, recursive layouts only: each step's loop count (support.loop.draw_loops)
    loops_sampler: str = "fixed"          # 'fixed' (the layout's K), 'poisson_lognormal' or 'uniform'
    loops_backprop: Optional[int] = None  # gradient through the last this many loops only; None = all
    # system
    device: str = "auto"                  # 'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'cuda:1', 'mps'
    dtype: str = "auto"                   # 'auto' (bf16 on CUDA if supported, else fp32), float32, bfloat16
    compile: Optional[bool] = None        # torch.compile; None = on for CUDA only
    seed: int = 1337                      # model init, global RNGs and the data sampler (same on every rank)
    peak_flops: Optional[float] = None    # peak FLOP/s of one device, for MFU; None = table for known GPUs
    force: bool = False                   # run on a CPU/MPS even when the estimate says more than a day

    def __post_init__(self):
        if not (self.init_from in ("scratch", "resume") or self.init_from.endswith(".pt")
                or (self.init_from.startswith("hf:") and len(self.init_from) > 3)):
            raise ValueError(f"init_from = {self.init_from!r} must be 'scratch', 'resume', a checkpoint path "
                             f"ending in .pt or 'hf:<hub id or folder>'")
        check_settings(self, TRAIN_SETTINGS)
        if self.min_lr > self.learning_rate:
            raise ValueError(f"min_lr = {self.min_lr} must be <= learning_rate = {self.learning_rate}")


# The valid values of TrainConfig's fields (support.config.check_settings: a float must also be finite).
# seed: what np.random.seed accepts.
TRAIN_SETTINGS = {
    "eval_interval": ">= 1", "eval_iters": ">= 1", "val_mode": ("exact", "jacobi", "converged"),
    "val_tol": "[0, 1)", "log_interval": ">= 1", "total_batch_size": ">= 1", "batch_size": ">= 1",
    "max_iters": ">= 0", "lr_decay_iters": ">= 1", "learning_rate": ">= 0", "min_lr": ">= 0",
    "warmup_iters": ">= 0", "weight_decay": ">= 0", "beta1": "[0, 1)", "beta2": "[0, 1)", "grad_clip": ">= 0",
    "gate_lr_multiplier": "> 0", "train_mode": ("jacobi", "exact"), "loops_sampler": LOOPS_SAMPLERS,
    "loops_backprop": ">= 1", "dtype": ("auto", "float32", "bfloat16", "float16"), "seed": "[0, 4294967295]",
    "peak_flops": "> 0",
}


def grad_accum_steps(total_batch_size, batch_size, block_size, world_size):
    """Micro-steps per optimizer step so that one step sees exactly total_batch_size tokens; ConfigError,
    showing the numbers, when it is not a multiple of the tokens of one micro-step over all ranks."""
    per_micro = batch_size * block_size * world_size
    if total_batch_size < per_micro or total_batch_size % per_micro:
        raise ConfigError(
            f"total_batch_size = {total_batch_size} tokens is not a multiple of batch_size * block_size"
            f" * world_size = {batch_size} * {block_size} * {world_size} = {per_micro}: set --total_batch_size to a "
            f"multiple of {per_micro} (e.g. {max(1, round(total_batch_size / per_micro)) * per_micro}), or a "
            f"batch_size or block_size whose product divides it")
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
    ckpt_path: Optional[str]              # where it was read (ckpt.pt, or the previous one when that is damaged)
    hf_weights: Optional[list]            # init_from='hf:...': the released model's safetensors files
    given_values: dict                    # {key: value} of the keys the user set, as the run prints them


def settle_config(argv, world_size=1) -> Settled:
    """The run's final configs from argv, top to bottom: the keys given; the model's on GPTConfig's defaults
    or a released model's config.json (--init_from=hf:...); with --init_from=resume the checkpoint's (given keys
    win, a model key must agree); the gradient accumulation for world_size ranks. Raises ConfigError for a bad
    key, value or combination; RunError for weights that do not load or fit."""
    (model_keys, cfg), given = load_config(argv, GPTConfig, TrainConfig, defer=(GPTConfig,))
    hf, hf_weights, ckpt, ckpt_path = cfg.init_from.startswith("hf:"), None, None, None
    try:
        if hf:                                        # a released model's config.json, the given keys on it
            hf_config, hf_weights = hf_checkpoint(cfg.init_from[3:])
            model_cfg = config_from_hf(hf_config, **model_keys)
        else:
            model_cfg = GPTConfig(**model_keys)
    except ValueError as e:                           # not found or not supported; e.g. n_head not dividing n_embd
        raise (RunError(f"--init_from={cfg.init_from}: {e}") if hf else ConfigError(str(e))) from None
    if cfg.init_from == "resume":
        ckpt, ckpt_path = load_resumable(os.path.join(cfg.out_dir, "ckpt.pt"), ("model", "model_config", "train_config"))
        model_cfg = model_config_from_checkpoint(ckpt, model_cfg, given)
        cfg = train_config_from_checkpoint(ckpt, cfg, given)
    if not model_cfg.layout and (cfg.loops_sampler != "fixed" or cfg.loops_backprop is not None):
        raise ConfigError(f"loops_sampler {cfg.loops_sampler!r} and loops_backprop {cfg.loops_backprop} "
                          f"need a recursive layout 'P+NRK+Q': this model has no loops")
    grad_accum = grad_accum_steps(cfg.total_batch_size, cfg.batch_size, model_cfg.block_size, world_size)
    return Settled(model_cfg, cfg, given, grad_accum, ckpt, ckpt_path, hf_weights,
                   given_values(given, model_cfg, cfg))


def train_config_from_checkpoint(ckpt, cfg, given):
    """The TrainConfig of a resumed run: the checkpoint's data, batch and schedule, overridden by the keys given
    again (`given`, whatever their value), so a resume without the config file continues the same run; this
    launch's system settings always apply. Raises ConfigError when a given value does not fit the others."""
    system = ("init_from", "out_dir", "device", "dtype", "compile", "progress")
    stored = {k: v for k, v in ckpt["train_config"].items() if k not in system}
    try:
        return TrainConfig(**{**asdict(cfg), **stored, **given_values(given, cfg)})
    except ValueError as e:
        raise ConfigError(f"{e} (with the checkpoint's other settings)") from None


def model_config_from_checkpoint(ckpt, model_cfg, given):
    """The GPTConfig stored in ckpt. The model keys given (`given`, whatever their value; model_cfg holds them)
    must equal it, else RunError names every differing key and the first differing tensor shapes."""
    if "model_config" not in ckpt:
        raise RunError("the checkpoint has no model_config: only a checkpoint of train.py can be resumed")
    stored, given_model = ckpt["model_config"], given_values(given, model_cfg)
    diff = [f"{k} (given {v!r}, checkpoint {stored.get(k)!r})" for k, v in given_model.items() if stored.get(k) != v]
    if diff:
        try:                                        # the checkpoint's config with the given keys applied...
            asked = GPTConfig(**{**stored, **given_model})
        except (TypeError, ValueError):             # ...or, where they do not combine, this launch's own
            asked = model_cfg
        with torch.device("meta"):                  # its shapes, without allocating
            shapes = state_differences(ckpt["model"], GPT(asked).state_dict(), optional=lambda k: True)
        more = f" and {len(shapes) - 4} more" if len(shapes) > 4 else ""
        shapes_text = (f"tensor shapes (checkpoint vs given): {', '.join(shapes[:4])}{more}" if shapes
                       else "the tensor shapes agree")
        raise RunError(f"the model config differs from the checkpoint's in {', '.join(diff)}; {shapes_text}")
    try:
        return GPTConfig(**stored)
    except (TypeError, ValueError) as e:
        raise RunError(f"the checkpoint's model config does not fit this model.py: {e}")


# -----------------------------------------------------------------------------
# The run, top to bottom: main settles the config, sets up, resumes, and runs the loop on the page

@keeps_process_state
def main(argv):
    """Train as configured by argv (config files and --key=value). Raises ConfigError or RunError."""
    ddp, rank, local_rank, world_size = distributed_ranks()
    s = settle_config(argv, world_size)
    cfg, model_cfg, T, grad_accum = s.cfg, s.model_cfg, s.model_cfg.block_size, s.grad_accum
    device, ptdtype = setup_device(cfg, ddp, local_rank)
    data = open_data(s, rank, world_size)     # data and weights checked whole before anything is written...
    trainer, data_gen, start_step, best_val = build_model(s, device, ptdtype, rank, world_size)
    lock = lock_out_dir(cfg.out_dir) if rank == 0 else None   # ...then out_dir is this run's alone (kill -9 too)
    if s.ckpt is not None and start_step >= cfg.max_iters:
        return print(f"nothing to train: {s.ckpt_path} holds {start_step} steps and max_iters = "
                     f"{cfg.max_iters}; give a larger --max_iters to continue")
    model, eval_model, pass_counter = compile_and_wrap(trainer, cfg, model_cfg, device, ddp, local_rank)
    log = RunLog(cfg, model_cfg, s, trainer, device, ptdtype, world_size, data, start_step, rank == 0)
    train_mode, val_mode = (cfg.train_mode, cfg.val_mode) if model_cfg.t2mlr else (None, None)
    stop = StopRequest(master=rank == 0)     # Ctrl-C, SIGTERM: finish the step, save it, exit (below)
    def save(step, rngs, val_loss):          # rank 0 writes ckpt.pt: the state after `step` updates
        if rank == 0:
            save_state(trainer, step, rngs, best_val_loss=best_val, val_loss=val_loss, tokenizer=data.tokenizer,
                       model_config=asdict(model_cfg), train_config=asdict(cfg))
    # ---- the loop: exactly max_iters optimizer steps, an evaluation and save after every eval_interval ------
    for step in range(start_step, cfg.max_iters + 1):
        last = step == cfg.max_iters     # the step a run resumed from was evaluated before it was saved
        if last or (step % cfg.eval_interval == 0 and not (s.ckpt is not None and step == start_step)):
            val_loss = evaluate(eval_model, log.val_batches(data, pass_counter), device, trainer.autocast,
                                val_mode, cfg.val_tol)
            best_val = min(best_val, val_loss)
            ranks = gather((rng_states(data_gen), val_loss), ddp, world_size)   # every rank's RNGs, val loss
            log.evaluation(step, val_loss, best_val, val_mode, [r[1] for r in ranks] if ddp else None)
            save(step, [r[0] for r in ranks], val_loss)
        if last:
            break
        if stop.agreed(ddp, device):   # asked to stop (any rank): every rank stops here, rank 0 saves this step
            save(step, gather(rng_states(data_gen), ddp, world_size), val_loss=None)
            log.stopped(step, trainer.ckpt_path, resume_command(argv, ddp, world_size))
            return finish(ddp, lock, exit_code=130)
        t0, passes, lr = time.time(), [], set_lr(trainer.optimizer, get_lr(step, cfg))
        depth = dict(n_loops=draw_loops(cfg.loops_sampler, model_cfg.n_loops, model_cfg.max_loops, cfg.seed,
                                        step), loops_backprop=cfg.loops_backprop) if model_cfg.layout else {}
        starts = step_starts(data.meta["train_tokens"], T, cfg.batch_size, grad_accum, world_size, rank, data_gen)
        loss_sum = torch.zeros((), device=device)     # summed on the device: no host sync per micro-step
        for micro in range(grad_accum):
            x, y = get_batch(data.train_path, data.dtype, starts[micro], T, device)
            # DDP syncs in the forward of the last micro-step only: no_sync wraps the others' forward AND backward
            with model.no_sync() if ddp and micro < grad_accum - 1 else nullcontext():
                with trainer.autocast, pass_counter.counting(passes) if pass_counter else nullcontext():
                    loss = model(x, y, mode=train_mode, **depth)[1]   # T²MLR: its middle passes counted
                loss_sum += loss.detach()
                trainer.scaler.scale(loss / grad_accum).backward()
            log.micro_step(step, micro, time.time() - t0)  # the first one's time, the ETA (before a long step)
        train_loss = check_finite(mean_over_ranks(loss_sum / grad_accum, ddp), step, trainer.ckpt_path)
        trainer.scaler.unscale_(trainer.optimizer)    # clip the true gradients, not fp16-scaled ones
        grad_norm = torch.nn.utils.clip_grad_norm_(trainer.raw_model.parameters(), cfg.grad_clip or math.inf)
        trainer.scaler.step(trainer.optimizer)
        trainer.scaler.update()
        trainer.optimizer.zero_grad(set_to_none=True)
        log.train_step(step, train_loss, lr, grad_norm, t0, passes, depth.get("n_loops"))
    log.done(best_val, trainer.ckpt_path)
    finish(ddp, lock)


def distributed_ranks():
    """(launched by torchrun, rank, local rank, world size); (False, 0, 0, 1) for a single process."""
    if "RANK" not in os.environ:
        return False, 0, 0, 1
    return True, *(int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))


def finish(ddp, lock, exit_code=0):
    """Release the out_dir; under DDP leave the process group and exit (after a clean run gloo sometimes
    aborts at interpreter teardown; exiting now avoids it). exit_code != 0 (a stopped run): exit with it."""
    if lock is not None:
        lock.close()
    if ddp:
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(exit_code)
    if exit_code:
        sys.exit(exit_code)


def setup_device(cfg, ddp, local_rank):
    """The device (this rank's GPU under DDP) and the autocast dtype; the process group under torchrun (gloo
    on CPU, so DDP is testable there). Raises RunError for a device this machine does not have."""
    device = resolve_device(cfg.device, local_rank if ddp else None)
    device_type = device.split(":")[0]
    if ddp:
        if device_type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    return device, resolve_dtype(cfg.dtype, device_type)


@dataclass
class Data:
    """The token files of a run (support/data.py): meta.json, the splits, this rank's fixed val windows."""
    meta: dict
    tokenizer: str                        # the tokenizer that made the tokens (meta.json), saved with each checkpoint
    dir: str
    train_path: str
    val_path: str
    dtype: np.dtype
    val_windows: list                     # this rank's share; evaluate() sums over ranks


def open_data(s, rank, world_size) -> Data:
    """data_dir's meta.json and bins, checked against the model (vocabulary, every token id) and against the
    tokenizer of the weights the run starts from (a complete checkpoint to resume, a checkpoint, a released
    model). Raises RunError. Last of all: a relaunch that forgot --init_from=resume must not overwrite a run."""
    cfg, model_cfg = s.cfg, s.model_cfg
    if rank == 0:
        refuse_if_locked(cfg.out_dir)             # another run on out_dir: refused first, naming its pid
    if s.ckpt is not None:
        require_keys(s.ckpt, s.ckpt_path, RESUME_KEYS)
    data_dir = cfg.data_dir or os.path.join("data", cfg.dataset)
    meta = load_meta(data_dir, model_cfg.block_size, cfg.init_from if s.hf_weights else None, needs=("tokenizer",))
    if meta["vocab_size"] > model_cfg.vocab_size:
        raise RunError(f"the data's vocab_size {meta['vocab_size']} (meta.json) exceeds the model's vocab_size "
                       f"{model_cfg.vocab_size}; set vocab_size >= {meta['vocab_size']}")
    check_token_ids(data_dir, meta, meta["vocab_size"])        # every id one the tokenizer can produce
    tokens = meta["tokenizer"]
    if s.ckpt is not None and s.ckpt["tokenizer"] != tokens:
        raise RunError(f"{data_dir} holds {tokens} tokens but the checkpoint was trained on "
                       f"{s.ckpt['tokenizer']} tokens; resume with the run's dataset")
    if s.hf_weights and tokens.rstrip("/") != cfg.init_from.rstrip("/"):
        raise RunError(f"{data_dir} holds {tokens} tokens, but a released model reads its own: prepare the "
                       f"data with `prepare_data.py --tokenizer {cfg.init_from}`")
    source = load_checkpoint(cfg.init_from).get("tokenizer") if cfg.init_from.endswith(".pt") else None
    if source is not None and source != tokens:         # (weights saved without one cannot be compared)
        raise RunError(f"{data_dir} holds {tokens} tokens but {cfg.init_from} was trained on {source} tokens: "
                       f"its embeddings would be read under another vocabulary; train on data of {source} tokens")
    if s.ckpt is None and os.path.exists(os.path.join(cfg.out_dir, "ckpt.pt")):
        raise RunError(f"{os.path.join(cfg.out_dir, 'ckpt.pt')} exists: continue it with --init_from=resume, or "
                       f"choose another out_dir")
    windows = val_starts(meta["val_tokens"], model_cfg.block_size, cfg.eval_iters * cfg.batch_size)
    return Data(meta, tokens, data_dir, os.path.join(data_dir, "train.bin"), os.path.join(data_dir, "val.bin"),
                np.dtype(meta["dtype"]), windows[rank::world_size])


def build_model(s, device, ptdtype, rank, world_size):
    """(Trainer (support/loop.py), data sampler, start step, best val loss so far): from the checkpoint with
    --init_from=resume, as if never stopped; else a new init, or the given weights."""
    cfg = s.cfg
    torch.manual_seed(cfg.seed)       # the same init, and the same global RNG stream, on every rank
    np.random.seed(cfg.seed)
    random.seed(cfg.seed)
    data_gen = torch.Generator().manual_seed(cfg.seed)   # identical on all ranks: see step_starts
    raw_model = GPT(s.model_cfg).to(device)
    # no layers: run_layers makes its rotary tables now (inside torch.compile's graph, they would recompile it)
    raw_model.run_layers(torch.zeros(1, 1, s.model_cfg.n_embd, device=device), [], 0)
    trainer = make_trainer(raw_model, cfg, device, ptdtype, os.path.join(cfg.out_dir, "ckpt.pt"))
    start_step, best_val = 0, float("inf")
    if s.ckpt is not None:
        start_step = resume(trainer, s.ckpt, s.ckpt_path, rank, world_size, data_gen)
        best_val = s.ckpt["best_val_loss"]
        s.ckpt = {"step": start_step}             # free the host copy of the weights
    elif cfg.init_from.endswith(".pt"):           # weights from another run (e.g. a T²MLR retrofit)
        init_weights_from(raw_model, cfg.init_from)
    elif s.hf_weights:                            # a released model (the T²MLR paper's §3.4 retrofit)
        try:
            load_hf_weights(raw_model, s.hf_weights)
        except ValueError as e:
            raise RunError(f"--init_from={cfg.init_from}: {e}") from None
    return trainer, data_gen, start_step, best_val


def compile_and_wrap(trainer, cfg, model_cfg, device, ddp, local_rank):
    """What trains (the model compiled and/or DDP-wrapped, set on trainer.model), what evaluates, and T²MLR's
    middle-pass counter. compile: None = on for CUDA (support.runtime.compile_model)."""
    raw_model, device_type = trainer.raw_model, device.split(":")[0]
    trainer.compiled = device_type == "cuda" if cfg.compile is None else cfg.compile
    pass_counter = count_middle_passes(raw_model) if model_cfg.t2mlr else None  # a hook, before compiling
    random_depth = model_cfg.layout and cfg.loops_sampler != "fixed"
    if trainer.compiled and random_depth:   # one static graph per loop count drawn (1 .. max_loops), never eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, model_cfg.max_loops)
        torch._dynamo.config.fail_on_recompile_limit_hit = True
    compiled = compile_model(raw_model, dynamic=False if random_depth else None) if trainer.compiled else raw_model
    # MeSH's routers of steps past a step's loop count (or in its truncated loops) get no gradient then
    unused = model_cfg.state_passing == "mesh" and model_cfg.layout != "" and (
        random_depth or cfg.loops_backprop is not None or model_cfg.max_loops > model_cfg.n_loops)
    trainer.model = DDP(compiled, device_ids=[local_rank] if device_type == "cuda" else None,
                        find_unused_parameters=unused) if ddp else compiled
    trainer.ddp = ddp
    eval_model = compiled if not model_cfg.t2mlr or cfg.val_mode == "jacobi" else raw_model
    return trainer.model, eval_model, pass_counter


def gather(value, ddp, world_size):
    """Every rank's `value`, a list in rank order (rank 0 saves and logs them all)."""
    gathered = [value] * world_size
    if ddp:
        dist.all_gather_object(gathered, value)
    return gathered


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ConfigError, RunError) as e:
        sys.exit(f"error: {e}")
