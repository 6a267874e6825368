"""
How large the recurrent branch starts against the residual stream: the RMS ratio RMS(W_p R_{t-1}) / RMS(x_t)
at the input of T²MLR's first recurrent layer l_start, at initialisation, for every T²MLR config and both
initialisations:

    ours        the config as it is: GPT.init_weights (the MeSH paper's std sqrt(2/(5C)), depth-scaled output
                projections) and embeddings times sqrt(C)
    normal_0.02 weight_init="normal_0.02", embed_scale=False: the T²MLR code's Hugging Face Llama models,
                every weight N(0, 0.02²), embeddings unscaled

The gate's own initialisation (GPT.init_weights: W_p the Linear default) is the same in both.
The ratio is read from outside the model, by wrapping the gate, GPT.temporal_gate (its args: x, r = R_{t-1}), during the exact recurrence (eval mode), pooled over the positions that read a state: t >= 1 and,
with a control flow, the recurrent tokens (c >= 2). At θ_r = θ_x = 0 the gate is an identity, so R_{t-1} is
the state of the model at init whatever the branch's size.

    python prepare_data.py --source pydoc --tokenizer byte      # the language-model configs' tokens
    python -m studies.gate_scale                                # -> studies/results/gate_scale.json
    python -m studies.gate_scale --data_dir=/tmp/opts_data/pydoc

Language-model configs read byte tokens of the Python manual (ids < 257, valid in every vocabulary: with
random weights the text hardly matters); the S5 configs read S5-Retrieval examples (studies/s5_retrieval.py).
A released-model config (smollm2_135m_retrofit.py) is measured in its shape (SmolLM2-135M's config.json:
vocabulary 49,152) with random weights, not the released ones.
"""

import json
import os
import sys
from dataclasses import asdict, replace

import numpy as np
import torch

from configurator import load_config
from model import GPT, GPTConfig
from studies.probe import GateCalls
from support.process import keeps_process_state

CONFIGS = ["tiny_t2mlr", "s5_tiny_t2mlr", "s5_tiny_t2mlr_exact", "s5_t2mlr", "smollm2_135m_t2mlr",
           "smollm2_135m_retrofit"]
# SmolLM2-135M's config.json, for the retrofit config (whose architecture comes from the released model)
SMOLLM2_135M = dict(flavour="llama", vocab_size=49152, n_layer=30, n_embd=576, n_head=9, n_kv_head=3,
                    mlp_hidden=1536, rope_theta=100000.0, tie_embeddings=True, norm_eps=1e-5)
INITS = {"ours": {}, "normal_0.02": {"weight_init": "normal_0.02", "embed_scale": False}}


class GateInputs:
    """A wrapper around the gate, GPT.temporal_gate, that sums, over the positions that read a state, the squares of
    W_p R_{t-1} and of x (the input of l_start). Position p of a call is counted from 0 over the calls of one
    exact forward (chunks in order); `mask` (B, T) bool picks the positions (None: all). Use as
    `with GateInputs(model, mask) as g: model(idx)`, then g.ratio()."""

    def __init__(self, model: GPT, mask=None):
        self.mask, self.pos, self.sum_r, self.sum_x, self.count = mask, 0, 0.0, 0.0, 0
        self.model, self.calls = model, GateCalls(model, lambda x, r, x_mixed: self.keep(x, r))

    def keep(self, x, r):
        B, L, C = x.shape
        keep = torch.ones(B, L, dtype=torch.bool) if self.mask is None else self.mask[:, self.pos:self.pos + L]
        keep = keep & (torch.arange(self.pos, self.pos + L) >= 1)          # token 0 reads R_{-1} = 0
        r_tilde = self.model.gate.W_p(r).expand(B, L, C)
        self.sum_r += r_tilde[keep].double().pow(2).sum().item()
        self.sum_x += x[keep].double().pow(2).sum().item()
        self.count += int(keep.sum()) * C
        self.pos += L

    def ratio(self):
        return (self.sum_r / self.sum_x) ** 0.5

    def rms(self):
        """(RMS(W_p R_{t-1}), RMS(x)) over the kept positions."""
        return (self.sum_r / self.count) ** 0.5, (self.sum_x / self.count) ** 0.5

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.calls.__exit__(*exc)


@torch.no_grad()
def gate_ratio(model: GPT, idx, control=None):
    """(ratio, RMS(W_p R_{t-1}), RMS(x)) of `model` on idx (B, T) in the exact recurrence, pooled over the
    positions t >= 1 that read a state (with control: c >= 2)."""
    was_training = model.training
    model.eval()
    with GateInputs(model, None if control is None else control >= 2) as g:
        model(idx, control=control, mode="exact")
    model.train(was_training)
    return (g.ratio(), *g.rms())


def model_config(name):
    """The GPTConfig of config/<name>.py (training and task keys skipped); the retrofit config in the
    released model's shape (SMOLLM2_135M, then the config's own keys)."""
    shape = [f"--{k}={v}" for k, v in SMOLLM2_135M.items()] if name == "smollm2_135m_retrofit" else []
    (cfg,), _ = load_config([f"config/{name}.py", *shape], GPTConfig, skip_unknown=True)
    return cfg


def batch_for(name, cfg, data_dir, B, T):
    """(idx, control): S5 examples for an S5 config, else B windows of T byte tokens from data_dir/val.bin."""
    if name.startswith("s5_"):
        from studies.s5_retrieval import S5Config, train_batch
        (_, s5), _ = load_config([f"config/{name}.py"], GPTConfig, S5Config, skip_unknown=True)
        idx, _, control = train_batch(s5, seed=0, step=0, batch_size=B, device="cpu")
        return idx, control
    data = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
    starts = np.linspace(0, len(data) - T - 1, B).astype(int)
    return torch.from_numpy(np.stack([data[s:s + T].astype(np.int64) for s in starts])), None


def measure(data_dir="data/pydoc", names=CONFIGS, seed=0, B=4, T=256, log=print):
    """{config: {init: {"ratio", "rms_wp_r", "rms_x", "n_embd", "l_start"}}}: each config built with its shape
    and random weights (seeded), once per initialisation, on one batch (B sequences; T tokens for the
    language-model configs, capped at block_size)."""
    results = {}
    for name in names:
        base = model_config(name)
        idx, control = batch_for(name, base, data_dir, B, min(T, base.block_size))
        results[name] = {}
        for init, keys in INITS.items():
            torch.manual_seed(seed)
            model = GPT(replace(base, **keys))
            ratio, rms_r, rms_x = gate_ratio(model, idx, control)
            results[name][init] = {"ratio": ratio, "rms_wp_r": rms_r, "rms_x": rms_x, "n_embd": base.n_embd,
                                   "l_start": base.recurrent_layers[0]}
            log(f"{name:24s} {init:9s} C={base.n_embd:4d} l_start={base.recurrent_layers[0]:2d}  "
                f"RMS(W_p R)={rms_r:.4f}  RMS(x)={rms_x:.4f}  ratio={ratio:.3f}")
            del model
    return results


@keeps_process_state
def main(argv):
    data_dir = next((a.split("=", 1)[1] for a in argv if a.startswith("--data_dir=")), "data/pydoc")
    out = next((a.split("=", 1)[1] for a in argv if a.startswith("--out=")), "studies/results/gate_scale.json")
    if not os.path.exists(os.path.join(data_dir, "val.bin")):
        sys.exit(f"error: no {data_dir}/val.bin: run `python prepare_data.py --source pydoc --tokenizer byte` "
                 f"or give --data_dir=<folder of val.bin>")
    torch.set_num_threads(1)
    results = measure(data_dir)
    command = " ".join(["python -m studies.gate_scale", *argv])
    with open(out, "w") as f:
        json.dump({"command": command, "data": f"{data_dir}/val.bin (byte tokens); S5 configs: S5 examples",
                   "statistic": "RMS(W_p R_{t-1}) / RMS(x_t) at the input of l_start, at init, exact "
                                "recurrence, pooled over positions t >= 1 reading a state (S5: c >= 2), "
                                "B = 4 sequences, seed 0",
                   "inits": {"ours": "the config as is (GPT.init_weights, embed_scale)",
                             "normal_0.02": "weight_init='normal_0.02', embed_scale=False"},
                   "results": results}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
