"""
Checkpoints: plain dicts of tensors and Python values, so torch.load(weights_only=True) reads them, written
atomically with the one before kept as ckpt.prev.pt (save_checkpoint), so a resume can fall back to it
(load_resumable). Every loader (train.py's resume and --init_from=x.pt, sample.py, probe.py, the studies)
reads them through load_checkpoint, which strips wrapper prefixes and upgrades renamed config fields
(support.compat), and fits the weights through state_differences, which names every tensor that does not
fit. lock_out_dir keeps a second run out of a run's out_dir.

A train.py checkpoint holds: model, optimizer, scaler, step, best_val_loss, val_loss, rng (one entry per
rank: rng_states), model_config, train_config, tokenizer. The S5 study's: model, optimizer, scaler, step,
rng, state, model_config, train_config, s5_config (see support.loop).
"""

import contextlib
import errno
import fcntl
import glob
import os
import pickle
import random
import sys
import zipfile

import numpy as np
import torch

from support.compat import upgrade_config, upgrade_state_dict
from support.runtime import RunError, check_device


def state_differences(source: dict, own: dict, optional=lambda name: False) -> list:
    """Why the state dict `source` does not load into a model whose state dict is `own`, one message per tensor:
    another shape, a tensor the model lacks, a tensor of the model that source lacks (unless optional(name), e.g.
    the T²MLR gate, which keeps its identity initialisation). [] when it fits."""
    return ([f"{k} {tuple(v.shape)} vs this model's {tuple(own[k].shape)}"
             for k, v in source.items() if k in own and v.shape != own[k].shape]
            + [f"{k} is not in this model" for k in source if k not in own]
            + [f"{k} is missing" for k in own if k not in source and not optional(k)])


def rng_states(data_gen=None):
    """This process's RNG states (torch, CUDA, numpy, Python, the data sampler `data_gen` if any) as plain values."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
        "numpy": [kind, keys.tolist(), pos, has_gauss, gauss],
        "python": random.getstate(),
        "data": None if data_gen is None else data_gen.get_state(),
    }


def set_rng_states(states, data_gen=None):
    """Restore what rng_states() captured."""
    torch.set_rng_state(states["torch"])
    if states["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])
    kind, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])
    if data_gen is not None:
        data_gen.set_state(states["data"])


def save_checkpoint(path, ckpt):
    """Write ckpt to `path` so that a crash, a kill or a full disk at any moment leaves a complete checkpoint
    under `path` or previous_path(path): to temporary_path, fsynced, the one at `path` kept (keep_previous),
    renamed over `path` (atomic). Raises RunError naming `path`, the cause and the checkpoint left."""
    tmp, sink = temporary_path(path), None
    try:
        with open(tmp, "wb") as f:
            sink = RecordingWriter(f)
            torch.save(ckpt, sink)
            f.flush()
            os.fsync(f.fileno())
        if zipfile.is_zipfile(path):       # a complete archive (torch.save's format), not a damaged file
            keep_previous(path)
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:   # torch reports a failed write as RuntimeError, without the OSError
        if os.path.lexists(tmp) and not os.path.isdir(tmp):
            os.remove(tmp)
        raise RunError(write_failure(path, getattr(sink, "error", None) or e)) from None
    remove_stale_temporaries(path)


def temporary_path(path, pid=None):
    """Where save_checkpoint writes before renaming: `path`.PID.tmp, PID this process's (or `pid`)."""
    return f"{path}.{os.getpid() if pid is None else pid}.tmp"


def previous_path(path):
    """Where save_checkpoint keeps the checkpoint it replaces: out/ckpt.pt -> out/ckpt.prev.pt."""
    root, ext = os.path.splitext(path)
    return f"{root}.prev{ext}"


def keep_previous(path):
    """Make previous_path(path) name the file at `path`: a hard link, made under a temporary name and renamed
    over it, so both names always hold a complete file (no hard links here: `path` itself is renamed)."""
    prev, link = previous_path(path), temporary_path(previous_path(path))
    with contextlib.suppress(FileNotFoundError):     # left by a killed process that had this pid
        os.remove(link)
    try:
        os.link(path, link)
    except OSError:
        link = path
    os.replace(link, prev)


class RecordingWriter:
    """A file for torch.save that keeps the OSError of a failed write in .error (torch's RuntimeError drops it)."""

    def __init__(self, f):
        self.f, self.error, self.flush = f, None, f.flush

    def write(self, data):
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise


# the errors of a write that found no room, in words
NO_ROOM = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
           errno.EFBIG: "the file is larger than the file system or a size limit (ulimit -f) allows"}


def write_failure(path, error) -> str:
    """Why save_checkpoint could not write `path`, in one line (NO_ROOM's words first), and what is left."""
    if isinstance(error, OSError):
        reason = error.strerror or str(error)
        reason = f"{NO_ROOM[error.errno]} ({reason})" if error.errno in NO_ROOM else reason
    else:
        reason = f"torch.save failed: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
    kept = next((f"{p} still holds the last good checkpoint" for p in (path, previous_path(path))
                 if os.path.isfile(p)), "no checkpoint was written")
    return f"cannot write checkpoint {path}: {reason}; {kept}"


def remove_stale_temporaries(path):
    """Remove the temporary files of `path` and previous_path(path) whose writers died mid-write."""
    for tmp in glob.glob(f"{glob.escape(path)}.*.tmp") + glob.glob(f"{glob.escape(previous_path(path))}.*.tmp"):
        pid = tmp[:-len(".tmp")].rsplit(".", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):
                os.remove(tmp)


def process_alive(pid) -> bool:
    """Whether a process with id `pid` runs on this machine (signal 0 tests it without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:            # it runs, as another user
        pass
    return True


def load_checkpoint(path):
    """The checkpoint dict at `path`, on the CPU: its weights' keys cleaned (clean_state_dict), renamed
    parameters and config fields upgraded (support.compat). Raises RunError naming the path if it is missing,
    unreadable (unreadable_reason) or holds no model."""
    if not os.path.isfile(path):
        raise RunError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:    # truncated or foreign files fail in many ways (EOFError, UnpicklingError, ...)
        raise RunError(f"cannot read checkpoint {path}: {unreadable_reason(path, e)}") from None
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("model"), dict)):
        raise RunError(f"{path} is not a checkpoint of train.py: it has no 'model' state dict")
    stored = clean_state_dict(ckpt["model"], path)
    ckpt["model"] = upgrade_state_dict(stored)
    ckpt["gate_joined"] = "gate.A.weight" in ckpt["model"] and "gate.A.weight" not in stored
    if isinstance(ckpt.get("model_config"), dict):
        ckpt["model_config"] = upgrade_config(ckpt["model_config"],      # a renamed value: a note
                                              lambda text: print(f"note: {path}: {text}", file=sys.stderr))
    return ckpt


ZIP_MAGIC, LEGACY_MAGIC = b"PK\x03\x04", b"\x80\x02"   # torch.save's zip archive; its pre-1.6 pickle format


def unreadable_reason(path, error) -> str:
    """Why torch.load raised `error` on the file at `path`, in words: unreadable, empty, truncated, not written by
    torch.save, or holding more than tensors and plain values; else the error's type and first line."""
    if isinstance(error, OSError):
        return error.strerror or str(error)
    with open(path, "rb") as f:
        head = f.read(4)
    if not head:
        return "the file is empty"
    if head == ZIP_MAGIC and not zipfile.is_zipfile(path):
        return "an incomplete zip archive: the file is truncated (a write or copy that did not finish)"
    if head != ZIP_MAGIC and not head.startswith(LEGACY_MAGIC):
        return f"not a file torch.save wrote (those begin with {ZIP_MAGIC!r}, this one with {head!r})"
    if head == ZIP_MAGIC and not any(name.endswith("/data.pkl") for name in zipfile.ZipFile(path).namelist()):
        return "a zip archive that torch.save did not write (it holds no data.pkl)"
    if isinstance(error, pickle.UnpicklingError):   # not torch's advice, weights_only=False: wrong for a foreign file
        return "UnpicklingError: not a file of tensors and plain values that torch.save wrote"
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'truncated or damaged'}"


# Wrapped models save every key with a prefix: torch.compile `_orig_mod.`, DDP and DataParallel `module.`.
# train.py saves the raw model, but other nanoGPT-style tools save the wrapper's state dict.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def clean_state_dict(state, path):
    """The state dict `state` (of the checkpoint at `path`) with the WRAPPER_PREFIXES, in any nesting (e.g.
    `module._orig_mod.`), removed from every key. Raises RunError when two keys become one."""
    clean = {}
    for key, value in state.items():
        name = key
        while name.startswith(WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        if name in clean:
            raise RunError(f"{path} holds {name} twice (once as {key}): it is not the state dict of one model")
        clean[name] = value
    return clean


def tie_embeddings_state(state, model, path):
    """`state` made to fit how `model` ties its output head to the token embedding. A head absent (a tied model
    saved without the duplicate) is the embedding; a tied model holds ONE tensor, so a head that differs from
    the embedding (an untied checkpoint) is refused: RunError naming --tie_embeddings=False."""
    wte, head = state.get("wte.weight"), state.get("lm_head.weight")
    if wte is None:
        return state
    if head is None:
        return {**state, "lm_head.weight": wte}
    if model.cfg.tie_embeddings and wte.shape == head.shape and not torch.equal(wte, head):
        raise RunError(f"{path} has an output head lm_head.weight that differs from its token embedding wte.weight "
                       f"(an untied model), but this model ties them (tie_embeddings=True) into one tensor that "
                       f"cannot hold both: set --tie_embeddings=False")
    return state


def load_weights(model, state, path, optional=lambda name: False):
    """Copy the state dict `state` (of the checkpoint at `path`) into `model`, the embedding tie mapped
    (tie_embeddings_state); a tensor optional(name) that it lacks keeps its initialisation. Raises RunError
    naming the tensors that do not fit."""
    state = tie_embeddings_state(state, model, path)
    problems = state_differences(state, model.state_dict(), optional)
    if problems:
        more = f" and {len(problems) - 5} more" if len(problems) > 5 else ""
        raise RunError(f"{path} does not fit this model: " + "; ".join(problems[:5]) + more)
    model.load_state_dict(state, strict=False)


def load_model(path, device="cpu"):
    """(model in eval mode on device, checkpoint dict) from the train.py checkpoint at `path`, for sample.py
    and probe.py. Raises RunError when the device is not usable here (check_device), or the file is missing,
    unreadable, lacks its model_config, or does not fit this model.py."""
    from model import GPT, GPTConfig       # here, not at the top: model.py's loaders import this module
    check_device(device)
    ckpt = require_keys(load_checkpoint(path), path, ("model_config",))
    try:
        model = GPT(GPTConfig(**ckpt["model_config"]))
    except (KeyError, TypeError, ValueError) as e:   # a checkpoint from another version or tool
        raise RunError(f"{path} does not fit this model.py: {type(e).__name__}: {' '.join(str(e).split())}")
    load_weights(model, ckpt["model"], path)
    return model.to(device).eval(), ckpt


# What train.py's --init_from=resume reads from a checkpoint (support.loop.resume and train.py)
RESUME_KEYS = ("model", "optimizer", "step", "best_val_loss", "model_config", "train_config", "tokenizer")


def require_keys(ckpt, path, keys):
    """The checkpoint dict `ckpt` (read from `path`), or RunError naming every one of `keys` it lacks."""
    missing = [k for k in keys if k not in ckpt]
    if missing:
        raise RunError(f"{path} lacks {', '.join(missing)}: it is not a complete checkpoint of train.py "
                       f"(it holds {', '.join(map(str, ckpt)) or 'nothing'})")
    return ckpt


def load_resumable(path, keys=RESUME_KEYS):
    """(checkpoint dict, the path it was read from): the checkpoint at `path` when it loads and holds `keys`;
    else the previous one (previous_path), with a one-line warning naming both and why. Raises RunError, with
    the reason of each, when neither loads."""
    try:
        return require_keys(load_checkpoint(path), path, keys), path
    except RunError as e:
        prev = previous_path(path)
        if not os.path.isfile(prev):
            raise
        try:
            ckpt = require_keys(load_checkpoint(prev), prev, keys)
        except RunError as e_prev:
            raise RunError(f"{e}; and the previous checkpoint: {e_prev}") from None
        print(f"warning: {e}; resuming from the previous checkpoint {prev} (step {ckpt.get('step', '?')}) instead",
              file=sys.stderr)
        return ckpt, prev


def recorded_tokenizer(ckpt, path) -> str:
    """The tokenizer ("gpt2", "byte", "hf:...") the train.py checkpoint `ckpt` (read from `path`) recorded."""
    if "tokenizer" not in ckpt:           # e.g. an S5 study run, which has its own vocabulary
        raise RunError(f"{path} names no tokenizer: it is not a checkpoint of train.py")
    return ckpt["tokenizer"]


def init_weights_from(model, path):
    """Load the weights of the checkpoint at `path` into `model`, e.g. a vanilla model's into a T²MLR model of
    its shape (a retrofit): the T²MLR gate, which the source lacks, keeps its identity initialisation (θ = 0),
    so the first forward equals the source model's."""
    load_weights(model, load_checkpoint(path)["model"], path, optional=lambda name: name.startswith("gate."))


_LOCKS = {}          # the out_dir locks this process holds, by the lock file's real path


def refuse_if_locked(out_dir):
    """Raise RunError, naming its pid, when another process holds out_dir/.lock (lock_out_dir); writes nothing,
    so a run can ask before its checks and take the lock once they have passed."""
    path = os.path.join(out_dir, ".lock")
    if os.path.isfile(path) and os.path.realpath(path) not in _LOCKS:
        with open(path) as f:
            flock_or_refuse(f, fcntl.LOCK_SH, out_dir)


def flock_or_refuse(f, kind, out_dir):
    """fcntl.flock the open lock file `f` of out_dir (`kind`: LOCK_SH or LOCK_EX), or RunError naming the pid
    of the process that holds it."""
    try:
        fcntl.flock(f, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise RunError(f"{out_dir} is in use by another run (pid {holder}, which holds {f.name}): wait for it to "
                       f"end, or choose another out_dir") from None


def lock_out_dir(out_dir):
    """Hold out_dir/.lock (an exclusive flock, the holder's pid written in it) for as long as the returned open
    file is: the lock goes with the process however it ends (kill -9 included), so it is never stale. Creates
    out_dir. Raises RunError when another process holds it, or out_dir is '' or cannot be written."""
    if not out_dir:
        raise RunError("out_dir is empty (''): name the folder for the checkpoint and log, e.g. --out_dir=out")
    path = os.path.join(out_dir, ".lock")
    held = _LOCKS.pop(os.path.realpath(path), None)
    if held is not None:          # this process's own, from a run that ended in an exception: taken anew
        held.close()
    try:
        os.makedirs(out_dir, exist_ok=True)
        f = open(path, "a+")
    except OSError as e:
        raise RunError(f"cannot write in out_dir {out_dir}: {e.strerror or e}") from None
    flock_or_refuse(f, fcntl.LOCK_EX, out_dir)
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _LOCKS[os.path.realpath(path)] = f
    return f
