"""
Data: the flat token files that prepare_data.py writes (data_dir/{train,val}.bin and meta.json), checked
against meta.json (load_meta) and the tokenizer's vocabulary (check_token_ids), and read through np.memmap
in windows of block_size + 1 tokens, each read refusing a file rewritten since it was checked. train.py
draws its training windows with step_starts and scores the fixed val_starts; probe.py reads the same val
windows.
"""

import json
import os

import numpy as np
import torch

from support.runtime import RunError


def prepare_command(data_dir, tokenizer=None):
    """The prepare_data.py command that writes data_dir (= OUT_DIR/NAME), with `tokenizer` when the run needs
    one other than the default (e.g. a released model's 'hf:...')."""
    parent, name = os.path.split(os.path.normpath(data_dir))
    source = {"pydoc": "--source pydoc --tokenizer byte", "fineweb_edu": "--source fineweb-edu"}.get(
        name, f"--input <your files> --name {name}")
    if tokenizer:
        source = source.replace(" --tokenizer byte", "") + f" --tokenizer {tokenizer}"
    return f"python prepare_data.py {source}" + (f" --out_dir {parent or '.'}" if parent != "data" else "")


def load_meta(data_dir, block_size, tokenizer=None, needs=()):
    """data_dir/meta.json (read_meta; `needs`: the optional fields the caller reads, e.g. ("tokenizer",)), both
    splits checked against it. Raises RunError, naming the prepare command, when the folder or meta.json is
    missing, a .bin file's size disagrees with meta.json, the vocabulary does not fit the token dtype, or a
    split is shorter than block_size + 1. Records each .bin file's identity, which get_batch checks."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.isfile(path):        # prepare_data.py deletes it first and writes it last
        interrupted = os.path.isdir(data_dir) and any(f.endswith(".tmp") for f in os.listdir(data_dir))
        raise RunError(f"no {path}" + (" (an interrupted prepare_data.py run left *.tmp files)" if interrupted else "")
                       + f": prepare the data first with `{prepare_command(data_dir, tokenizer)}`")
    meta = read_meta(path, data_dir, needs)
    itemsize = np.dtype(meta["dtype"]).itemsize
    if meta["vocab_size"] > 2 ** (8 * itemsize):   # ids >= 2**bits would have wrapped around when written
        raise RunError(f"vocab_size {meta['vocab_size']} does not fit {meta['dtype']} tokens (ids up to "
                       f"{2 ** (8 * itemsize) - 1}); re-run `{prepare_command(data_dir)}`, which picks uint32")
    for split in ("train", "val"):
        bin_path, n = os.path.join(data_dir, f"{split}.bin"), meta[f"{split}_tokens"]
        stat = os.stat(bin_path) if os.path.exists(bin_path) else None
        if (stat.st_size if stat else 0) != n * itemsize:
            raise RunError(f"{bin_path} has {stat.st_size if stat else 0} bytes but meta.json says {n} tokens x "
                           f"{itemsize} bytes: the data is incomplete, re-run `{prepare_command(data_dir)}`")
        if n < block_size + 1:          # one window needs block_size inputs plus the next token as target
            more = "--val_fraction (more validation tokens)" if split == "val" else "more data"
            raise RunError(f"block_size = {block_size} needs at least {block_size + 1} tokens in each split, but "
                           f"{bin_path} has {n}: set --block_size <= {n - 1}, or re-run prepare_data.py with {more}")
        CHECKED[os.path.abspath(bin_path)] = file_identity(stat)
    return meta


# meta.json's fields: the ones every reader needs, and those prepare_data.py writes that only some readers
# need (train.py the tokenizer; check_token_ids max_token_id, the largest id in the .bin files, when it is there)
META_FIELDS = {"vocab_size": int, "dtype": str, "train_tokens": int, "val_tokens": int}
OPTIONAL_META_FIELDS = {"tokenizer": str, "max_token_id": int}


def read_meta(path, data_dir, needs=()) -> dict:
    """The meta.json at `path` (in data_dir): META_FIELDS and the optional fields in `needs`, each of its type
    (counts >= 0, dtype an unsigned integer type). Raises RunError naming the file and what is wrong, with the
    prepare command that rewrites it."""
    redo = f"re-run `{prepare_command(data_dir)}`"
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else f"not valid JSON ({e})"
        raise RunError(f"cannot read {path}: {reason}; {redo}") from None
    if not isinstance(meta, dict):
        raise RunError(f"{path} holds a JSON {type(meta).__name__}, not an object of fields; {redo}")
    missing = [k for k in [*META_FIELDS, *needs] if k not in meta]
    if missing:
        raise RunError(f"{path} lacks {', '.join(missing)}: it is incomplete or not from prepare_data.py; {redo}")
    for key, kind in {**META_FIELDS, **{k: t for k, t in OPTIONAL_META_FIELDS.items() if k in meta}}.items():
        value = meta[key]
        if not isinstance(value, kind) or kind is int and (isinstance(value, bool) or value < 0):
            raise RunError(f"{path}: {key} is {value!r}, not {'an integer >= 0' if kind is int else 'a string'}; "
                           f"{redo}")
    try:
        unsigned = np.dtype(meta["dtype"]).kind == "u"
    except TypeError:
        unsigned = False
    if not unsigned:
        raise RunError(f"{path}: dtype {meta['dtype']!r} is not an unsigned integer type such as 'uint16' or "
                       f"'uint32'; {redo}")
    return meta


def check_token_ids(data_dir, meta, vocab_size, chunk=1 << 24):
    """Raise RunError, naming the file, the id, its position and vocab_size, when data_dir's train.bin or val.bin
    holds a token id >= vocab_size (one the tokenizer cannot produce). Reads meta's max_token_id when both files
    are as prepare_data.py recorded them (bins_unchanged); else scans them, `chunk` tokens at a time."""
    made = f"the {meta['tokenizer']} tokenizer" if "tokenizer" in meta else "this vocabulary"
    redo = f"the data was not made with {made}; re-run `{prepare_command(data_dir)}`"
    if "max_token_id" in meta and bins_unchanged(data_dir, meta):
        if meta["max_token_id"] >= vocab_size:
            raise RunError(f"{os.path.join(data_dir, 'meta.json')} records max_token_id {meta['max_token_id']}, "
                           f"but the vocabulary has {vocab_size} ids (0 to {vocab_size - 1}): {redo}")
        return
    for split in ("train", "val"):
        path = os.path.join(data_dir, f"{split}.bin")
        data = np.memmap(path, dtype=meta["dtype"], mode="r")
        for start in range(0, len(data), chunk):
            block = data[start:start + chunk]
            if block.max() >= vocab_size:
                at = int(np.argmax(block >= vocab_size))
                raise RunError(f"{path} holds token id {block[at]} at position {start + at}, but the vocabulary "
                               f"has {vocab_size} ids (0 to {vocab_size - 1}): {redo}")


def bins_unchanged(data_dir, meta) -> bool:
    """Whether train.bin and val.bin have the [size, mtime] meta.json's "files" recorded (False when it has none)."""
    recorded = meta.get("files")
    return isinstance(recorded, dict) and all(
        recorded.get(name) == [(st := os.stat(os.path.join(data_dir, name))).st_size, st.st_mtime_ns]
        for name in ("train.bin", "val.bin"))


# os.stat identity (file_identity) of every .bin file load_meta checked, by absolute path: get_batch refuses a
# file that changed since (data rewritten under a running run)
CHECKED = {}


def file_identity(stat):
    """(size, mtime in ns, device, inode) of an os.stat result: equal while a file is not rewritten or replaced."""
    return stat.st_size, stat.st_mtime_ns, stat.st_dev, stat.st_ino


def check_unchanged(path, stat):
    """Raise RunError when the file at `path`, whose os.stat is `stat`, is not the one load_meta checked
    (CHECKED): another size, or rewritten or replaced. Files load_meta never saw pass."""
    was = CHECKED.get(os.path.abspath(path))
    if was is None or was == file_identity(stat):
        return
    change = (f"{was[0]} bytes then, {stat.st_size} now" if was[0] != stat.st_size
              else "the same size, but rewritten or replaced")
    raise RunError(f"{path} changed since the run checked it ({change}): something rewrote the data under the "
                   f"run (another prepare_data.py?); restart the run once the data is complete")


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
    """n_windows evenly strided window starts from 0 to n_tokens - block_size - 1, both included: fixed, so
    every run and every variant is scored on the same tokens."""
    last = n_tokens - block_size - 1
    return [i * last // max(n_windows - 1, 1) for i in range(n_windows)]


def get_batch(path, dtype, starts, block_size, device):
    """Inputs x and targets y, both (len(starts), block_size) int64 on device; y is x shifted by one token.
    Raises RunError when the file at `path` changed since load_meta checked it (check_unchanged)."""
    # Re-open the memmap for every batch to avoid a memory leak, as nanoGPT does:
    # https://stackoverflow.com/questions/45132940/numpy-memmap-memory-usage-want-to-iterate-once/61472122
    with open(path, "rb") as f:
        check_unchanged(path, os.fstat(f.fileno()))     # the file mapped is the file load_meta checked
        data = np.memmap(f, dtype=dtype, mode="r")
    x = torch.stack([torch.from_numpy(data[s:s + block_size].astype(np.int64)) for s in starts])
    y = torch.stack([torch.from_numpy(data[s + 1:s + 1 + block_size].astype(np.int64)) for s in starts])
    if device.startswith("cuda"):       # pinned memory lets the copy overlap with compute
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)
