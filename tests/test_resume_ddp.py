"""
Training you can trust, end to end on tiny vanilla, MeSH and T²MLR models (CPU, fp32, train.py as run by
users):

- resume: 3 steps, stop, --init_from=resume, 3 more == 6 steps straight, bit for bit (losses, weights,
  optimizer state, RNG and data-sampler state), with a warmup + cosine schedule;
- DDP: torchrun with 2 gloo ranks x 2 accumulation steps == 1 process x 4 at the same tokens per step
  (losses, grad norms and Adam's moments, i.e. the gradients, within 1e-6; weights within 1e-6), without
  find_unused_parameters; evaluation runs on both ranks and they agree;
- crash safety: SIGKILL while ckpt.pt is being written leaves the previous ckpt.pt loadable, and resuming
  from it replays the uninterrupted run exactly.

    python -m pytest -q tests/test_resume_ddp.py
"""

import hashlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from configurator import load_config
from model import GPT, GPTConfig
from test_train import ROOT, TINY, read_log, write_dataset
from support.checkpoints import load_checkpoint, temporary_path
from train import TrainConfig

ARCHS = {
    # bias=False: GPT-NeoX's key bias has an identically zero gradient (softmax ignores a shift shared by all
    # keys), so its "gradient" is rounding noise, which Adam scales up to lr-sized steps that differ between
    # any two summation orders; without it the weights of the two setups can be compared at 1e-6.
    "vanilla": ["--bias=False"],
    "mesh": ["--layout=1+1R2+1", "--state_passing=mesh", "--bias=False"],
    # random depth: each step's loop count drawn (1..3), gradient through the last 2 loops; DDP finds the
    # routers a step leaves unused (its later steps', max_loops = 4)
    "mesh_random_depth": ["--layout=1+1R2+1", "--state_passing=mesh", "--bias=False", "--loops_sampler=uniform",
                          "--max_loops=4", "--loops_backprop=2"],
    "t2mlr": ["--flavour=llama", "--n_layer=3", "--mlp_hidden=64", "--t2mlr=True", "--l_start=1", "--l_end=2",
              "--jacobi_sweeps=4", "--jacobi_grad_sweeps=2"],
}
# 512 tokens per step = 4 sequences x 32 tokens x 4 micro-steps in one process, x 2 micro-steps x 2 ranks
# under DDP
ARGS = [*TINY, "--dataset=fox", "--total_batch_size=512", "--warmup_iters=2", "--eval_interval=3"]


def start(*args, cwd, torchrun=False):
    """Start train.py (optionally under torchrun with 2 ranks) without waiting; stdout/stderr to pipes."""
    cmd = [sys.executable] + (
        ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if torchrun else []
    )
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd + [os.path.join(ROOT, "train.py"), *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc):
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


def train_rows(out_dir):
    return [r for r in read_log(out_dir) if "loss" in r]


def val_rows(out_dir):
    return [r for r in read_log(out_dir) if "val_loss" in r]


@pytest.fixture(scope="module", params=ARCHS)
def runs(request, tmp_path_factory):
    """For one architecture: 'straight' (6 steps, 1 process), 'split' (3 steps with the 6-step schedule, then
    resumed to 6) and 'ddp' (6 steps, 2 ranks); the first three start together. Returns {name: (dir,
    stdout)}."""
    ws = tmp_path_factory.mktemp(request.param)
    write_dataset(ws / "data" / "fox")
    args = [*ARGS, *ARCHS[request.param]]
    procs = {"straight": start(*args, "--max_iters=6", "--out_dir=straight", cwd=ws),
             "split": start(*args, "--max_iters=3", "--lr_decay_iters=6", "--out_dir=split", cwd=ws),
             "ddp": start(*args, "--max_iters=6", "--out_dir=ddp", cwd=ws, torchrun=True)}
    out = {name: finish(proc) for name, proc in procs.items()}
    out["split"] += finish(start(*args, "--max_iters=6", "--init_from=resume", "--out_dir=split", cwd=ws))
    return {name: (ws / name, text) for name, text in out.items()}


def test_resume_is_bit_exact(runs):
    (straight, _), (split, _) = runs["straight"], runs["split"]
    a, b = load_checkpoint(str(straight / "ckpt.pt")), load_checkpoint(str(split / "ckpt.pt"))
    assert a["step"] == b["step"] == 6 and a["best_val_loss"] == b["best_val_loss"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for i, state in a["optimizer"]["state"].items():
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(state[k], b["optimizer"]["state"][i][k]), (i, k)
    for k in ("torch", "data"):                        # the sampler is where an uninterrupted run would be
        assert torch.equal(a["rng"][0][k], b["rng"][0][k]), k
    assert a["rng"][0]["numpy"] == b["rng"][0]["numpy"] and a["rng"][0]["python"] == b["rng"][0]["python"]
    rows_a, rows_b = train_rows(straight), train_rows(split)
    assert [r["step"] for r in rows_b] == list(range(6))
    assert [r.get("loops") for r in rows_a] == [r.get("loops") for r in rows_b]    # the same draws
    for key in ("loss", "grad_norm", "lr"):            # the same batches, updates and schedule, step by step
        assert [r[key] for r in rows_a] == [r[key] for r in rows_b], key
    assert rows_b[-1]["lr"] == pytest.approx(1e-3)     # the resumed run ends the 6-step cosine at min_lr
    assert [(r["step"], r["val_loss"]) for r in val_rows(straight)] == [
        (r["step"], r["val_loss"]) for r in val_rows(split)
    ]
    # appended on resume; step 3 not evaluated twice
    assert [r["step"] for r in val_rows(split)] == [0, 3, 6]


def test_ddp_equals_one_process(runs):
    (one, one_out), (two, two_out) = runs["straight"], runs["ddp"]
    assert "4 seqs x 32 tokens x 1 ranks x 4 accumulation steps" in one_out
    assert "4 seqs x 32 tokens x 2 ranks x 2 accumulation steps" in two_out
    rows_1, rows_2 = train_rows(one), train_rows(two)
    assert [r["step"] for r in rows_2] == list(range(6))
    assert [r.get("loops") for r in rows_1] == [r.get("loops") for r in rows_2]    # every rank's draws
    for r1, r2 in zip(rows_1, rows_2):                 # the same global batch, the same averaged gradient
        assert r2["loss"] == pytest.approx(r1["loss"], rel=1e-6, abs=1e-6)
        assert r2["grad_norm"] == pytest.approx(r1["grad_norm"], rel=1e-6, abs=1e-6)
    assert rows_1[-1]["loss"] < rows_1[0]["loss"] - 0.5           # it trained, so equal losses mean something
    for v1, v2 in zip(val_rows(one), val_rows(two)):   # evaluated on both ranks, all-reduced: they agree
        assert v2["val_loss_by_rank"] == [v2["val_loss"]] * 2
        assert v2["val_loss"] == pytest.approx(v1["val_loss"], rel=1e-6)
    a, b = load_checkpoint(str(one / "ckpt.pt")), load_checkpoint(str(two / "ckpt.pt"))
    for k in a["model"]:
        assert torch.allclose(a["model"][k], b["model"][k], rtol=0, atol=1e-6), k
    # Adam's moments are running sums of every step's gradients and squared gradients
    for i, state in a["optimizer"]["state"].items():
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(state[k], b["optimizer"]["state"][i][k], rtol=0, atol=1e-6), (i, k)
    # one sampler, one state: both ranks, and the single process, drew the same windows
    assert len(b["rng"]) == 2 and torch.equal(b["rng"][0]["data"], b["rng"][1]["data"])
    assert torch.equal(a["rng"][0]["data"], b["rng"][0]["data"])


@pytest.mark.parametrize("arch", ARCHS)
def test_every_parameter_gets_a_gradient(arch):
    """What lets train.py wrap the model in DDP without find_unused_parameters (the DDP runs above would also
    fail on their second step if a parameter got no gradient)."""
    (model_cfg, _), _ = load_config([*ARGS, *ARCHS[arch]], GPTConfig, TrainConfig)
    torch.manual_seed(0)
    model = GPT(model_cfg)
    x = torch.randint(0, 257, (2, model_cfg.block_size))

    # random depth: a step at the largest draw reaches every router, without truncation
    depth = dict(n_loops=model_cfg.max_loops) if "--loops_sampler=uniform" in ARCHS[arch] else {}

    def zero_grads():
        model.zero_grad(set_to_none=True)
        model(x, x.roll(-1, 1), **depth)[1].backward()
        assert [name for name, p in model.named_parameters() if p.grad is None] == []
        return [name for name, p in model.named_parameters() if not p.grad.any()]
    if arch != "t2mlr":
        assert zero_grads() == []
    else:   # the gate starts as an exact identity, tanh(θ) = 0 times its other weights: only θ moves at first
        assert zero_grads() == [
            "gate.W_p.weight",
            "gate.A.weight",
            "gate.A.bias",
        ]
        with torch.no_grad():
            model.gate.theta_r.fill_(0.5), model.gate.theta_x.fill_(0.5)
        assert zero_grads() == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_sigkill_while_writing_a_checkpoint(tmp_path):
    """The checkpoint write is made observable by a named pipe at its temporary file (ckpt.pt.<pid>.tmp):
    train.py blocks inside torch.save once the pipe is full, and is killed there, mid-write. The FIFO is made
    as the victim starts, long before its step-4 save."""
    write_dataset(tmp_path / "data" / "fox")
    args = [*ARGS, *ARCHS["vanilla"], "--eval_interval=2"]
    straight = start(*args, "--max_iters=4", "--out_dir=straight", cwd=tmp_path)
    finish(start(*args, "--max_iters=2", "--lr_decay_iters=4", "--out_dir=run", cwd=tmp_path))
    ckpt = tmp_path / "run" / "ckpt.pt"
    before = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    # far more than a pipe holds (64 KiB): the writer blocks
    assert ckpt.stat().st_size > 4 * 65536
    victim = start(*args, "--max_iters=4", "--init_from=resume", "--out_dir=run", cwd=tmp_path)
    tmp = Path(temporary_path(str(ckpt), victim.pid))
    os.mkfifo(tmp)
    reader = {}
    opener = threading.Thread(target=lambda: reader.setdefault("f", open(tmp, "rb")), daemon=True)
    opener.start()
    # until train.py opens its temporary file for its step-4 save
    while opener.is_alive():
        opener.join(0.5)
        if victim.poll() is not None:                     # it died instead: unblock the opener, then fail
            open(tmp, "wb").close()
            pytest.fail(f"train.py exited before writing a checkpoint: {victim.communicate()[1]}")
    partial = reader["f"].read(4096)                      # torch.save has begun writing
    assert partial.startswith(b"PK")                      # (a zip archive)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    reader["f"].close()
    assert victim.returncode == -signal.SIGKILL           # it was still alive, blocked mid-write, when killed
    tmp.unlink()
    tmp.write_bytes(partial)                              # what a killed writer leaves behind on a real disk

    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == before
    assert torch.load(ckpt, weights_only=True)["step"] == 2
    finish(start(*args, "--max_iters=4", "--init_from=resume", "--out_dir=run", cwd=tmp_path))
    finish(straight)
    a, b = load_checkpoint(str(tmp_path / "straight" / "ckpt.pt")), load_checkpoint(str(ckpt))
    assert b["step"] == 4 and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    # the killed run's rows of steps 2 and 3, replayed by the resume, were dropped: each step once, each
    # equal to the straight run's
    losses = {r["step"]: r["loss"] for r in train_rows(tmp_path / "straight")}
    rows = train_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all(r["loss"] == losses[r["step"]] for r in rows)
    # the leftover partial file was overwritten and renamed
    assert not tmp.exists()
