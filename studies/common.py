"""
What the studies share: the LSTM baseline and its parameter matching, and the pieces of one run, each a
plain function: open_run (the trainer, resumed from its checkpoint when there is one), gate_values (θ of a
T²MLR model), read_json and write_json (a run's results, written atomically); and the length curriculum
both tasks train under (curriculum_length, advance_curriculum). Each study writes its own
loop with them: a train-step, an evaluate-and-save at support.loop.evaluation_due, the results JSON.
"""

import json
import os
import subprocess

import torch
import torch.nn as nn
import torch.nn.functional as F

from support.checkpoints import load_checkpoint
from support.loop import make_trainer, resume
from support.runtime import RunError


# -----------------------------------------------------------------------------
# The LSTM baseline: torch.nn.LSTM between a tied embedding and output head

class LSTMLM(nn.Module):
    """Embedding (V x H) -> nn.LSTM (layers x H) -> the embedding matrix again as output head (tied).
    forward(idx (B, T), targets (B, T) or None, **ignored) -> (logits (B, T, V), mean CE over
    labels != -1)."""

    def __init__(self, vocab_size: int, hidden: int, layers: int):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)

    def forward(self, idx, targets=None, **ignored):
        h, _ = self.lstm(self.wte(idx))
        logits = F.linear(h, self.wte.weight)
        loss = (
            None
            if targets is None
            else F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)
        )
        return logits, loss


def lstm_hidden_for(target_params: int, vocab_size: int, layers: int) -> int:
    """The LSTM width whose parameter count (tied embedding V·H plus per layer 4·(2H² + 2H)) is closest to
    target_params: how the configs match the baseline to the transformer."""
    count = lambda h: vocab_size * h + layers * 4 * (2 * h * h + 2 * h)
    return min(range(8, 4096), key=lambda h: abs(count(h) - target_params))




# -----------------------------------------------------------------------------
# One run's pieces

def open_run(model, cfg, ckpt_path, check, device="cpu", dtype=torch.float32):
    """(trainer, start step, the checkpoint dict or None): a support.loop Trainer for `model` under `cfg` (a
    train.TrainConfig), resumed from ckpt_path when a checkpoint is there. check(ckpt) raises RunError when
    the checkpoint is another run's."""
    trainer = make_trainer(model, cfg, device, dtype, ckpt_path)
    if not os.path.exists(ckpt_path):
        return trainer, 0, None
    ckpt = load_checkpoint(ckpt_path)
    check(ckpt)
    return trainer, resume(trainer, ckpt, ckpt_path), ckpt


def gate_values(model) -> dict:
    """T²MLR: the global gates θ_r, θ_x now (how far the recurrent path opened); {} for other models."""
    gate = getattr(model, "gate", None)
    return {} if gate is None else {"theta_r": gate.theta_r.item(), "theta_x": gate.theta_x.item()}


def git_commit() -> str:
    """The commit of the code a study runs (the checkout or worktree it imports from), with "+dirty" when
    tracked files differ from it; "unknown" outside git. Every run's JSON records it, so a run resumed
    later can be checked to use the same code."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def read_json(path):
    """The JSON at path; RunError naming the file when it is not valid JSON (a truncated write)."""
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise RunError(f"{path} is not valid JSON ({e}); delete it to rerun its run") from None


def write_json(path, doc):
    """Write doc to path atomically: a .tmp beside it, then os.replace."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(path + ".tmp", path)


# -----------------------------------------------------------------------------
# The length curriculum (Irie et al. 2026): train short, one more step of length once the loss is low

def curriculum_length(state, curriculum, full: int) -> int:
    """The length trained at the next step: `full` without a curriculum (None); with one ({"start",
    "threshold"}), the length it has reached (state["length"], from curriculum["start"])."""
    return full if curriculum is None else state.setdefault("length", curriculum["start"])


def advance_curriculum(state, curriculum, full: int, loss: float):
    """After a step with training loss `loss`: an exponential mean of the loss (weight 0.1 on the newest
    step), restarted at every length; once it falls below curriculum["threshold"] the next step trains one
    more, up to `full`. state["length"] and state["loss_mean"] carry it across a resume; state["lengths"]
    records the step (state["steps_done"]) each length started."""
    if curriculum is None or state["length"] >= full:
        return
    mean = state.get("loss_mean")
    state["loss_mean"] = loss if mean is None else 0.9 * mean + 0.1 * loss
    if state["loss_mean"] < curriculum["threshold"]:
        state["length"] += 1
        state["loss_mean"] = None
        state.setdefault("lengths", {})[str(state["length"])] = state["steps_done"]
