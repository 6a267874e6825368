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
    """Why the state dict `source` does not load into a model whose state dict is `own`, one message per
    tensor: a shape that differs, a tensor the model lacks, a tensor of the model that source lacks (unless
    optional(name), e.g. the T²MLR gate, which keeps its identity initialisation). [] when it fits; used by
    support.pretrained.load_hf_weights and by the loaders below."""
    return (
        [f"{k} {tuple(v.shape)} vs this model's {tuple(own[k].shape)}"
         for k, v in source.items() if k in own and v.shape != own[k].shape]
        + [f"{k} is not in this model" for k in source if k not in own]
        + [f"{k} is missing" for k in own if k not in source and not optional(k)]
    )


def rng_states(data_gen=None):
    """This process's RNG states (torch, CUDA, numpy, Python, and the data sampler `data_gen` if there is
    one) as tensors, lists and ints."""
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
    under `path` or previous_path(path), and `path` only ever holds a complete one.

    It is written to temporary_path(path) (this process's own name) and fsynced, so that after a machine
    crash the new name never points at data still in the page cache; then the checkpoint now at `path` is
    kept as previous_path(path) (keep_previous), and the new file is renamed over `path` (os.replace is
    atomic on one file system). Temporaries that killed writers left beside `path` are removed afterwards.
    Raises RunError, naming `path` and the cause (e.g. a full disk), when the folder cannot be written or
    the write fails; the temporary file is then removed and `path` keeps the last good checkpoint."""
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
    except (OSError, RuntimeError) as e:
        # torch's writer reports a failed write as RuntimeError("[enforce fail at inline_container.cc...");
        # the OSError behind it (ENOSPC, EFBIG, ...) is the one the file object saw
        cause = getattr(sink, "error", None) or e
        if os.path.lexists(tmp) and not os.path.isdir(tmp):
            os.remove(tmp)
        raise RunError(write_failure(path, cause)) from None
    remove_stale_temporaries(path)


def temporary_path(path, pid=None):
    """The temporary file save_checkpoint writes before renaming it to `path`: `path`.PID.tmp, PID this
    process's id (or `pid`), so two processes never write into one temporary file."""
    return f"{path}.{os.getpid() if pid is None else pid}.tmp"


def previous_path(path):
    """Where save_checkpoint keeps the checkpoint it replaces: out/ckpt.pt -> out/ckpt.prev.pt."""
    root, ext = os.path.splitext(path)
    return f"{root}.prev{ext}"


def keep_previous(path):
    """Make previous_path(path) name the file now at `path`: a hard link made under a temporary name and
    renamed over the previous one, so `path` stays in place and both names always hold a complete file;
    where the file system has no hard links, `path` itself is renamed (save_checkpoint renames the new
    checkpoint to `path` right after)."""
    prev = previous_path(path)
    link = temporary_path(prev)
    with contextlib.suppress(FileNotFoundError):     # left by a killed process that had this pid
        os.remove(link)
    try:
        os.link(path, link)
    except OSError:
        os.replace(path, prev)
        return
    os.replace(link, prev)


class RecordingWriter:
    """A binary file for torch.save that keeps the OSError of a failed write in .error (torch reports it
    only as a RuntimeError without the cause)."""

    def __init__(self, f):
        self.f, self.error = f, None

    def write(self, data):
        try:
            return self.f.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self):
        self.f.flush()


# the errors of a write that found no room, in words
NO_ROOM = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
           errno.EFBIG: "the file is larger than the file system or a size limit (ulimit -f) allows"}


def write_failure(path, error) -> str:
    """The one-line reason why save_checkpoint could not write `path`: the OSError's message (NO_ROOM's words
    first when the disk is full) or torch's, and which checkpoint is left."""
    if isinstance(error, OSError):
        reason = error.strerror or str(error)
        if error.errno in NO_ROOM:
            reason = f"{NO_ROOM[error.errno]} ({reason})"
    else:
        reason = f"torch.save failed: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
    kept = next((f"{p} still holds the last good checkpoint" for p in (path, previous_path(path))
                 if os.path.isfile(p)), "no checkpoint was written")
    return f"cannot write checkpoint {path}: {reason}; {kept}"


def remove_stale_temporaries(path):
    """Remove the temporary files (temporary_path) that writers of `path` or of its previous_path, now dead,
    left behind (a process killed mid-write). A live process's file is left alone."""
    for pattern in (f"{glob.escape(path)}.*.tmp", f"{glob.escape(previous_path(path))}.*.tmp"):
        for tmp in glob.glob(pattern):
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
    """The checkpoint dict at `path`, on the CPU. Raises RunError naming the path if it is missing or
    unreadable."""
    if not os.path.isfile(path):
        raise RunError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    # truncated or foreign files fail in many ways (EOFError, UnpicklingError, IndexError, KeyError, ...)
    except Exception as e:
        raise RunError(f"cannot read checkpoint {path}: {unreadable_reason(path, e)}") from None
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("model"), dict)):
        raise RunError(f"{path} is not a checkpoint of train.py: it has no 'model' state dict")
    stored = clean_state_dict(ckpt["model"], path)
    ckpt["model"] = upgrade_state_dict(stored)                          # renamed parameters
    ckpt["gate_joined"] = "gate.A.weight" in ckpt["model"] and "gate.A.weight" not in stored
    if isinstance(ckpt.get("model_config"), dict):       # fields renamed since the checkpoint was written
        ckpt["model_config"] = upgrade_config(ckpt["model_config"])
    return ckpt


ZIP_MAGIC, LEGACY_MAGIC = b"PK\x03\x04", b"\x80\x02"   # torch.save's zip archive; its pre-1.6 pickle format


def unreadable_reason(path, error) -> str:
    """Why torch.load raised `error` on the file at `path`, in words: unreadable, empty, a truncated zip
    archive, not a file torch.save wrote, or one holding more than tensors and plain values; else the
    error's type and first line."""
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
    # torch's weights-only refusal suggests weights_only=False, which is wrong advice for a foreign file
    if isinstance(error, pickle.UnpicklingError):
        return "UnpicklingError: not a file of tensors and plain values that torch.save wrote"
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'truncated or damaged'}"


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
    and probe.py. Raises RunError when the device is not usable here (check_device), or the file is missing,
    unreadable, lacks its model_config, or does not fit this model.py."""
    from model import GPT, GPTConfig       # here, not at the top: model.py's loaders import this module
    check_device(device)
    ckpt = load_checkpoint(path)
    require_keys(ckpt, path, ("model_config",))
    try:
        model = GPT(GPTConfig(**ckpt["model_config"]))
    except (KeyError, TypeError, ValueError) as e:   # a checkpoint from another version or tool
        raise RunError(f"{path} does not fit this model.py: {type(e).__name__}: {' '.join(str(e).split())}")
    load_weights(model, ckpt["model"], path)
    return model.to(device).eval(), ckpt


# What train.py's --init_from=resume reads from a checkpoint (support.loop.resume and train.setup)
RESUME_KEYS = ("model", "optimizer", "step", "best_val_loss", "model_config", "train_config", "tokenizer")


def require_keys(ckpt, path, keys):
    """Raise RunError naming the file `path` and every one of `keys` that the checkpoint dict `ckpt` lacks
    (e.g. RESUME_KEYS before a resume)."""
    missing = [k for k in keys if k not in ckpt]
    if missing:
        raise RunError(f"{path} lacks {', '.join(missing)}: it is not a complete checkpoint of train.py "
                       f"(it holds {', '.join(map(str, ckpt)) or 'nothing'})")


def load_resumable(path, keys=RESUME_KEYS):
    """(checkpoint dict, the path it was read from): the checkpoint at `path` (out_dir/ckpt.pt) when it
    loads and holds `keys`; else the previous one that save_checkpoint kept (previous_path), with a
    one-line notice on stderr naming both and why. Raises RunError when neither loads: the reason of each."""
    try:
        ckpt = load_checkpoint(path)
        require_keys(ckpt, path, keys)
        return ckpt, path
    except RunError as e:
        prev = previous_path(path)
        if not os.path.isfile(prev):
            raise
        try:
            ckpt = load_checkpoint(prev)
            require_keys(ckpt, prev, keys)
        except RunError as e_prev:
            raise RunError(f"{e}; and the previous checkpoint: {e_prev}") from None
        print(f"warning: {e}; resuming from the previous checkpoint {prev} (step {ckpt.get('step', '?')}) "
              f"instead",
              file=sys.stderr)
        return ckpt, prev


def recorded_tokenizer(ckpt, path) -> str:
    """The tokenizer name ("gpt2", "byte", "hf:...") the train.py checkpoint `ckpt` (read from `path`) recorded.
    Raises RunError when it names none (e.g. an S5 study run, which has its own vocabulary)."""
    if "tokenizer" not in ckpt:
        raise RunError(f"{path} names no tokenizer: it is not a checkpoint of train.py")
    return ckpt["tokenizer"]


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


_LOCKS = {}          # the out_dir locks this process holds, by the lock file's real path


def refuse_if_locked(out_dir):
    """Raise RunError, naming its pid, when another process holds out_dir/.lock (lock_out_dir); writes
    nothing, so a run can ask before its checks and take the lock only once they have passed."""
    path = os.path.join(out_dir, ".lock")
    if not os.path.isfile(path) or os.path.realpath(path) in _LOCKS:
        return
    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = f.read().strip() or "unknown"
            raise RunError(f"{out_dir} is in use by another run (pid {holder}, which holds {path}): wait for it "
                           f"to end, or choose another out_dir") from None


def lock_out_dir(out_dir):
    """Hold out_dir/.lock (an exclusive fcntl.flock) for as long as the returned open file is: keep it
    referenced for the whole run. The lock goes with the process however it ends (kill -9 included), so it is
    never stale. The holder's pid is written into the file. Creates out_dir if needed. Raises RunError when
    another process holds the lock (naming its pid), or when out_dir is empty ('') or cannot be written."""
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
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise RunError(f"{out_dir} is in use by another run (pid {holder}, which holds {path}): wait for it to "
                       f"end, or choose another out_dir") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    _LOCKS[os.path.realpath(path)] = f
    return f
