"""
Data: the flat token files that prepare_data.py writes (data_dir/{train,val}.bin and meta.json), checked
against meta.json and read through np.memmap in windows of block_size + 1 tokens. train.py draws its
training windows with step_starts and scores the fixed val_starts; probe.py reads the same val windows.
"""

import json
import os

import numpy as np
import torch

from support.runtime import RunError


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
