"""
Checkpoints: plain dicts of tensors and Python values, so torch.load(weights_only=True) reads them, written
atomically. Every loader (train.py's resume and --init_from=x.pt, sample.py, probe.py, the studies) reads
them through load_checkpoint, which strips wrapper prefixes and upgrades renamed config fields
(support.compat), and fits the weights through state_differences, which names every tensor that does not
fit.

A train.py checkpoint holds: model, optimizer, scaler, step, best_val_loss, val_loss, rng (one entry per
rank: rng_states), model_config, train_config, tokenizer. The S5 study's: model, optimizer, scaler, step,
rng, state, model_config, train_config, s5_config (see support.loop).
"""

import os
import pickle
import random

import numpy as np
import torch

from support.compat import upgrade_config
from support.runtime import RunError


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
        # torch's weights-only refusal suggests weights_only=False, which is wrong advice for a foreign file
        reason = ("not a file of tensors and plain values that torch.save wrote" if isinstance(e, pickle.UnpicklingError)
                  else str(e).splitlines()[0] if str(e) else "")
        raise RunError(f"cannot read checkpoint {path}: {type(e).__name__}: {reason}")
    if not (isinstance(ckpt, dict) and isinstance(ckpt.get("model"), dict)):
        raise RunError(f"{path} is not a checkpoint of train.py: it has no 'model' state dict")
    ckpt["model"] = clean_state_dict(ckpt["model"], path)
    if isinstance(ckpt.get("model_config"), dict):       # fields renamed since the checkpoint was written
        ckpt["model_config"] = upgrade_config(ckpt["model_config"])
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
    from model import GPT, GPTConfig       # here, not at the top: model.py's loaders import this module
    ckpt = load_checkpoint(path)
    try:
        model = GPT(GPTConfig(**ckpt["model_config"]))
    except (KeyError, TypeError, ValueError) as e:   # a checkpoint from another version or tool
        raise RunError(f"{path} does not fit this model.py: {type(e).__name__}: {' '.join(str(e).split())}")
    load_weights(model, ckpt["model"], path)
    return model.to(device).eval(), ckpt


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
