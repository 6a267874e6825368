"""
Tests for configurator.py, train.py (with support/: runtime, data, checkpoints, loop) and sample.py (CPU, about a minute): the config loader, the LR
schedule, memmap window bounds, the step sampler, fixed validation windows, checkpoints, data errors, and
end-to-end runs of train.py (scratch then sample.py, non-finite stop, T²MLR val modes), and train.py's
refusals in one line: weights read under another tokenizer, token ids the tokenizer cannot make, a renamed key
given with its new name and another value, exact training compiled, a device this machine lacks, a resume
with nothing to train, log rows a resume replays, a run far too slow for its device; non-contiguous targets
in GPT.forward.
Bit-exact resume, DDP equivalence and crash safety: test_resume_ddp.py; bad input on the command line:
test_errors.py. Their helpers (TINY, run, write_dataset, read_log) live here.

    python -m pytest tests/test_train.py -q
"""

import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from configurator import ConfigError, given_values, load_config
from model import GPT, GPTConfig
from sample import SampleConfig
from support.checkpoints import load_checkpoint, rng_states, save_checkpoint, set_rng_states
from support.data import get_batch, load_meta, random_starts, step_starts, val_starts
from support.loop import configure_optimizers, get_lr
from support.runlog import RunLog, trim_replayed_rows
from support.runtime import RunError
import train
from train import (TrainConfig, grad_accum_steps, model_config_from_checkpoint, settle_config,
                   train_config_from_checkpoint)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--n_layer=2", "--n_embd=32", "--n_head=2", "--block_size=32", "--vocab_size=320",
        "--batch_size=4", "--total_batch_size=256", "--eval_iters=2", "--log_interval=1",
        "--device=cpu", "--compile=False", "--progress=False", "--learning_rate=1e-2", "--min_lr=1e-3",
        "--warmup_iters=0"]


def load(*argv):
    """(GPTConfig, TrainConfig, the set of keys given) from config files and --key=value arguments."""
    (model_cfg, cfg), given = load_config(list(argv), GPTConfig, TrainConfig)
    return model_cfg, cfg, given


def write_dataset(folder, train_tokens=6000, val_tokens=800, seed=0):
    """A byte-level dataset as prepare_data.py writes it: a repeated sentence, so a model can learn it."""
    os.makedirs(folder, exist_ok=True)
    text = ("The quick brown fox jumps over the lazy dog. " * 400).encode()
    ids = np.frombuffer(text, dtype=np.uint8).astype(np.uint16)
    ids[:train_tokens].tofile(os.path.join(folder, "train.bin"))
    ids[train_tokens:train_tokens + val_tokens].tofile(os.path.join(folder, "val.bin"))
    meta = {"tokenizer": "byte", "vocab_size": 257, "eot": 256, "dtype": "uint16",
            "train_tokens": train_tokens, "val_tokens": val_tokens}
    with open(os.path.join(folder, "meta.json"), "w") as f:
        json.dump(meta, f)
    return ids


def run(script, *args, cwd, torchrun=False):
    cmd = [sys.executable] + (
        ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if torchrun else []
    )
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return subprocess.run(cmd + [os.path.join(ROOT, script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


# -----------------------------------------------------------------------------
# Config loader

def test_config_file_then_command_line(tmp_path):
    path = tmp_path / "cfg.py"
    path.write_text("import math\n_scratch = 7\nbatch_size = 2 * math.floor(2.5)\nn_embd = 64\nn_head = 4\n"
                    "learning_rate = 1\nlayout = '2+2R2+2'\n")
    model_cfg, cfg, given = load(str(path), "--batch_size=8", "--out_dir=a=b", "--dataset=123")
    assert cfg.batch_size == 8                        # the command line wins over the file
    assert cfg.learning_rate == 1.0 and type(cfg.learning_rate) is float   # int -> float
    assert cfg.out_dir == "a=b"                       # split on the first '='
    assert cfg.dataset == "123"                       # a string field keeps literal-looking text
    assert model_cfg.layout == "2+2R2+2" and model_cfg.n_embd == 64
    assert model_cfg.mlp_hidden == 256                # 4 * the NEW n_embd: defaults re-resolved, not copied
    assert given == {"batch_size", "n_embd", "n_head", "learning_rate", "layout", "out_dir", "dataset"}
    assert given_values(given, cfg) == {
        "out_dir": "a=b",
        "dataset": "123",
        "batch_size": 8,
        "learning_rate": 1.0,
    }


def test_given_records_keys_whose_value_equals_the_default(tmp_path):
    """A key set to its default value was still given: load_config records it, never infers it from the
    value."""
    path = tmp_path / "cfg.py"
    path.write_text("n_layer = 12\nwarmup_iters = 200\n")          # both equal the defaults
    model_cfg, cfg, given = load(str(path), "--learning_rate=6e-4", "--max_iters=5000")
    assert given == {"n_layer", "warmup_iters", "learning_rate", "max_iters"}
    assert given_values(given, model_cfg, cfg) == {"n_layer": 12, "max_iters": 5000, "learning_rate": 6e-4,
                                                   "warmup_iters": 200}
    assert load()[2] == set()


def test_bool_and_none_parsing():
    _, cfg, _ = load("--compile=true", "--progress=False", "--peak_flops=None")
    assert cfg.compile is True and cfg.progress is False and cfg.peak_flops is None
    _, cfg, _ = load("--compile=None", "--progress=false", "--peak_flops=3e14")
    assert cfg.compile is None and cfg.progress is False and cfg.peak_flops == 3e14
    with pytest.raises(ConfigError, match=r"progress=1 \(command line\): expected bool"):
        load("--progress=1")
    with pytest.raises(ConfigError, match="batch_size=None .*expected int"):
        load("--batch_size=None")                     # None only for Optional fields


def test_unknown_keys_and_wrong_types(tmp_path):
    path = tmp_path / "typo.py"
    path.write_text("batch_sise = 4\n")
    with pytest.raises(
        ConfigError, match=f"unknown config key 'batch_sise' in {path} .*did you mean 'batch_size'"
    ):
        load(str(path))
    with pytest.raises(
        ConfigError, match=r"unknown config key 'n_emb' in command line \(did you mean 'n_embd'\?\)"
    ):
        load("--n_emb=64")
    with pytest.raises(ConfigError, match=r"batch_size=4.5 \(command line\): expected int"):
        load("--batch_size=4.5")
    path.write_text("learning_rate = 'fast'\n")
    with pytest.raises(ConfigError, match=f"learning_rate='fast' \\({path}\\): expected float"):
        load(str(path))
    with pytest.raises(ConfigError, match="--key=value"):
        load("--batch_size")
    # GPTConfig.__post_init__'s ValueError, reported the same way
    with pytest.raises(ConfigError, match="n_head"):
        load("--n_head=5")
    with pytest.raises(ConfigError, match="val_mode = 'fast' must be one of 'exact'"):
        load("--val_mode=fast")


def test_help_lists_every_key_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exit_info:
        load("--help")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--batch_size=16  (int)  # sequences per micro-step per rank" in out
    assert "--n_kv_head=None  (Optional[int])" in out
    for cfg in (GPTConfig(), TrainConfig()):
        for key in cfg.__dataclass_fields__:
            assert f"--{key}=" in out


# -----------------------------------------------------------------------------
# LR schedule

def test_lr_warmup_then_cosine_to_min_lr():
    cfg = TrainConfig(max_iters=100, warmup_iters=10, learning_rate=1e-3, min_lr=1e-4)
    lrs = [get_lr(s, cfg) for s in range(cfg.max_iters)]
    assert 0 < lrs[0] == pytest.approx(1e-3 / 11)     # never 0 at step 0
    assert all(a < b for a, b in zip(lrs[:11], lrs[1:11]))   # warmup rises
    assert lrs[10] == pytest.approx(1e-3)             # the peak right after warmup
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:]))    # the cosine strictly decays
    assert lrs[-1] == pytest.approx(1e-4)             # min_lr at the last optimizer step
    assert get_lr(10_000, cfg) == pytest.approx(1e-4)  # clamped beyond


def test_lr_decay_iters_lets_a_run_stop_early_on_the_long_schedule():
    long, short = TrainConfig(max_iters=100, warmup_iters=10), TrainConfig(
        max_iters=40, warmup_iters=10, lr_decay_iters=100
    )
    assert [get_lr(s, short) for s in range(40)] == [get_lr(s, long) for s in range(40)]
    assert get_lr(39, short) > 2 * short.min_lr      # not decayed to the floor at its own last step
    with pytest.raises(ValueError, match="lr_decay_iters = 0 must be >= 1"):
        TrainConfig(lr_decay_iters=0)


@pytest.mark.parametrize("max_iters, warmup", [(50, 0), (50, 50), (50, 80), (1, 0), (1, 1), (0, 0)])
def test_lr_edges_are_finite_and_positive(max_iters, warmup):
    cfg = TrainConfig(max_iters=max_iters, warmup_iters=warmup, learning_rate=1e-3, min_lr=1e-5)
    lrs = [get_lr(s, cfg) for s in range(max(max_iters, 1))]
    assert all(math.isfinite(lr) and 1e-5 <= lr <= 1e-3 for lr in lrs)
    if warmup == 0:
        assert lrs[0] == 1e-3
    if warmup >= max_iters > 1:                       # warmup all the way: rises, never decays
        assert all(a < b for a, b in zip(lrs, lrs[1:]))


# -----------------------------------------------------------------------------
# Data: batch sizes, window bounds, fixed val windows

def test_grad_accum_refuses_non_divisible_batch():
    assert grad_accum_steps(4096, 4, 256, 1) == 4
    assert grad_accum_steps(4096, 4, 256, 2) == 2
    with pytest.raises(ConfigError, match=r"total_batch_size = 1000 tokens .* = 4 \* 64 \* 2 = 512"):
        grad_accum_steps(1000, 4, 64, 2)
    with pytest.raises(ConfigError, match="= 2048"):
        grad_accum_steps(1024, 4, 256, 2)             # smaller than one micro-step over all ranks


def test_windows_reach_the_last_token_and_never_overrun(tmp_path):
    data = np.arange(40, dtype=np.uint16)
    path = tmp_path / "x.bin"
    data.tofile(path)
    block = 8
    starts = random_starts(len(data), block, 2000, torch.Generator().manual_seed(0))
    assert min(starts) == 0 and max(starts) == len(data) - block - 1    # both ends drawn, nothing beyond
    x, y = get_batch(str(path), np.uint16, [0, len(data) - block - 1], block, "cpu")
    assert x.dtype == torch.int64 and x.shape == y.shape == (2, block)
    assert x[0].tolist() == list(range(block)) and y[0].tolist() == list(range(1, block + 1))
    assert y[1, -1].item() == data[-1]                # the final token is a target
    assert random_starts(block + 1, block, 5, torch.Generator()) == [0] * 5   # the shortest valid split


def test_step_batch_does_not_depend_on_world_size():
    """One process x 4 micro-steps and 2 ranks x 2 (and 4 x 1) train on the same windows, micro-batch for
    micro-batch: the global micro-batch g goes to rank g % world_size as its micro-step g // world_size."""
    def draw(world_size, rank, accum):
        return step_starts(10_000, 32, 3, accum, world_size, rank, torch.Generator().manual_seed(7))
    single = draw(1, 0, 4)
    assert len(single) == 4 and all(len(m) == 3 for m in single) and len(set(sum(single, []))) == 12
    for world_size in (2, 4):
        shares = [draw(world_size, r, 4 // world_size) for r in range(world_size)]
        assert [shares[g % world_size][g // world_size] for g in range(4)] == single
    gen = torch.Generator().manual_seed(7)             # the next step draws new windows
    assert (
        step_starts(10_000, 32, 3, 4, 1, 0, gen) == single
        and step_starts(10_000, 32, 3, 4, 1, 0, gen) != single
    )


def test_split_of_block_size_plus_one_works_and_block_size_errors(tmp_path):
    write_dataset(tmp_path, train_tokens=33, val_tokens=33)
    assert load_meta(str(tmp_path), 32)["train_tokens"] == 33
    with pytest.raises(RunError, match=r"block_size = 33 needs at least 34 tokens in each split, but .*train\.bin has 33: set --block_size <= 32"):
        load_meta(str(tmp_path), 33)


def test_data_errors_name_the_fix(tmp_path):
    missing = tmp_path / "data" / "pydoc"
    with pytest.raises(RunError, match=f"no {missing}/meta.json: .*`python prepare_data.py --source pydoc "
                                       f"--tokenizer byte --out_dir {tmp_path}/data`"):
        load_meta(str(missing), 32)
    write_dataset(tmp_path / "data" / "mine")
    with open(tmp_path / "data" / "mine" / "val.bin", "r+b") as f:
        f.truncate(100)
    with pytest.raises(
        RunError,
        match="val.bin has 100 bytes but meta.json says 800 tokens x 2 bytes: the data is "
        "incomplete, re-run `python prepare_data.py --input <your files> --name mine",
    ):
        load_meta(str(tmp_path / "data" / "mine"), 32)
    meta = json.loads((tmp_path / "data" / "mine" / "meta.json").read_text())
    (tmp_path / "data" / "mine" / "meta.json").write_text(json.dumps(meta | {"vocab_size": 65537}))
    with pytest.raises(RunError, match=r"vocab_size 65537 does not fit uint16 tokens \(ids up to 65535\)"):
        load_meta(str(tmp_path / "data" / "mine"), 32)     # the ids would have wrapped around


def test_val_windows_are_fixed_even_and_cover_the_split():
    starts = val_starts(1000, 32, 10)
    assert starts == val_starts(1000, 32, 10)         # no randomness: identical across runs and variants
    assert starts[0] == 0 and starts[-1] == 1000 - 32 - 1
    assert max(np.diff(starts)) - min(np.diff(starts)) <= 1    # evenly strided
    shards = [starts[r::3] for r in range(3)]           # dealt to 3 ranks: every window exactly once
    assert sorted(sum(shards, [])) == starts
    assert val_starts(33, 32, 4) == [0, 0, 0, 0]


# -----------------------------------------------------------------------------
# Checkpoints

def tiny_model():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=16, vocab_size=64, layout=""))
    optimizer = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu")
    x = torch.randint(0, 64, (2, 16))
    model(x, x)[1].backward()
    optimizer.step()
    return model, optimizer


def test_checkpoint_round_trip_with_weights_only(tmp_path):
    model, optimizer = tiny_model()
    gen = torch.Generator().manual_seed(5)
    gen_draw = torch.randint(100, (3,), generator=gen)      # advance it, so its state is not the seed's
    path = str(tmp_path / "ckpt.pt")
    states = rng_states(gen)
    save_checkpoint(path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7,
                           "rng": [states], "model_config": {"n_layer": 1}})
    expected = (torch.rand(3), np.random.rand(), torch.randint(100, (3,), generator=gen))
    assert os.listdir(tmp_path) == ["ckpt.pt"]        # the temporary file was renamed away
    # what load_checkpoint does; must not need pickled classes
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["step"] == 7 and not gen_draw.equal(expected[2])
    for k, v in model.state_dict().items():
        assert torch.equal(ckpt["model"][k], v)
    saved_state = ckpt["optimizer"]["state"]
    for i, state in optimizer.state_dict()["state"].items():
        assert torch.equal(saved_state[i]["exp_avg"], state["exp_avg"])
        assert torch.equal(saved_state[i]["exp_avg_sq"], state["exp_avg_sq"])
    set_rng_states(load_checkpoint(path)["rng"][0], gen)     # the RNGs replay the same draws
    assert torch.equal(torch.rand(3), expected[0]) and np.random.rand() == expected[1]
    assert torch.equal(torch.randint(100, (3,), generator=gen), expected[2])


def test_resume_rejects_a_different_architecture():
    cfg = GPTConfig(n_embd=64, n_head=4, layout="1+2R2+1", vocab_size=128, block_size=16)
    stored = {"model_config": dataclasses.asdict(cfg), "model": GPT(cfg).state_dict()}

    def resumed(*argv):
        model_cfg, _, given = load("--init_from=resume", *argv)
        return model_config_from_checkpoint(stored, model_cfg, given)

    assert resumed().layout == "1+2R2+1"              # nothing given: take it
    assert resumed("--n_embd=64", "--n_head=4").n_embd == 64
    with pytest.raises(RunError, match=r"differs from the checkpoint's in n_head \(given 2, checkpoint 4\); "
                                       r"the tensor shapes agree$"):
        resumed("--n_embd=64", "--n_head=2", "--layout=1+2R2+1", "--vocab_size=128", "--block_size=16")
    with pytest.raises(
        RunError,
        match=r"in layout \(given '1\+1R2\+1', checkpoint '1\+2R2\+1'\); tensor shapes "
        r"\(checkpoint vs given\): layers\.3\.ln1\.weight is not in this model, .* more$",
    ):
        resumed("--n_embd=64", "--n_head=4", "--layout=1+1R2+1", "--vocab_size=128", "--block_size=16")


def test_resume_compares_exactly_the_model_keys_given():
    """A model key given on resume is compared with the checkpoint even when it equals GPTConfig's default;
    a key not given is never compared, even when this launch's config derives another value for it."""
    cfg = GPTConfig(
        n_embd=64, n_head=4, n_layer=2, mlp_hidden=100, vocab_size=128, block_size=16, norm_eps=1e-6
    )
    stored = {"model_config": dataclasses.asdict(cfg), "model": GPT(cfg).state_dict()}

    def resumed(*argv):
        model_cfg, _, given = load("--init_from=resume", *argv)
        return model_config_from_checkpoint(stored, model_cfg, given)

    with pytest.raises(
        RunError,
        match=r"differs from the checkpoint's in vocab_size \(given 50304, checkpoint 128\), "
        r"n_layer \(given 12, checkpoint 2\); tensor shapes",
    ):
        resumed("--n_layer=12", "--vocab_size=50304", "--n_embd=64", "--n_head=4")   # 12, 50304: the defaults
    with pytest.raises(
        RunError, match=r"in norm_eps \(given 1e-05, checkpoint 1e-06\); the tensor shapes agree$"
    ):
        resumed("--norm_eps=1e-5")
    # given n_embd=64 derives mlp_hidden = 256 here; mlp_hidden was not given, so the checkpoint's 100 stands
    assert (resumed("--n_embd=64", "--n_head=4", "--n_layer=2").mlp_hidden, resumed().mlp_hidden) == (
        100,
        100,
    )


def test_settle_config_settles_resume_then_the_batch(tmp_path):
    """settle_config: the resumed run's model and batch settings come from its checkpoint before the
    gradient accumulation is derived from them (and from the world size)."""
    model_cfg = GPTConfig(n_layer=1, n_embd=32, n_head=2, block_size=32, vocab_size=320)
    run_cfg = TrainConfig(total_batch_size=512, batch_size=4, out_dir=str(tmp_path))
    save_checkpoint(str(tmp_path / "ckpt.pt"), {"model": GPT(model_cfg).state_dict(),
                                                "model_config": dataclasses.asdict(model_cfg),
                                                "train_config": dataclasses.asdict(run_cfg)})
    settled = settle_config(["--init_from=resume", f"--out_dir={tmp_path}"], world_size=2)
    assert (settled.model_cfg, settled.cfg.total_batch_size, settled.grad_accum) == (model_cfg, 512, 2)
    assert settled.ckpt["model_config"] == dataclasses.asdict(model_cfg) and settled.hf_weights is None
    assert settled.given == {"init_from", "out_dir"}
    assert settle_config(["--n_layer=1", "--batch_size=2", "--total_batch_size=8192"]).grad_accum == 4
    with pytest.raises(ConfigError, match=r"= 4 \* 32 \* 3 = 384"):
        settle_config(["--init_from=resume", f"--out_dir={tmp_path}"], world_size=3)


def test_resume_without_the_config_file_continues_the_same_run():
    """`--init_from=resume` alone takes data, batch and schedule from the checkpoint (not the defaults);
    keys given again win; this launch's system settings (device, out_dir, ...) always apply."""
    run_cfg = TrainConfig(
        dataset="fineweb_edu",
        total_batch_size=4096,
        batch_size=2,
        learning_rate=3e-4,
        max_iters=900,
        device="cpu",
        out_dir="old",
    )
    ckpt = {"train_config": dataclasses.asdict(run_cfg)}
    _, cfg, given = load("--init_from=resume", "--out_dir=new")
    cfg = train_config_from_checkpoint(ckpt, cfg, given)
    assert (cfg.dataset, cfg.total_batch_size, cfg.batch_size, cfg.learning_rate, cfg.max_iters) == \
        ("fineweb_edu", 4096, 2, 3e-4, 900)
    assert (cfg.out_dir, cfg.device, cfg.init_from) == ("new", "auto", "resume")
    _, cfg, given = load("--init_from=resume", "--max_iters=1800")       # extend the run
    assert train_config_from_checkpoint(ckpt, cfg, given).max_iters == 1800


def test_resume_keys_given_again_win_even_at_their_default_values():
    """6e-4, 200, 5000, 0.1 and 16 are TrainConfig's defaults; given on resume, they still replace the
    checkpoint's values, and the keys not given keep the checkpoint's."""
    run_cfg = TrainConfig(learning_rate=2e-3, min_lr=2e-4, warmup_iters=30, max_iters=4, weight_decay=0.01,
                          batch_size=4, total_batch_size=4096)
    ckpt = {"train_config": dataclasses.asdict(run_cfg)}
    _, cfg, given = load(
        "--init_from=resume",
        "--learning_rate=6e-4",
        "--warmup_iters=200",
        "--max_iters=5000",
        "--weight_decay=0.1",
        "--batch_size=16",
    )
    cfg = train_config_from_checkpoint(ckpt, cfg, given)
    assert (cfg.learning_rate, cfg.warmup_iters, cfg.max_iters, cfg.weight_decay, cfg.batch_size) == \
        (6e-4, 200, 5000, 0.1, 16)
    assert (cfg.min_lr, cfg.total_batch_size) == (2e-4, 4096)           # not given: the checkpoint's
    # 8.955e-6 (the checkpoint's schedule: 1.94e-4)
    assert get_lr(2, cfg) == pytest.approx(6e-4 * 3 / 201)
    _, cfg, given = load("--init_from=resume", "--learning_rate=1e-4")
    with pytest.raises(ConfigError, match=r"^min_lr = 0\.0002 must be <= learning_rate = 0\.0001 \(with the "
                                          r"checkpoint's other settings\)$"):
        train_config_from_checkpoint(ckpt, cfg, given)


def test_resumed_run_uses_the_given_default_valued_lr_and_warmup(tmp_path):
    """End to end: train 2 steps at lr 2e-3 with 30 warmup steps, then resume giving learning_rate=6e-4 and
    warmup_iters=200 (TrainConfig's defaults): steps 2 and 3 use 6e-4 * (step + 1) / 201."""
    write_dataset(tmp_path / "data" / "fox")
    first = run("train.py", *TINY, "--dataset=fox", "--out_dir=out", "--max_iters=2", "--learning_rate=2e-3",
                "--min_lr=2e-4", "--warmup_iters=30", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    resumed = run("train.py", "--init_from=resume", "--out_dir=out", "--max_iters=4", "--learning_rate=6e-4",
                  "--warmup_iters=200", "--progress=False", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "config (given): {'out_dir': 'out', 'init_from': 'resume', 'progress': False, 'max_iters': 4, " \
           "'learning_rate': 0.0006, 'warmup_iters': 200}" in resumed.stdout
    rows = read_log(tmp_path / "out")
    header = [r for r in rows if "train_config" in r][-1]["train_config"]
    assert (header["learning_rate"], header["warmup_iters"], header["max_iters"], header["min_lr"]) == (
        6e-4,
        200,
        4,
        2e-4,
    )
    lrs = {r["step"]: r["lr"] for r in rows if "loss" in r}
    # before the resume: the first run's schedule
    assert lrs[1] == pytest.approx(2e-3 * 2 / 31)
    assert (lrs[2], lrs[3]) == (pytest.approx(8.955223880597015e-06), pytest.approx(6e-4 * 4 / 201))


def test_resume_refuses_data_of_another_tokenizer(tmp_path):
    write_dataset(tmp_path / "data" / "fox")
    out = tmp_path / "out"
    assert (
        run("train.py", *TINY, "--dataset=fox", "--max_iters=2", f"--out_dir={out}", cwd=tmp_path).returncode
        == 0
    )
    meta_path = tmp_path / "data" / "fox" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "tokenizer": "gpt2"}))
    result = run("train.py", "--init_from=resume", f"--out_dir={out}", "--max_iters=4", cwd=tmp_path)
    assert result.returncode != 0
    assert result.stderr.strip() == (
        "error: data/fox holds gpt2 tokens but the checkpoint was trained on byte tokens; "
        "resume with the run's dataset"
    )


# -----------------------------------------------------------------------------
# End to end: train.py and sample.py as a user runs them

def test_train_then_sample(tmp_path):
    write_dataset(tmp_path / "data" / "fox")
    out = tmp_path / "out"
    result = run(
        "train.py",
        *TINY,
        "--dataset=fox",
        "--max_iters=12",
        "--eval_interval=6",
        f"--out_dir={out}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    rows = read_log(out)
    assert rows[0]["init_from"] == "scratch" and rows[0]["model_config"]["n_layer"] == 2
    train_rows, val_rows = [r for r in rows if "loss" in r], [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in train_rows] == list(range(12))     # exactly max_iters optimizer steps
    assert [r["step"] for r in val_rows] == [0, 6, 12]            # evaluated at the start, interval, end
    assert val_rows[-1]["val_loss"] < val_rows[0]["val_loss"] - 1.0   # it learned the sentence
    assert train_rows[-1]["lr"] == pytest.approx(1e-3)              # min_lr at the last step
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    assert ckpt["step"] == 12 and ckpt["tokenizer"] == "byte" and ckpt["val_loss"] == val_rows[-1]["val_loss"]
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in ckpt["model"])
    assert "4 seqs x 32 tokens x 1 ranks x 2 accumulation steps" in result.stdout

    result = run(
        "sample.py",
        f"--out_dir={out}",
        "--start=The quick",
        "--num_samples=2",
        "--max_new_tokens=20",
        "--top_k=100000",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    samples = result.stdout.split("-" * 80 + "\n")
    assert len(samples) == 3 and samples[-1] == ""
    assert all(s.startswith("The quick") for s in samples[:2])
    greedy = [
        run(
            "sample.py",
            f"--out_dir={out}",
            "--temperature=0",
            "--num_samples=1",
            "--max_new_tokens=10",
            f"--start={'x' * 40}",
            cwd=tmp_path,
        )
        for _ in range(2)
    ]
    assert greedy[0].stdout == greedy[1].stdout       # greedy is deterministic
    assert "keeping its last block_size = 32" in greedy[0].stderr   # a 40-token prompt was cropped
    assert greedy[0].stdout.startswith("x" * 32)


def test_non_finite_loss_stops_and_keeps_the_last_checkpoint(tmp_path):
    write_dataset(tmp_path / "data" / "fox")
    result = run("train.py", *TINY, "--dataset=fox", "--learning_rate=1e30", "--min_lr=1e30", "--grad_clip=0",
                 "--max_iters=10", "--eval_interval=5", "--out_dir=out", cwd=tmp_path)
    assert result.returncode == 1 and result.stderr.strip() == (
        "error: non-finite train loss nan at step 1; stopped before the update, out/ckpt.pt holds the last "
        "good state"
    )
    assert load_checkpoint(str(tmp_path / "out" / "ckpt.pt"))["step"] == 0


@pytest.mark.slow
def test_t2mlr_val_mode_reaches_the_model(tmp_path):
    write_dataset(tmp_path / "data" / "fox")
    args = [*TINY, "--dataset=fox", "--t2mlr=True", "--l_start=0", "--l_end=0", "--jacobi_sweeps=2",
            "--jacobi_grad_sweeps=1", "--max_iters=2", "--eval_interval=1"]
    runs = {mode: run("train.py", *args, f"--val_mode={mode}", f"--out_dir={mode}", cwd=tmp_path)
            for mode in ("exact", "jacobi")}
    for mode, result in runs.items():
        assert result.returncode == 0, result.stderr
        assert f"step 2: val loss ({mode})" in result.stdout
        assert [r["val_mode"] for r in read_log(tmp_path / mode) if "val_loss" in r] == [mode] * 3


def test_sample_config_validates():
    assert SampleConfig().top_k == 200
    with pytest.raises(ValueError, match="top_k = 0"):
        SampleConfig(top_k=0)


@pytest.mark.slow
def test_train_mode_is_checked_and_reaches_the_model(tmp_path):
    """train_mode 'exact' trains T²MLR token by token: the middle layers run once per token (T = 32 passes
    logged per micro-step) where Jacobi runs D = 2 sweeps, and the runs differ once the gate has moved;
    another value is one error line. A model without T²MLR ignores it (as val_mode)."""
    with pytest.raises(ConfigError, match="train_mode = 'tbptt' must be one of 'jacobi', 'exact'"):
        load("--train_mode=tbptt")
    with pytest.raises(ConfigError, match=r"gate_lr_multiplier = 0.0 must be > 0"):
        load("--gate_lr_multiplier=0")
    write_dataset(tmp_path / "data" / "fox")
    args = [*TINY, "--dataset=fox", "--t2mlr=True", "--l_start=0", "--l_end=0", "--jacobi_sweeps=2",
            "--jacobi_grad_sweeps=1", "--max_iters=4", "--eval_interval=4"]
    runs = {mode: run("train.py", *args, f"--train_mode={mode}", f"--out_dir={mode}", cwd=tmp_path)
            for mode in ("exact", "jacobi")}
    rows = {}
    for mode, result in runs.items():
        assert result.returncode == 0, result.stderr
        rows[mode] = [r for r in read_log(tmp_path / mode) if "loss" in r]
        assert read_log(tmp_path / mode)[0]["train_config"]["train_mode"] == mode
    assert [r["jacobi_passes"] for r in rows["exact"]] == [32] * 4 and "token passes 32.00" in runs["exact"].stdout
    assert [r["jacobi_passes"] for r in rows["jacobi"]] == [2] * 4 and "Jacobi passes 2.00" in runs["jacobi"].stdout
    assert rows["exact"][0]["loss"] == pytest.approx(rows["jacobi"][0]["loss"], rel=1e-5)   # θ = 0: the same
    assert abs(rows["exact"][-1]["loss"] - rows["jacobi"][-1]["loss"]) > 1e-5
    # exact training's FLOPs: the middle layer once per token (as D = 1), fewer than Jacobi's D = 2
    assert rows["exact"][0]["flops"] / rows["exact"][0]["tok_s"] < rows["jacobi"][0]["flops"] / rows["jacobi"][0]["tok_s"]
    plain = run("train.py", *TINY, "--dataset=fox", "--max_iters=1", "--train_mode=exact", "--out_dir=plain",
                cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr


@pytest.mark.slow
def test_gate_lr_multiplier_reaches_the_optimizer_and_a_checkpoint_resumes_under_another(tmp_path):
    """train.py --gate_lr_multiplier=10: θ_r's first Adam step is 10x lr; the run's 2-group checkpoint of
    gate_lr_multiplier 1 resumes with 10 (the optimizer state regrouped), and the 4-group one back with 1."""
    write_dataset(tmp_path / "data" / "fox")
    args = [*TINY, "--dataset=fox", "--t2mlr=True", "--l_start=0", "--l_end=0", "--jacobi_sweeps=2",
            "--jacobi_grad_sweeps=1", "--eval_interval=1", "--grad_clip=0"]
    for m in (1, 10):
        result = run("train.py", *args, "--max_iters=1", f"--gate_lr_multiplier={m}", f"--out_dir=m{m}",
                     cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        ckpt = load_checkpoint(str(tmp_path / f"m{m}" / "ckpt.pt"))
        assert abs(ckpt["model"]["gate.theta_r"].item()) == pytest.approx(m * 1e-2, rel=1e-4)
        assert len(ckpt["optimizer"]["param_groups"]) == (2 if m == 1 else 4)
    for m, other in ((1, 10), (10, 1)):
        result = run("train.py", "--init_from=resume", f"--out_dir=m{m}", "--max_iters=2",
                     f"--gate_lr_multiplier={other}", "--progress=False", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        ckpt = load_checkpoint(str(tmp_path / f"m{m}" / "ckpt.pt"))
        assert ckpt["train_config"]["gate_lr_multiplier"] == other
        assert len(ckpt["optimizer"]["param_groups"]) == (2 if other == 1 else 4)


# -----------------------------------------------------------------------------
# Refusals: what would corrupt a run is one line, and train.py says what it does instead

def train_in(tmp_path, *args):
    return run("train.py", *TINY, "--dataset=fox", *args, cwd=tmp_path)


def one_line_error(result, *words):
    assert result.returncode != 0
    err = result.stderr.strip()
    assert err.startswith("error: ") and err.count("\n") == 0, err
    for w in words:
        assert w in err, err
    return err


def test_weights_of_another_tokenizer_are_refused(tmp_path):
    write_dataset(tmp_path / "data" / "fox")
    assert train_in(tmp_path, "--max_iters=1", "--out_dir=byte_run").returncode == 0
    gpt2 = tmp_path / "data" / "g"
    write_dataset(gpt2)
    meta = json.loads((gpt2 / "meta.json").read_text())
    (gpt2 / "meta.json").write_text(json.dumps(meta | {"tokenizer": "gpt2", "vocab_size": 300}))
    r = run("train.py", *TINY, "--data_dir=data/g", "--max_iters=1", "--out_dir=new",
            "--init_from=byte_run/ckpt.pt", cwd=tmp_path)
    one_line_error(r, "holds gpt2 tokens", "byte_run/ckpt.pt was trained on byte tokens")
    assert not (tmp_path / "new").exists()                     # refused before anything was written


def test_token_ids_beyond_the_tokenizer_are_refused_at_the_start(tmp_path):
    ids = write_dataset(tmp_path / "data" / "fox")
    bad = ids[:6000].copy()
    bad[123] = 300                                              # in the model's padded 320, not in 257
    bad.tofile(tmp_path / "data" / "fox" / "train.bin")
    one_line_error(train_in(tmp_path, "--max_iters=1", "--out_dir=o"), "300", "257")
    assert not (tmp_path / "o").exists()


def test_a_renamed_key_and_its_new_name_with_two_values_are_refused(tmp_path):
    (tmp_path / "c.py").write_text("state_passing = 'anchor'\n")
    with pytest.raises(ConfigError, match=r"state_passing='anchor' \(.*c.py\) and state_mode='residual' \(command"):
        load_config([str(tmp_path / "c.py"), "--state_mode=residual"], GPTConfig)
    with pytest.raises(ConfigError, match="name one setting with two values"):
        load_config(["--state_mode=residual", "--state_passing=anchor"], GPTConfig)
    (cfg,), _ = load_config(["--state_mode=anchor", "--state_passing=anchor"], GPTConfig)   # agree: fine
    assert cfg.state_passing == "anchor"


@pytest.mark.slow
def test_exact_training_compiles_its_parts_and_loses_what_eager_loses(tmp_path):
    """T²MLR trained exactly, token by token, under --compile=True: its layers, gate and state update are
    compiled once each (support.runtime.compile_model), and two steps' losses equal eager's to float tolerance."""
    write_dataset(tmp_path / "data" / "fox")
    losses = {}
    for flag in ("True", "False"):
        r = train_in(tmp_path, "--t2mlr=True", "--l_start=0", "--l_end=0", "--train_mode=exact", f"--compile={flag}",
                     "--max_iters=2", "--eval_interval=100", "--log_interval=1", f"--out_dir=o{flag}")
        assert r.returncode == 0, r.stderr
        assert f"compile {flag}" in r.stdout
        losses[flag] = [row["loss"] for row in read_log(tmp_path / f"o{flag}") if "loss" in row]
    assert len(losses["True"]) == 2 and losses["True"] == pytest.approx(losses["False"], rel=1e-4)


def test_a_device_this_machine_lacks_is_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    write_dataset(tmp_path / "data" / "fox")
    r = run("train.py", *TINY, "--dataset=fox", "--device=cuda", "--max_iters=1", "--out_dir=o", cwd=tmp_path)
    one_line_error(r, "device 'cuda'", "not available")


@pytest.mark.slow
def test_a_resume_with_nothing_to_train_says_so(tmp_path):
    write_dataset(tmp_path / "data" / "fox")
    assert train_in(tmp_path, "--max_iters=3", "--out_dir=o").returncode == 0
    rows = len(read_log(tmp_path / "o"))
    for max_iters in (3, 2):
        r = train_in(tmp_path, "--max_iters=%d" % max_iters, "--out_dir=o", "--init_from=resume")
        assert r.returncode == 0, r.stderr
        assert "nothing to train" in r.stdout and "holds 3 steps" in r.stdout and "done:" not in r.stdout
    assert len(read_log(tmp_path / "o")) == rows                 # and nothing logged


def test_rows_a_resume_replays_are_dropped(tmp_path):
    log = tmp_path / "log.jsonl"
    rows = [{"step": 0, "init_from": "scratch"}, {"step": 0, "val_loss": 5.0}, {"step": 0, "loss": 5.1},
            {"step": 1, "loss": 4.0}, {"step": 2, "val_loss": 3.9}, {"step": 2, "loss": 3.8},
            {"step": 3, "loss": 3.7}, {"step": 4, "val_loss": 3.5}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert trim_replayed_rows(str(log), 2) == 3                 # train rows 2, 3 and the evaluation at 4
    assert [json.loads(line) for line in log.read_text().splitlines()] == rows[:5]


def test_non_contiguous_targets_give_the_loss_of_contiguous_ones():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_embd=16, n_head=2))
    x = torch.randint(11, (3, 9))
    _, sliced = model(x[:, :-1], x[:, 1:])                      # a view with strides (9, 1), not (8, 1)
    _, copied = model(x[:, :-1].contiguous(), x[:, 1:].contiguous())
    assert torch.equal(sliced, copied)


class _Cfg:
    total_batch_size, max_iters, eval_interval, batch_size, log_interval = 1024, 1000, 100, 4, 10


def test_a_run_that_would_take_days_on_a_cpu_stops_unless_forced(capsys):
    log = RunLog.__new__(RunLog)                               # only what check_estimate reads
    log.master, log.warned, log.device, log.cfg = True, False, "cpu", train.TrainConfig()
    log.check_estimate(3600.0, "1 s a step")                   # an hour: nothing said
    assert capsys.readouterr().out == ""
    with pytest.raises(RunError, match=r"about 10 days on cpu \(1 s a step\): on a CPU train "
                                       r"config/tiny_mesh\.py .* or pass --force"):
        log.check_estimate(10 * 86400.0, "1 s a step")
    log.warned, log.cfg = False, train.TrainConfig(force=True)
    log.check_estimate(10 * 86400.0, "1 s a step")
    log.check_estimate(10 * 86400.0, "1 s a step")
    out = capsys.readouterr().out
    assert out.count("warning:") == 1 and "running anyway (--force)" in out
    log.device, log.warned, log.cfg = "cuda:0", False, train.TrainConfig()
    log.check_estimate(10 * 86400.0, "1 s a step")             # a GPU run is never stopped
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_the_main_job_on_a_cpu_stops_at_its_estimate_naming_the_tiny_configs(tmp_path):
    """config/mesh_160m.py on a CPU: the plan, then the first evaluation batch's estimate stops it."""
    data = tmp_path / "data" / "big"
    data.mkdir(parents=True)
    np.random.default_rng(0).integers(0, 50257, 40_000).astype(np.uint16).tofile(data / "train.bin")
    np.random.default_rng(1).integers(0, 50257, 20_000).astype(np.uint16).tofile(data / "val.bin")
    (data / "meta.json").write_text(json.dumps({"tokenizer": "gpt2", "vocab_size": 50257, "eot": 50256,
                                                "dtype": "uint16", "train_tokens": 40_000, "val_tokens": 20_000}))
    done = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), os.path.join(ROOT, "config", "mesh_160m.py"), "--device=cpu", "--dataset=big",
                           "--batch_size=1", "--eval_iters=2", "--progress=False"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert done.returncode != 0
    assert "params: total" in done.stdout and "tokens/step" in done.stdout and "evaluating:" in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: at this speed the run would take about") and "tiny_mesh.py" in last
    assert not (tmp_path / "out" / "ckpt.pt").exists()
