"""
Sample from a trained model: reads out_dir/ckpt.pt (written by train.py) and prints continuations.

    python sample.py --out_dir=out/tiny_mesh --start="def main(" --num_samples=3 --max_new_tokens=200
    python sample.py --out_dir=out/tiny_mesh --start=FILE:prompt.txt --temperature=0     # greedy
    python sample.py --out_dir=out/tiny_mesh --prompts=prompts.txt     # one prompt a line, in batches
    python sample.py --help
"""

import glob
import os
import sys
from dataclasses import dataclass
from typing import Optional

import torch
from tqdm import tqdm

from configurator import ConfigError, load_config
from model import check
from support.accounting import count_middle_passes
from support.checkpoints import load_model, recorded_tokenizer
from support.config import check_settings
from support.process import keeps_process_state
from support.runtime import RunError, autocast_context, check_device, resolve_device, resolve_dtype
from support.tokenizers import DataError, get_tokenizer


@dataclass
class SampleConfig:
    out_dir: str = "out"                  # folder holding ckpt.pt
    start: str = "\n"                     # the prompt, or FILE:<path> to read it from; "" = the EOT token
    prompts: str = ""                     # a file of prompts, one a line, continued in batches (not --start)
    num_samples: Optional[int] = None     # continuations of each prompt; None = 3 of --start, 1 per --prompts
    batch_size: int = 16                  # prompts continued at once (left-padded: each as it would alone)
    stop_at_eot: bool = True              # a continuation ends at the end-of-text token; False: max_new_tokens
    max_new_tokens: int = 500             # tokens generated per sample
    temperature: float = 0.8              # < 1 sharpens, > 1 flattens the distribution; 0 = greedy
    top_k: Optional[int] = 200            # sample among the k most likely tokens (at most V); None = all
    seed: int = 1337                      # seeds the sampling generator: same seed, same samples
    recurrent_prompt: bool = True         # T²MLR: prompt tokens recurrent (c = 2, as trained); False: c = 1
    prefill: str = "exact"                # T²MLR: the prompt token by token ('exact'), or 'converged'
    prefill_tol: float = 0.0              # 'converged': stop once the state moves less; 0 = all T sweeps
    n_loops: Optional[int] = None         # recursive: loops of the core at test time; None = as trained (K)
    exit_threshold: Optional[float] = None  # recursive: a token stops looping once its state moves less
    device: str = "auto"                  # 'auto' (cuda > mps > cpu), 'cpu', 'cuda', 'mps'
    dtype: str = "auto"                   # 'auto' (bf16 on CUDA if supported, else fp32), float32, bfloat16

    def __post_init__(self):
        check_settings(self, SAMPLE_SETTINGS)
        check(**{name: getattr(self, name) for name in SAMPLER_SETTINGS})


# The script's own settings (support.config.check_settings; a float must also be finite). seed: what
# torch.Generator.manual_seed accepts. The sampler's settings are model.generate's arguments: model.check,
# which generate calls, refuses a bad one here already, before a checkpoint is read.
SAMPLE_SETTINGS = {"num_samples": ">= 1", "batch_size": ">= 1", "max_new_tokens": ">= 0",
                   "seed": "[0, 18446744073709551615]"}
SAMPLER_SETTINGS = ("temperature", "top_k", "prefill", "prefill_tol", "n_loops", "exit_threshold")


@keeps_process_state
def main(argv):
    """Print num_samples continuations of each prompt (--start, or every line of --prompts), batch_size
    prompts at a time. Raises ConfigError, RunError (bad checkpoint or prompt file) or DataError (the tokenizer
    cannot load)."""
    (cfg,), _ = load_config(argv, SampleConfig)
    device = resolve_device(cfg.device)
    check_device(device)
    device_type = device.split(":")[0]
    autocast = autocast_context(device_type, resolve_dtype(cfg.dtype, device_type))

    if cfg.prompts and cfg.start != SampleConfig.start:
        raise ConfigError("give --start (one prompt) or --prompts (a file of them), not both")
    texts = read_prompts(cfg)

    path = os.path.join(cfg.out_dir, "ckpt.pt")
    if not os.path.isfile(path):        # name the folders that hold one (train.py's out_dir, under out/)
        found = sorted(os.path.dirname(p) for p in glob.glob("out/**/ckpt.pt", recursive=True))
        where = (f"checkpoints are in: {', '.join(found[:8])}{' ...' if len(found) > 8 else ''}; pick one with "
                 f"--out_dir=<folder>" if found else "no ckpt.pt under out/: train one first (python train.py "
                 "config/tiny_mesh.py), or give --out_dir=<the folder of train.py's run>")
        raise RunError(f"no checkpoint at {path} (--out_dir={cfg.out_dir}); {where}")
    model, ckpt = load_model(path, device)             # eval mode; generate runs T²MLR exactly (its cache)
    model_cfg = model.cfg
    tokenizer = get_tokenizer(recorded_tokenizer(ckpt, path))
    val_loss = f", val loss {ckpt['val_loss']:.4f}" if isinstance(ckpt.get("val_loss"), float) else ""
    print(f"{path}: step {ckpt.get('step', '?')}{val_loss}", file=sys.stderr)

    prompts, copies = [], cfg.num_samples or (1 if cfg.prompts else 3)
    for n, text in enumerate(texts, 1):
        ids = tokenizer.encode(text) or [tokenizer.eot]   # the model needs at least one token to condition on
        if len(ids) > model_cfg.block_size:
            print(f"{f'prompt {n}' if cfg.prompts else 'prompt'} has {len(ids)} tokens; keeping its last "
                  f"block_size = {model_cfg.block_size}", file=sys.stderr)
            ids = ids[-model_cfg.block_size:]
        prompts += [torch.tensor(ids, dtype=torch.long, device=device)] * copies
    if not model_cfg.layout and (cfg.n_loops is not None or cfg.exit_threshold is not None):
        raise ConfigError(f"--n_loops and --exit_threshold need a recursive model ('P+NRK+Q'); {path} has no loops")
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    # T²MLR, converged prefill: the middle-layer passes of the prompt, generate's first forward
    prompt_passes = []
    if model_cfg.t2mlr and cfg.prefill == "converged":
        passes = count_middle_passes(model)
        model.register_forward_hook(lambda module, args, output: prompt_passes.append(passes.n))

    stop = tokenizer.eot if cfg.stop_at_eot and tokenizer.eot < model_cfg.vocab_size else None
    loops = []                           # recursive: each batch's mean loops a position used, per prompt
    for first in tqdm(range(0, len(prompts), cfg.batch_size), desc="batches", unit="batch", file=sys.stderr,
                      disable=len(prompts) <= cfg.batch_size):
        batch, stats = prompts[first:first + cfg.batch_size], {}
        with autocast:
            outs = model.generate(
                batch,
                cfg.max_new_tokens,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                generator=generator,
                recurrent_prompt=cfg.recurrent_prompt,
                prefill=cfg.prefill,
                prefill_tol=cfg.prefill_tol,
                n_loops=cfg.n_loops,
                exit_threshold=cfg.exit_threshold,
                stop_token=stop,
                stats=stats,
            )
        loops += [stats["mean_loops"]] * len(batch) if "mean_loops" in stats else []
        for prompt, row in zip(batch, outs):
            row = row.tolist()
            if stop is not None and len(row) > len(prompt) and row[-1] == stop:
                row = row[:-1]                         # the end-of-text that ended it
            # ids >= the tokenizer's vocabulary are padding rows of the embedding, never seen in training;
            # drop them so decoding cannot fail on an untrained model
            print(tokenizer.decode([i for i in row if i < tokenizer.vocab_size]), flush=True)
            print("-" * 80, flush=True)
    if model_cfg.t2mlr and cfg.prefill == "converged":      # the prompt's sweeps
        print(f"prefill: parallel Jacobi, tol {cfg.prefill_tol:g}: middle-layer passes {prompt_passes[0]} "
              f"(exact prefill: one per token)", file=sys.stderr)
    if loops:
        print(f"loops: {sum(loops) / len(loops):.2f} a position on average (of at most {cfg.n_loops or model_cfg.n_loops}"
              f"{f', exit threshold {cfg.exit_threshold:g}' if cfg.exit_threshold is not None else ''})",
              file=sys.stderr)


def read_prompts(cfg):
    """The prompts as text: --start (FILE:<path> reads one prompt from a file), or --prompts, a file of one
    prompt a line. Raises RunError naming a file that cannot be read or a line that is empty."""
    path = cfg.prompts or (cfg.start[5:] if cfg.start.startswith("FILE:") else None)
    if path is None:
        return [cfg.start]
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise RunError(f"cannot read prompt file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise RunError(f"prompt file {path} is not UTF-8 text (byte {e.start} is "
                       f"{e.object[e.start:e.start + 1]!r}): give a text file") from None
    if not cfg.prompts:
        return [text]
    lines = text.splitlines()
    if not lines or "" in lines:
        where = f"line {lines.index('') + 1} is empty" if lines else "has no prompts"
        raise RunError(f"prompt file {path} {where}: give one prompt a line")
    return lines


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ConfigError, DataError, RunError) as e:
        sys.exit(f"error: {e}")
