"""
Running the grid: launching train.py for one run (train.main(argv), in this process), resuming it, reading
its log, storing its summary, and the progress and ETA of the whole grid.

RESUMING, also across sessions and fresh clones: every finished run writes
studies/results/reproduce/<run>.json (its config, seed, curves, final losses, probe numbers; small, meant to
be committed). A run whose JSON exists is skipped (after checking that its config is this grid's: a changed
protocol is an error, not a silent mix; JSONs written before a config key was renamed still count, read
through support.compat.upgrade_config). A run with a checkpoint in out/reproduce/<run>/ continues from it
(train.py --init_from=resume, bit for bit). A run with neither starts from scratch. So a later session on a
fresh clone, without out/, re-runs only the runs that had not finished. At the end (and after
--max_minutes) studies/results/reproduce.json, studies/results/reproduce.md (the tables) and the figures
under studies/results/reproduce/ are assembled from the JSONs (tables.py, figures.py).
"""

import contextlib
import json
import math
import os
import re
import threading
import time

import train
from support.checkpoints import load_checkpoint, save_checkpoint
from support.compat import upgrade_config
from support.runtime import RunError

from .protocol import FLOPS_PER_S, LN2, flops_per_token, initial_model

# -----------------------------------------------------------------------------
# Training one run (resumable)

# the train.py keys a launch adds to a run's own (where and how it runs, not what it trains)
SYSTEM = {"device", "dtype", "compile", "progress", "out_dir", "init_from", "data_dir"}


def launch_argv(run, out_dir, data_dir, device, init_from):
    """train.py's argv for `run`: its model and train keys, then the system keys (fp32, no compile, no
    progress bar; init_from 'resume', a checkpoint path, or 'scratch')."""
    keys = (
        run.model
        | run.train
        | {
            "out_dir": out_dir,
            "data_dir": data_dir,
            "dataset": os.path.basename(data_dir),
            "device": device,
            "dtype": "float32",
            "compile": False,
            "progress": False,
            "init_from": init_from,
        }
    )
    return [f"--{k}={v!r}" for k, v in keys.items()]


def checkpoint_step(run, ckpt_path):
    """The step of the run's checkpoint; RunError if the checkpoint holds another run's settings."""
    ckpt = load_checkpoint(ckpt_path)
    model_diff = [k for k, v in run.model.items() if ckpt["model_config"].get(k) != v]
    train_diff = [k for k, v in run.train.items() if k != "max_iters" and ckpt["train_config"].get(k) != v]
    if model_diff or train_diff:
        raise RunError(
            f"{ckpt_path} holds a run with other settings ({', '.join(model_diff + train_diff)}); "
            f"delete its folder or pass another --out_dir"
        )
    return ckpt["step"]


def train_run(run, out_dir, data_dir, device, stop_at=None):
    """Train `run` into out_dir: continue its checkpoint if there is one, else start from init.pt. stop_at:
    end after that many steps on the run's own schedule (as if interrupted; for tests). Returns 'trained',
    'resumed' or 'complete' (the checkpoint had finished already). train.py's output goes to
    out_dir/train.log."""
    os.makedirs(out_dir, exist_ok=True)
    ckpt_path = os.path.join(out_dir, "ckpt.pt")
    if os.path.exists(ckpt_path):
        step = checkpoint_step(run, ckpt_path)
        if step >= (run.steps if stop_at is None else stop_at):
            return "complete"
        argv, status = launch_argv(run, out_dir, data_dir, device, "resume"), "resumed"
    else:
        init_path = os.path.join(out_dir, "init.pt")
        save_checkpoint(init_path, {"model": initial_model(run).state_dict()})
        argv, status = launch_argv(run, out_dir, data_dir, device, init_path), "trained"
    if stop_at is not None:
        argv.append(f"--max_iters={stop_at}")
    with open(os.path.join(out_dir, "train.log"), "a") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        train.main(argv)
    return status


def read_log(out_dir):
    """(headers, {step: val_loss}, {step: train loss}) from out_dir/log.jsonl; later rows of a step win (a
    resumed run may repeat an evaluation). headers: the rows that hold model_config and train_config (one per
    launch), model_config under today's key names."""
    path = os.path.join(out_dir, "log.jsonl")
    if not os.path.isfile(path):
        raise RunError(f"no {path}: not an out_dir of train.py")
    headers, val, loss = [], {}, {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if "model_config" in row:          # a log written before a key was renamed: the new names
                headers.append(row | {"model_config": upgrade_config(row["model_config"])})
            elif "val_loss" in row:
                val[row["step"]] = row["val_loss"]
            elif "loss" in row:
                loss[row["step"]] = row["loss"]
    if not headers:
        raise RunError(f"{path} has no header row with model_config")
    return headers, dict(sorted(val.items())), dict(sorted(loss.items()))


# -----------------------------------------------------------------------------
# Stored results: one JSON per finished run

def load_summary(path, run):
    """The stored summary of `run`, or None; RunError if it was made under another protocol."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        summary = json.load(f)
    if "config" in summary:               # written before a model key was renamed: read under the new name
        summary["config"]["model"] = upgrade_config(summary["config"].get("model", {}))
    if summary.get("config") != run.fingerprint():
        old, new = summary.get("config", {}), run.fingerprint()
        diff = [f"{part}.{k}" for part in ("model", "train") for k in set(old.get(part, {})) | set(new[part])
                if old.get(part, {}).get(k) != new[part].get(k)] or ["router settings"]
        raise RunError(
            f"{path} was made with other settings ({', '.join(sorted(diff))}); delete it to re-run, "
            f"or pass another --results folder"
        )
    return summary


def write_json(path, obj):
    """obj as indented JSON with every list of numbers on one line (small and diffable), written
    atomically."""
    text = re.sub(r"\[\s*([-+0-9.eE,\s]+?)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]",
                  json.dumps(obj, indent=1))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)


def rounded(x, digits=6):
    """x with every float rounded to `digits` significant digits (small, diffable JSON)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}") if math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: rounded(v, digits) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded(v, digits) for v in x]
    return x


# -----------------------------------------------------------------------------
# Cost estimates and progress

def est_seconds(run, pr, val_tokens, rate=FLOPS_PER_S):
    """Rough seconds for a run: its training FLOPs, plus evaluation (a forward is a third of a training step;
    T²MLR's exact token-by-token pass and the Jacobi depths are counted as plain forwards with factors), at
    `rate` FLOP/s, plus 5 s for loading and probing."""
    fpt = flops_per_token(run.model)
    T = pr.block_size
    plain_fwd = flops_per_token({k: v for k, v in run.model.items() if k not in ("t2mlr", "l_start", "l_end",
                                 "jacobi_sweeps", "jacobi_grad_sweeps")}) / 3
    curve_tokens = (pr.evals + 1) * pr.eval_iters * pr.batch_size * T
    final_tokens = (pr.final_windows * T) if pr.final_windows else val_tokens
    flops = run.steps * pr.total_batch_size * fpt
    if run.model.get("t2mlr"):
        # token-by-token middle layers: per-op overhead (README bench)
        exact_factor = 4.0
        sweeps = sum((8 - 4 + d * 4) / 8 for d in pr.gap_depths)
        flops += plain_fwd * ((curve_tokens + final_tokens + pr.gap_windows * T) * exact_factor
                              + pr.gap_windows * T * sweeps)
    else:
        flops += plain_fwd * (curve_tokens + final_tokens)
    return flops / rate + 5


def hms(seconds):
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Prints the grid's progress and ETA: at every run's start and end, and every `every` seconds while a run
    trains (from its log.jsonl). The speed is calibrated on what this process has done so far."""

    def __init__(self, runs, estimates, console, every=30.0):
        self.runs, self.est, self.console, self.every = runs, estimates, console, every
        self.total = sum(estimates.values())
        self.done = 0.0              # estimated seconds of the runs finished (or skipped)
        self.session_est = 0.0       # ... of the work this process did itself
        self.t0 = time.time()
        self.stop = threading.Event()
        self.thread = None

    def eta(self, extra_done=0.0):
        elapsed = time.time() - self.t0
        worked = self.session_est + extra_done
        speed = elapsed / worked if worked > 0 and elapsed > 30 else 1.0    # measured s per estimated s
        return (
            100 * (self.done + extra_done) / self.total,
            elapsed,
            (self.total - self.done - extra_done) * speed,
        )

    def say(self, text, extra_done=0.0):
        pct, elapsed, eta = self.eta(extra_done)
        print(
            f"{text}  | grid {pct:5.1f}%, elapsed {hms(elapsed)}, ETA {hms(eta)}",
            file=self.console,
            flush=True,
        )

    def skip(self, run):
        self.done += self.est[run.name]

    def start(self, i, run, out_dir):
        prefix = f"[{i + 1}/{len(self.runs)}] {run.name}"
        self.say(f"{prefix}: {run.steps} steps (est. {self.est[run.name] / 60:.1f} min)")
        self.stop.clear()

        def watch():
            last = None
            while not self.stop.wait(self.every):
                try:
                    _, val, loss = read_log(out_dir)
                except (RunError, OSError, ValueError):
                    continue
                step = max(list(loss) + list(val) + [0])
                if step != last:
                    last = step
                    frac = min(1.0, step / max(1, run.steps))
                    vl = f", val {list(val.values())[-1] / LN2:.3f} bpb" if val else ""
                    self.say(f"{prefix}: step {step}/{run.steps}{vl}", frac * self.est[run.name])

        self.thread = threading.Thread(target=watch, daemon=True)
        self.thread.start()

    def end(self, i, run, summary, status):
        self.stop.set()
        self.thread.join()
        self.done += self.est[run.name]
        self.session_est += self.est[run.name]
        self.say(
            f"[{i + 1}/{len(self.runs)}] {run.name}: {status}, final val {summary['final']['val_bpb']:.4f} "
            "bpb"
        )

