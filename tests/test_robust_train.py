"""
train.py refuses what would corrupt a run, in one line, and says what it does instead of hanging or
claiming work it did not do: weights read under another tokenizer, token ids the tokenizer cannot make, a
renamed key given with its new name and another value, exact training compiled, a device this machine
lacks, a resume with nothing to train, log rows a resume replays, a run far too slow for its device;
non-contiguous targets in GPT.forward.

    python -m pytest -q tests/test_robust_train.py
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import train
from configurator import ConfigError, load_config
from model import GPT, GPTConfig
from support.runlog import RunLog, trim_replayed_rows
from support.runtime import RunError
from test_train import ROOT, TINY, read_log, run, write_dataset


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
