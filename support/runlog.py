"""
What a training run says: its header, a line and a log.jsonl row per logged step and per evaluation, the
progress bars, the ETA, and a warning when the device is far too slow for the run. train.py makes one
RunLog and calls it from its loop; rank 0 alone prints and writes.
"""

import json
import os
import sys
import time
from dataclasses import asdict

import torch
from tqdm import tqdm

from support.accounting import exact_training_flops_per_token, param_counts, train_flops_per_token
from support.data import get_batch
from support.loop import mean_loops
from support.runtime import RunError, peak_flops

SLOW_RUN_SECONDS = 24 * 3600     # a run estimated longer than this on a CPU or MPS is pointed at the quick start


def trim_replayed_rows(log_path, step):
    """Drop the rows of log.jsonl that a resume from `step` replays: train rows of steps >= step and evaluations
    after it (written after the checkpoint the run resumes from). Rewritten atomically; returns how many."""
    if not os.path.isfile(log_path):
        return 0
    with open(log_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    keep = [r for r in rows if "init_from" in r or r["step"] < step or (r["step"] == step and "loss" not in r)]
    with open(log_path + ".tmp", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in keep)
    os.replace(log_path + ".tmp", log_path)
    return len(rows) - len(keep)


class RunLog:
    """The run's voice: prints (tqdm.write, so the bars stay intact) and log.jsonl rows, rank 0 only."""

    def __init__(self, cfg, model_cfg, s, trainer, device, ptdtype, world_size, data, start_step, master):
        self.cfg, self.model_cfg, self.master, self.world_size = cfg, model_cfg, master, world_size
        self.device, self.start_step, self.t2mlr = device, start_step, model_cfg.t2mlr
        self.log_path = os.path.join(cfg.out_dir, "log.jsonl")
        self.random_depth = model_cfg.layout != "" and (cfg.loops_sampler != "fixed" or cfg.loops_backprop)
        self.flops_at = lambda n: train_flops_per_token(trainer.raw_model, n_loops=n, loops_backprop=cfg.loops_backprop)
        # exact T²MLR training as D = 1; random depth at the mean draw after the cap (support.loop.mean_loops)
        depth = mean_loops(cfg.loops_sampler, model_cfg.n_loops, model_cfg.max_loops, cfg.seed) if model_cfg.layout \
            else None
        exact = self.t2mlr and cfg.train_mode == "exact"
        self.flops_per_token = exact_training_flops_per_token(model_cfg) if exact else self.flops_at(depth)
        self.draws, self.peak, self.grad_accum = [], peak_flops(device, cfg.peak_flops), s.grad_accum
        self.t_start, self.eval_seconds, self.n_evals, self.warned = time.time(), 0.0, 0, False
        self.show_bars = master and cfg.progress and sys.stderr.isatty()
        self.bar = tqdm(total=cfg.max_iters, initial=start_step, unit="step", disable=not self.show_bars)
        if master:
            self.header(s, trainer, ptdtype, data)

    def header(self, s, trainer, ptdtype, data):
        """The run's plan, printed; log.jsonl's header row (a resume appends, after dropping the rows it replays)."""
        cfg, model_cfg, counts, resumed = self.cfg, self.model_cfg, param_counts(trainer.raw_model), s.ckpt is not None
        print(f"config (given): {s.given_values}")
        print(f"device {self.device}, dtype {str(ptdtype).removeprefix('torch.')}, compile {trainer.compiled}, "
              f"world size {self.world_size}")
        if trainer.compiled:
            print("compile: torch.compile traces the model during the first step (about a minute; longer for "
                  "T²MLR's Jacobi sweeps); the step times after it are the real ones")
        print(f"params: total {counts['total']:,}, non-embedding {counts['non_embedding']:,}, unrolled depth "
              f"{model_cfg.n_unrolled} layers, {self.flops_per_token:.3g} train FLOPs/token")
        print(f"batch: {cfg.total_batch_size:,} tokens/step = {cfg.batch_size} seqs x {model_cfg.block_size} tokens "
              f"x {self.world_size} ranks x {s.grad_accum} accumulation steps; data {data.dir} "
              f"({data.meta['train_tokens']:,} train tokens)")
        print(f"MFU against {self.peak:.3g} FLOP/s per device" if self.peak else f"MFU: no peak FLOP/s known for "
              f"{self.device} (the log shows TFLOP/s; --peak_flops=<FLOP/s> sets one)")
        if resumed:
            print(f"resumed from {s.ckpt_path} at step {self.start_step}: {cfg.max_iters - self.start_step} steps to go")
        if resumed and (dropped := trim_replayed_rows(self.log_path, self.start_step)):
            print(f"log.jsonl: dropped {dropped} rows after step {self.start_step}, which this resume replays")
        with open(self.log_path, "a" if resumed else "w") as f:
            f.write(json.dumps({"step": self.start_step, "init_from": cfg.init_from, "world_size": self.world_size,
                                "model_config": asdict(model_cfg), "train_config": asdict(cfg)}) + "\n")

    def write(self, row, text):
        if self.master:
            tqdm.write(text)
            with open(self.log_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    def check_estimate(self, seconds, what):
        """A run estimated (from `what`, a timing in words) at more than a day on a CPU or MPS stops here with
        one line naming the tiny configs, unless --force (then it says so once). GPU runs never stop here."""
        if self.device.startswith("cuda") or seconds <= SLOW_RUN_SECONDS or self.warned:
            return
        self.warned = True
        days = f"about {seconds / 86400:.0f} days on {self.device} ({what})"
        if not self.cfg.force:
            raise RunError(f"at this speed the run would take {days}: on a CPU train config/tiny_mesh.py or "
                           f"another config/tiny_*.py (minutes; the README's CPU quick start), or pass --force "
                           f"to run this one anyway")
        if self.master:
            tqdm.write(f"warning: the run would take {days}; running anyway (--force)")

    def micro_step(self, step, micro, seconds):
        """After micro-step `micro` of `step`, `seconds` into the step: after this launch's first, its time, the
        step's estimate and the run's ETA, before a long silent first step (mesh_160m on one CPU)."""
        if step != self.start_step or micro != 0:
            return
        step_s, steps = seconds * self.grad_accum, self.cfg.max_iters - self.start_step
        if self.master:
            eta = f"{step_s * steps / 60:.1f} min" if step_s * steps < 3600 else f"{step_s * steps / 3600:.1f} h"
            tqdm.write(f"first micro-step {seconds:.2f} s (compile included, if on): about {step_s:.1f} s a step of "
                       f"{self.grad_accum} micro-steps, ETA {eta} for {steps} steps")
        self.check_estimate(step_s * steps, f"{step_s:.1f} s a step")

    def val_batches(self, data, pass_counter):
        """This rank's fixed val windows in batches, under a progress bar. The first evaluation times its first
        batch and stops a run that would take days at that speed (check_estimate)."""
        cfg, T, windows = self.cfg, self.model_cfg.block_size, data.val_windows
        starts, t0 = range(0, len(windows), cfg.batch_size), time.time()
        if self.master and self.n_evals == 0:
            tqdm.write(f"evaluating: {len(starts)} batches of fixed val windows")
        for i in tqdm(starts, desc="evaluating", leave=False, disable=not self.show_bars):
            if i == cfg.batch_size and self.n_evals == 0:     # one batch done: forward seconds per token
                per_token = (time.time() - t0) / (cfg.batch_size * T)
                train_tokens = cfg.total_batch_size * (cfg.max_iters - self.start_step) / self.world_size
                evals = len(windows) * T * (cfg.max_iters // cfg.eval_interval + 1)
                self.check_estimate(per_token * (3 * train_tokens + evals), f"{per_token * 1e3:.2f} ms a token forward")
            if pass_counter is not None:              # from 0 in each forward, as in training
                pass_counter.n = 0
            yield get_batch(data.val_path, data.dtype, windows[i:i + cfg.batch_size], T, self.device)
        self.eval_seconds += time.time() - t0
        self.n_evals += 1

    def evaluation(self, step, val_loss, best_val, val_mode, by_rank=None):
        """An evaluation's line and row; by_rank: under DDP, every rank's (all-reduced, so equal)."""
        row = {"step": step, "val_loss": val_loss, "val_mode": val_mode, "best_val_loss": best_val}
        row |= {"val_tol": self.cfg.val_tol} if val_mode == "converged" else {}
        row |= {"val_loss_by_rank": by_rank} if by_rank is not None else {}
        tol = f", tol {self.cfg.val_tol:g}" if val_mode == "converged" else ""
        self.best_label = f"val loss ({val_mode}{tol})" if self.t2mlr else "val loss"
        self.write(row, f"step {step}: {self.best_label} {val_loss:.4f} (best {best_val:.4f})")

    def train_step(self, step, train_loss, lr, grad_norm, t0, passes, n_loops=None):
        """The bar; at every log_interval (and the last step) a line and a row: loss, LR, grad norm, time,
        throughput, MFU, T²MLR's mean middle passes, the loop counts drawn since the last row (random
        depth), the ETA. Only a logged step syncs the device."""
        cfg = self.cfg
        self.bar.update()
        self.draws.append(n_loops)
        if not (step % cfg.log_interval == 0 or step == cfg.max_iters - 1):
            return
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        dt = time.time() - t0
        tok_s = cfg.total_batch_size / dt
        flops = self.flops_per_token * tok_s / self.world_size     # achieved FLOP/s per device
        if self.random_depth:    # this step's FLOPs, at its own draw
            flops *= self.flops_at(n_loops) / self.flops_per_token
        row = {"step": step, "loss": train_loss.item(), "lr": lr, "grad_norm": grad_norm.item(), "ms": 1000 * dt,
               "tok_s": tok_s, "flops": flops, "mfu": flops / self.peak if self.peak else None}
        if self.random_depth:
            row["loops"], self.draws = self.draws, []
        if self.t2mlr:       # mean middle-layer passes per micro-step (D, +1 with the ungated start; exact: T)
            row["jacobi_passes"] = sum(passes) / len(passes)
        # ETA: the mean step time times the steps left, plus the mean evaluation time times those left
        per_step = (time.time() - self.t_start - self.eval_seconds) / (step + 1 - self.start_step)
        evals_left = (cfg.max_iters - 1) // cfg.eval_interval - step // cfg.eval_interval + 1
        eta = per_step * (cfg.max_iters - step - 1) + self.eval_seconds / max(self.n_evals, 1) * evals_left
        mfu = f"MFU {100 * row['mfu']:.1f}%" if self.peak else f"{row['flops'] / 1e12:.3g} TFLOP/s"
        passes = (f", {'Jacobi' if cfg.train_mode == 'jacobi' else 'token'} passes {row['jacobi_passes']:.2f}"
                  if self.t2mlr else "")
        self.write(row, f"step {step}: loss {row['loss']:.4f}, lr {lr:.3g}, grad norm {row['grad_norm']:.3f}, "
                        f"{row['ms']:.0f} ms, {tok_s:,.0f} tok/s, {mfu}{passes}, ETA {eta / 60:.1f} min")

    def stopped(self, step, ckpt_path, command):
        """A run stopped by a signal: one line naming the step saved and the command that resumes it."""
        self.bar.close()
        if self.master:
            print(f"stopped at step {step} (saved in {ckpt_path}); resume with: {command}", flush=True)

    def done(self, best_val, ckpt_path):
        self.bar.close()
        if self.master:
            print(f"done: {self.cfg.max_iters - self.start_step} steps to step {self.cfg.max_iters}, best "
                  f"{self.best_label} {best_val:.4f}, checkpoint {ckpt_path}")
