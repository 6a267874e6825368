"""
What the T²MLR state carries: the loss (and the accuracy) per position when the state fed to the tokens is
changed. For any T²MLR checkpoint of train.py (or a model built by a study):

    python -m studies.state_probe out/tiny_t2mlr/ckpt.pt                 # 16 val windows of block_size tokens
    python -m studies.state_probe out/tiny_t2mlr/ckpt.pt --num_seqs 64 --reset_at 64

Token t reads the state R_{t-1} (README (T1), (T2): both the gate and the state update read it). An ablation
replaces what token t reads, and everything downstream follows from it:

    none           R_{t-1} as the model computes it (the exact recurrence, R_{-1} = 0)
    carry off      every token reads 0: R_t = update(h_t, 0) carries nothing to token t+1
    reset every k  tokens t with t % k == 0 read 0 (the state restarts every k tokens; k = 1 is carry off)
    reset at p     token p alone reads 0; later tokens see the state rebuilt from p on

The model runs exactly, token by token, through its own KV cache (GPT.forward with an InferenceCache, whose R
is the state the next token reads): an ablation sets cache.R = 0 before the tokens it resets, nothing inside
the model changes. Reported: the mean loss per token (nats) of each ablation and its increase over "none";
for "reset at p", the increase by distance t - p; with --accuracy, the next-token accuracy too.
studies/tests/test_state_probe.py checks each ablation against a direct loop.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

from model import InferenceCache
from studies.probe import validation_sequences
from support.checkpoints import load_model, require_keys
from support.process import keeps_process_state
from support.runtime import RunError

RESET_EVERY = (1, 8, 32, 128)


@torch.no_grad()
def ablated_logits(model, idx, resets):
    """Logits (B, T, V) of the exact recurrence with the state read by token t replaced by 0 wherever
    resets(t) is True (t = 0 always reads 0). One token at a time through the model's KV cache."""
    cache = InferenceCache(model.cfg.n_unrolled)
    logits = []
    for t in range(idx.shape[1]):
        if resets(t):
            cache.R = None                      # the next token reads R = 0 (exact_forward's start)
        logits.append(model(idx[:, t:t + 1], mode="exact", cache=cache)[0])
    return torch.cat(logits, dim=1)


def token_losses(logits, targets):
    """Per-token cross-entropy (B, T) in float32 at least."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")


def ablations(T, reset_at):
    """{name: resets(t)} for the ablations of the module docstring."""
    table = {"none": lambda t: t == 0, "carry off": lambda t: True}
    table |= {f"reset every {k}": (lambda t, k=k: t % k == 0) for k in RESET_EVERY if k < T}
    if reset_at is not None:
        table[f"reset at {reset_at}"] = lambda t: t in (0, reset_at)
    return table


@torch.no_grad()
def state_probe(model, idx, targets, reset_at=None, batch_size=8, accuracy=False):
    """Every ablation on sequences idx (N, T) with next-token targets (N, T). Returns {"ablations": {name:
    {"loss", "delta", "loss_by_position" [T], ("accuracy", "accuracy_by_position")}}, "reset_at": p,
    "delta_by_distance": [mean increase over "none" at t = p, p+1, ...]}."""
    model.eval()
    T = idx.shape[1]
    losses, hits = {}, {}
    for name, resets in ablations(T, reset_at).items():
        per_batch, per_hit = [], []
        for i in range(0, len(idx), batch_size):
            logits = ablated_logits(model, idx[i:i + batch_size], resets)
            per_batch.append(token_losses(logits, targets[i:i + batch_size]))
            per_hit.append((logits.argmax(-1) == targets[i:i + batch_size]).float())
        losses[name], hits[name] = torch.cat(per_batch), torch.cat(per_hit)        # (N, T)
    base = losses["none"].mean().item()
    result = {"ablations": {}, "reset_at": reset_at, "num_seqs": len(idx), "seq_len": T}
    for name, loss in losses.items():
        row = {"loss": loss.mean().item(), "delta": loss.mean().item() - base,
               "loss_by_position": loss.mean(0).tolist()}
        if accuracy:
            row |= {"accuracy": hits[name].mean().item(), "accuracy_by_position": hits[name].mean(0).tolist()}
        result["ablations"][name] = row
    if reset_at is not None:
        delta = (losses[f"reset at {reset_at}"] - losses["none"]).mean(0)
        result["delta_by_distance"] = delta[reset_at:].tolist()
    return result


@torch.no_grad()
def word_problem_probe(groups=("Z2", "S3"), seeds=(0, 1, 2), root="out/word_problem", reset_at=32,
                       examples=512):
    """The ablations on the word-problem study's T²MLR models (studies/word_problem.py, their checkpoints in
    `root`): accuracy of the running product at every position of its fixed test set (n = 64), per seed.
    Returns {group: {"seeds": [...], "ablations": {name: {"accuracy": [per seed], "accuracy_by_position":
    [per seed] [64]}}}}."""
    from studies import word_problem as wp
    from support.checkpoints import load_checkpoint, load_weights
    out = {}
    for group in groups:
        table, rows = wp.multiplication_table(group), {}
        for seed in seeds:
            path = os.path.join(root, f"main_{group}_t2mlr_s{seed}", "ckpt.pt")
            ckpt = load_checkpoint(path)
            spec = json.loads(ckpt["spec"])
            model = wp.build(spec["model"])
            load_weights(model, ckpt["model"], path)
            model.eval()
            words, states = wp.make_batch(table, examples, spec["test_n"], wp.TEST_SEED)
            for name, resets in ablations(spec["test_n"], reset_at).items():
                hits = torch.cat([(ablated_logits(model, words[i:i + 256], resets).argmax(-1) == states[i:i + 256])
                                  .float() for i in range(0, examples, 256)])
                row = rows.setdefault(name, {"accuracy": [], "accuracy_by_position": []})
                row["accuracy"].append(hits.mean().item())
                row["accuracy_by_position"].append(hits.mean(0).tolist())
        out[group] = {"seeds": list(seeds), "reset_at": reset_at, "ablations": rows}
    return out


@keeps_process_state
def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--word_problem"]:      # the study's models: python -m studies.state_probe --word_problem
        result = word_problem_probe()
        out = "studies/results/state_probe_word_problem.json"
        with open(out, "w") as f:
            json.dump({"command": "python -m studies.state_probe --word_problem"} | result, f, indent=1)
        for group, g in result.items():
            for name, row in g["ablations"].items():
                acc = sum(row["accuracy"]) / len(row["accuracy"])
                print(f"{group} {name:16s} accuracy over positions 1..64: {acc:.4f} (mean of {len(g['seeds'])} seeds)")
        print(f"wrote {out}")
        return result
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip())
    p.add_argument("checkpoint", help="a train.py ckpt.pt of a T²MLR model")
    p.add_argument("--num_seqs", type=int, default=16, help="validation windows; default 16")
    p.add_argument("--seq_len", type=int, default=None, help="tokens per window; default block_size")
    p.add_argument("--reset_at", type=int, default=None, help="the position p of 'reset at p'; default T // 4")
    p.add_argument("--data_dir", default=None, help="data folder; default the checkpoint's")
    p.add_argument("--out", default=None, help="output JSON; default state_probe.json beside the checkpoint")
    args = p.parse_args(argv)
    if args.num_seqs < 1:
        raise RunError(f"--num_seqs {args.num_seqs} must be >= 1 (validation windows to probe)")
    model, ckpt = load_model(args.checkpoint)
    if model.gate is None:
        raise RunError(f"{args.checkpoint} is not a T²MLR model (t2mlr = False): it carries no state")
    if args.data_dir is None:       # the checkpoint's own data set
        require_keys(ckpt, args.checkpoint, ("train_config",))
    T = model.cfg.block_size if args.seq_len is None else args.seq_len
    if not 2 <= T <= model.cfg.block_size:
        raise RunError(f"--seq_len {T} must be in [2, block_size = {model.cfg.block_size}]")
    reset_at = T // 4 if args.reset_at is None else args.reset_at
    if not 0 < reset_at < T:
        raise RunError(f"--reset_at {reset_at} must be in [1, seq_len - 1 = {T - 1}]")
    seqs, data_dir, _ = validation_sequences(ckpt, args.num_seqs, T + 1, args.data_dir)
    result = {"checkpoint": args.checkpoint, "data_dir": data_dir,
              **state_probe(model, seqs[:, :-1], seqs[:, 1:], reset_at)}
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(args.checkpoint)), "state_probe.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    for name, row in result["ablations"].items():
        print(f"{name:16s} loss {row['loss']:.4f} nats/token  ({row['delta']:+.4f})")
    near = result["delta_by_distance"][:8]
    print(f"reset at {reset_at}: increase at distance 0..{len(near) - 1}: " + " ".join(f"{d:+.3f}" for d in near))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    try:
        main()
    except RunError as e:
        sys.exit(f"error: {e}")
