"""
model.py stands alone: copied by itself into an empty folder, with only torch and the standard library
to import, it runs every variant's forward, loss and backward (vanilla neox and llama; the layouts with
each state passing, MeSH included; T²MLR), T²MLR's three modes, `generate` and its config checks. Only
GPT.from_pretrained and `python model.py <config>` import the rest of the repository, when called.

Also here: a checkpoint that names the T²MLR gate's parameters by their old names (support.compat's
RENAMED_PARAMS) loads with the same logits.

    python -m pytest -q tests/test_standalone.py
"""

import ast
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from model import GPT, GPTConfig
from support.checkpoints import load_model, save_checkpoint
from support.compat import RENAMED_PARAMS, upgrade_state_dict

ROOT = Path(__file__).resolve().parent.parent
# the repository's own top-level modules and packages: the copy of model.py must import none of them
REPO = sorted({p.stem for p in ROOT.glob("*.py")} | {p.parent.name for p in ROOT.glob("*/__init__.py")})

# Runs next to the lone copy of model.py; prints one JSON line of results.
SCRIPT = r'''
import importlib.abc, json, math, sys
REPO = set(sys.argv[1].split(","))


class Refuse(importlib.abc.MetaPathFinder):      # importing any module of the repository fails
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REPO - {"model"}:
            raise ImportError(f"model.py imported {name}")


sys.meta_path.insert(0, Refuse())
import torch
import model
from model import GPT, GPTConfig

torch.manual_seed(0)
torch.set_num_threads(1)
TINY = dict(vocab_size=61, block_size=16, n_embd=32, n_head=4)
LLAMA = dict(flavour="llama", mlp_hidden=48, n_kv_head=2)
VARIANTS = {
    "neox": dict(TINY, n_layer=3),
    "llama": dict(TINY, **LLAMA, n_layer=3),
    **{sp: dict(TINY, layout="1+2R2+1", state_passing=sp)
       for sp in ("base", "residual", "anchor", "anchor_star", "mesh")},
    "t2mlr": dict(TINY, **LLAMA, n_layer=4, t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=12,
                  jacobi_grad_sweeps=2),
}
idx = torch.randint(0, 61, (2, 10))
out = {"file": model.__file__, "train": {}}
RUNS = [(name, fields, None) for name, fields in VARIANTS.items()]
RUNS.append(("t2mlr exact", VARIANTS["t2mlr"], "exact"))
for name, fields, mode in RUNS:                # T²MLR trains by Jacobi sweeps, and through the exact loop
    m = GPT(GPTConfig(**fields)).train()
    if m.gate is not None:                   # open the gate: θ = 0 is an exact identity
        with torch.no_grad():
            m.gate.theta_r.fill_(0.5), m.gate.theta_x.fill_(-0.3)
    logits, loss = m(idx, idx.roll(-1, 1), mode=mode)
    loss.backward()
    grads = [p.grad for p in m.parameters()]
    out["train"][name] = {"loss": loss.item(), "logits": list(logits.shape),
                          "no_grad": sum(g is None for g in grads),
                          "grad_norm": math.sqrt(sum(g.double().pow(2).sum().item() for g in grads))}

m = GPT(GPTConfig(**VARIANTS["t2mlr"])).double().eval()
with torch.no_grad():
    m.gate.theta_r.fill_(0.5), m.gate.theta_x.fill_(-0.3)
    control = torch.tensor([[1, 1, 1, 2, 2, 2, 2, 2, 2, 2], [2] * 10])
    modes = {mode: m(idx, mode=mode, control=control)[0] for mode in ("jacobi", "exact", "converged")}
    exact = modes["exact"]
    out["modes"] = {mode: (logits - exact).abs().max().item() for mode, logits in modes.items()}
    out["gate_moves"] = (exact - m(idx, mode="exact", control=torch.ones_like(idx))[0]).abs().max().item()

out["generate"] = {}
for name in ("neox", "mesh", "t2mlr"):
    g = GPT(GPTConfig(**VARIANTS[name])).eval()
    if g.gate is not None:
        with torch.no_grad():
            g.gate.theta_r.fill_(0.5)
    full = g.generate(idx[:, :4], 20, temperature=0)    # 24 tokens: the window (16) slides
    with torch.no_grad():             # greedy = the argmax of a full recompute (prompt c = 1, generated 2)
        c = torch.tensor([[1] * 4 + [2] * 20] * 2)
        again = {t: g(full[:, max(0, t - 16):t], mode="exact", control=c[:, max(0, t - 16):t])[0]
                 [:, -1].argmax(-1) for t in (4, 10, 23)}
    sampled = g.generate(idx[:, :4], 6, temperature=0.8, top_k=5,
                         generator=torch.Generator().manual_seed(1))
    out["generate"][name] = {"shape": list(full.shape),
                             "prompt_kept": bool((full[:, :4] == idx[:, :4]).all()),
                             "recomputed": all(bool((again[t] == full[:, t]).all()) for t in again),
                             "all_in_vocab": bool(((sampled >= 0) & (sampled < 61)).all())}

errors = {}
for label, call in {
    "rope_pct": lambda: GPTConfig(**TINY, rope_pct=1.5),
    "layout": lambda: GPTConfig(**TINY, layout="2+4X2+2"),
    "l_end": lambda: GPTConfig(**TINY, n_layer=2, t2mlr=True, l_start=0, l_end=2),
    "nan": lambda: GPTConfig(**TINY, rope_theta=float("nan")),
    "mode": lambda: m(idx, mode="fast"),
    "temperature": lambda: m.generate(idx[:, :2], 1, temperature=-0.5),
}.items():
    try:
        call()
        errors[label] = None
    except ValueError as e:
        errors[label] = str(e)
out["errors"] = errors
out["repo_modules"] = sorted(n for n in sys.modules if n.split(".")[0] in REPO - {"model"})
print(json.dumps(out))
'''


def test_model_py_imports_only_torch_and_the_standard_library_at_module_level():
    tree = ast.parse((ROOT / "model.py").read_text())
    names = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module for node in tree.body if isinstance(node, ast.ImportFrom)}
    assert {name.split(".")[0] for name in names} - set(sys.stdlib_module_names) == {"torch"}, names


def test_model_py_copied_alone_runs_every_variant(tmp_path):
    shutil.copy(ROOT / "model.py", tmp_path / "model.py")
    (tmp_path / "run.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    run = subprocess.run([sys.executable, "run.py", ",".join(REPO)], cwd=tmp_path,
                         env=env | {"OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.splitlines()[-1])
    assert Path(out["file"]).resolve() == (tmp_path / "model.py").resolve() and out["repo_modules"] == []

    assert set(out["train"]) == {"neox", "llama", "base", "residual", "anchor", "anchor_star", "mesh",
                                 "t2mlr", "t2mlr exact"}
    for name, r in out["train"].items():
        assert r["logits"] == [2, 10, 61], name
        assert math.isfinite(r["loss"]) and 3.0 < r["loss"] < 6.0, (name, r)    # near log(61) = 4.11 at init
        assert r["no_grad"] == 0 and math.isfinite(r["grad_norm"]) and r["grad_norm"] > 1e-3, (name, r)

    # float64, D = 12 >= T = 10: the sweeps are exact, and converged (D = T) is too
    assert out["modes"]["exact"] == 0.0
    assert out["modes"]["jacobi"] <= 1e-5 and out["modes"]["converged"] <= 1e-5, out["modes"]
    assert out["gate_moves"] > 1e-4, "the control flow (and the open gate) must change the logits"

    for name, r in out["generate"].items():
        assert r == {"shape": [2, 24], "prompt_kept": True, "recomputed": True, "all_in_vocab": True}, name

    errors = out["errors"]
    assert errors["rope_pct"] == "rope_pct = 1.5 must be in [0, 1] or None"
    assert errors["layout"].startswith("layout = '2+4X2+2' must be '' (flat) or 'P+NRK+Q'")
    assert errors["l_end"].startswith("l_start = 0 must be <= l_end = 2, both in -2 .. 1")
    assert errors["nan"] == "rope_theta = nan must be finite and > 0"
    assert errors["mode"] == "mode = 'fast' must be one of 'jacobi', 'exact', 'converged'"
    assert errors["temperature"] == "temperature = -0.5 must be >= 0 (0 = greedy)"


# -----------------------------------------------------------------------------
# The gate's parameters under their old names

def old_names(state: dict) -> dict:
    """state as the oldest version stored it: W_p as gate.proj, and A in two halves by the input its
    columns act on (gate.gates_x: the x columns and the biases; gate.gates_r: the r~ columns)."""
    C = state["gate.W_p.weight"].shape[0]
    old = {}
    for key, value in state.items():
        if key == "gate.W_p.weight":
            old["gate.proj.weight"] = value
        elif key == "gate.A.weight":
            old["gate.gates_x.weight"], old["gate.gates_r.weight"] = value[:, :C], value[:, C:]
        elif key == "gate.A.bias":
            old["gate.gates_x.bias"] = value
        else:
            old[key] = value
    return old


def test_upgrade_state_dict_renames_and_joins_the_gate_and_keeps_everything_else():
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_embd=16, n_head=2, n_layer=3, t2mlr=True))
    state = model.state_dict()
    old = old_names(state)
    assert {"gate.gates_x.weight", "gate.gates_x.bias", "gate.gates_r.weight", "gate.proj.weight"} <= set(old)
    upgraded = upgrade_state_dict(old)
    assert list(upgraded) == list(state) and all(torch.equal(upgraded[k], state[k]) for k in state)
    assert all(upgraded[k] is state[k] for k in state if not k.startswith("gate.A."))
    middle = {k.replace("gates_x", "A_on_x").replace("gates_r", "A_on_r"): v for k, v in old.items()}
    assert all(torch.equal(upgrade_state_dict(middle)[k], state[k]) for k in state)   # the names between
    assert upgrade_state_dict(state) == state                                   # new names stay
    both = {**old, "gate.W_p.weight": torch.zeros(16, 16)}                      # a new key wins
    assert torch.equal(upgrade_state_dict(both)["gate.W_p.weight"], torch.zeros(16, 16))


def test_a_checkpoint_with_the_old_gate_names_loads_with_the_same_logits(tmp_path):
    torch.manual_seed(0)
    cfg = GPTConfig(flavour="llama", vocab_size=64, block_size=16, n_embd=32, n_head=4, mlp_hidden=48,
                    n_layer=4, t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=5, jacobi_grad_sweeps=2)
    model = GPT(cfg).eval()
    with torch.no_grad():
        model.gate.theta_r.fill_(0.5), model.gate.theta_x.fill_(-0.5)
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, {"model": old_names(model.state_dict()), "model_config": dataclasses.asdict(cfg)})
    loaded, _ = load_model(path)
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        for mode in ("exact", "jacobi"):
            want = model(idx, mode=mode)[0]
            assert (loaded(idx, mode=mode)[0] - want).abs().max() <= 1e-6, mode
    assert torch.equal(loaded.gate.A.weight, model.gate.A.weight)
