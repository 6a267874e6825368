"""
Bad input to train.py, sample.py and prepare_data.py, run as a user runs them: each case must exit non-zero
with ONE line on stderr, `error: ...`, naming the bad value and what would be valid, and must leave every
existing output (a trained run's ckpt.pt and log.jsonl, the prepared data) byte for byte as it was.

The cases run as subprocesses, four at a time, once per module (about 20 s on 2 cores).
Below them, in process: every numeric field of GPTConfig, TrainConfig and SampleConfig against its range
(a bad value is refused naming the field, a boundary value is accepted).

    python -m pytest -q tests/test_errors.py
"""

import dataclasses
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
import typing
from concurrent.futures import ThreadPoolExecutor

import pytest

from configurator import ConfigError, load_config
from model import GPTConfig
from sample import SampleConfig
from test_train import ROOT, TINY, run, write_dataset
from train import TrainConfig

# case -> (script, arguments, a regex the one stderr line must match after "error: ")
T2MLR = ["--flavour=llama", "--mlp_hidden=64", "--t2mlr=True"]
CASES = {
    "unknown key, command line": (
        "train.py",
        ["--batch_sise=4"],
        r"unknown config key 'batch_sise' in command line \(did you mean 'batch_size'\?\)",
    ),
    "unknown key, config file": (
        "train.py",
        ["typo.py"],
        r"unknown config key 'n_layers' in typo\.py \(did you mean 'n_layer'\?\)",
    ),
    "wrong value type": (
        "train.py",
        ["--learning_rate=fast"],
        r"learning_rate='fast' \(command line\): expected float",
    ),
    "malformed layout": (
        "train.py",
        ["--layout=2+4X2+2"],
        r"layout = '2\+4X2\+2' must be '' \(flat\) or 'P\+NRK\+Q'.*e\.g\. '2\+4R2\+2'",
    ),
    "layout without loops": ("train.py", ["--layout=1+1R0+1"], r"layout = '1\+1R0\+1' must be .* K >= 1 times"),
    "l_start > l_end": (
        "train.py",
        [*T2MLR, "--l_start=1", "--l_end=0"],
        r"l_start = 1 must be <= l_end = 0, both in -2 \.\. 1",
    ),
    "l_end out of range": (
        "train.py",
        [*T2MLR, "--l_start=0", "--l_end=2"],
        r"l_start = 0 must be <= l_end = 2, both in -2 \.\. 1",
    ),
    "mesh_slots < 2": (
        "train.py",
        ["--layout=1+1R2+1", "--state_passing=mesh", "--mesh_slots=1"],
        r"mesh_slots = 1 must be >= 2",
    ),
    "block_size < 1": ("train.py", ["--block_size=0"], r"block_size = 0 must be >= 1"),
    "rope_pct > 1": (
        "train.py",
        [f"{ROOT}/config/tiny_vanilla.py", "--rope_pct=1.5"],
        r"rope_pct = 1\.5 must be in \[0, 1\] or None",
    ),
    "rope_pct < 0": ("train.py", ["--rope_pct=-0.25"], r"rope_pct = -0\.25 must be in \[0, 1\] or None"),
    "rope_theta inf": ("train.py", ["--rope_theta=1e999"], r"rope_theta = inf must be finite and > 0"),
    "beta2 = 1": ("train.py", ["--beta2=1.0"], r"beta2 = 1\.0 must be in \[0, 1\)"),
    "sample: temperature < 0": (
        "sample.py",
        ["--out_dir=run", "--temperature=-0.5"],
        r"temperature = -0\.5 must be >= 0",
    ),
    "batch not divisible": (
        "train.py",
        ["--total_batch_size=1000"],
        r"total_batch_size = 1000 tokens is not a multiple of batch_size \* block_size \* "
        r"world_size = 4 \* 32 \* 1 = 128",
    ),
    "data missing": (
        "train.py",
        ["--dataset=nope"],
        r"no data/nope/meta\.json: prepare the data first with "
        r"`python prepare_data\.py --input <your files> --name nope`",
    ),
    "split too short": (
        "train.py",
        ["--dataset=short"],
        r"block_size = 32 needs at least 33 tokens in each split, but data/short/val\.bin has 20: set "
        r"--block_size <= 19, or re-run prepare_data\.py with --val_fraction",
    ),
    "interrupted prepare": (
        "train.py",
        ["--dataset=half"],
        r"no data/half/meta\.json \(an interrupted prepare_data\.py "
        r"run left \*\.tmp files\): prepare the data first with `python",
    ),
    "data vocab > model vocab": (
        "train.py",
        ["--vocab_size=200"],
        r"the data's vocab_size 257 \(meta\.json\) exceeds "
        r"the model's vocab_size 200; set vocab_size >= 257",
    ),
    "vocab too big for uint16": (
        "train.py",
        ["--dataset=wide", "--vocab_size=70016"],
        r"vocab_size 70000 does not fit uint16 tokens \(ids up to 65535\); re-run `python "
        r"prepare_data\.py",
    ),
    "another architecture": (
        "train.py",
        ["--init_from=resume", "--n_embd=64"],
        r"the model config differs from the checkpoint's in n_embd \(given 64, checkpoint 32\); "
        r"tensor shapes \(checkpoint vs given\): "
        r"wte\.weight \(320, 32\) vs this model's \(320, 64\), .* more",
    ),
    "scratch over a run": (
        "train.py",
        [],
        r"run/ckpt\.pt exists: continue it with --init_from=resume, or choose " r"another out_dir",
    ),
    "sample: no checkpoint": ("sample.py", ["--out_dir=nothing"], r"no checkpoint at nothing/ckpt\.pt "
                              r"\(--out_dir=nothing\); no ckpt\.pt under out/: train one first"),
    "sample: not a checkpoint": (
        "sample.py",
        ["--out_dir=garbage"],
        r"cannot read checkpoint garbage/ckpt\.pt: ",
    ),
    "sample: truncated checkpoint": (
        "sample.py",
        ["--out_dir=truncated"],
        r"cannot read checkpoint truncated/ckpt\.pt: .*zip",
    ),
    "prepare: empty file": (
        "prepare_data.py",
        ["--input", "empty/in.jsonl", "--tokenizer=byte"],
        r"no non-empty documents in: empty/in\.jsonl",
    ),
    "prepare: only empty documents": (
        "prepare_data.py",
        ["--input", "blank/in.jsonl", "--tokenizer=byte"],
        r"no non-empty documents in: blank/in\.jsonl",
    ),
}


def snapshot(folder):
    """{relative path: (sha256, mtime_ns)} of every file under folder."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Set up a workspace with a trained run and prepared data, run every case in it, and return
    ({case: CompletedProcess}, snapshot before, snapshot after)."""
    ws = tmp_path_factory.mktemp("errors")
    write_dataset(ws / "data" / "fox")
    write_dataset(ws / "data" / "short", val_tokens=20)
    shutil.copytree(ws / "data" / "fox", ws / "data" / "wide")
    meta = json.loads((ws / "data" / "wide" / "meta.json").read_text())
    (ws / "data" / "wide" / "meta.json").write_text(json.dumps(meta | {"vocab_size": 70000}))
    # what a killed prepare_data.py leaves (see test_data.py)
    (ws / "data" / "half").mkdir()
    (ws / "data" / "half" / "train.bin.tmp").write_bytes(b"\0" * 100)
    (ws / "typo.py").write_text("n_layers = 2\n")
    for name, text in (
        ("good", '{"text": "one"}\n{"text": "two"}\n'),
        ("empty", ""),
        ("blank", '{"text": " "}\n'),
    ):
        (ws / name).mkdir()
        (ws / name / "in.jsonl").write_text(text)
    prepared = subprocess.run(
        [sys.executable, f"{ROOT}/prepare_data.py", "--input", "good/in.jsonl", "--tokenizer=byte"],
        cwd=ws,
        capture_output=True,
        text=True,
    )
    assert prepared.returncode == 0 and (ws / "data" / "in" / "meta.json").exists(), prepared.stderr
    trained = run("train.py", *TINY, "--dataset=fox", "--max_iters=1", "--out_dir=run", cwd=ws)
    assert trained.returncode == 0, trained.stderr
    (ws / "garbage").mkdir()
    (ws / "garbage" / "ckpt.pt").write_bytes(b"not a checkpoint")
    (ws / "truncated").mkdir()
    ckpt = (ws / "run" / "ckpt.pt").read_bytes()
    (ws / "truncated" / "ckpt.pt").write_bytes(ckpt[:len(ckpt) // 2])

    before = snapshot(ws)
    # Every train.py case points at the trained run (--out_dir=run) and the fox data unless it says otherwise.
    base = {
        "train.py": [*TINY, "--dataset=fox", "--out_dir=run", "--max_iters=2"],
        "sample.py": [],
        "prepare_data.py": [],
    }
    with ThreadPoolExecutor(4) as pool:
        futures = {case: pool.submit(run, script, *base[script], *args, cwd=ws)
                   for case, (script, args, _) in CASES.items()}
        done = {case: f.result() for case, f in futures.items()}
    return done, before, snapshot(ws)


@pytest.mark.parametrize("case", CASES)
def test_one_line_error(results, case):
    result = results[0][case]
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert re.fullmatch(CASES[case][2] + ".*", lines[0][len("error: "):]), lines[0]


def test_errors_overwrite_nothing(results):
    _, before, after = results
    assert "run/ckpt.pt" in before and "data/in/meta.json" in before and "data/fox/train.bin" in before
    assert after == before                            # no file written, removed or touched by any case


# -----------------------------------------------------------------------------
# The range of every numeric config field: (class, field, bad values, valid boundary values, other fields)

NAN, INF = math.nan, math.inf
T2 = dict(t2mlr=True)
RANGE_CASES = [
    (GPTConfig, "vocab_size", [0], [1], {}),
    (GPTConfig, "block_size", [0, -1], [1], {}),
    (GPTConfig, "n_layer", [0], [1], {}),
    (GPTConfig, "n_head", [0], [1], {}),
    (GPTConfig, "n_kv_head", [0], [1], {}),
    (GPTConfig, "n_embd", [0], [1], dict(n_head=1)),
    (GPTConfig, "mlp_hidden", [0], [1], {}),
    (GPTConfig, "rope_theta", [0.0, -1.0, INF, NAN], [1e-9], {}),
    (GPTConfig, "rope_pct", [1.5, -0.25, 1.0001, NAN], [0.0, 1.0], {}),
    (GPTConfig, "norm_eps", [0.0, -1e-5, NAN], [1e-12], {}),
    (GPTConfig, "mesh_slots", [1, 0], [2], dict(layout="1+1R2+1", state_passing="mesh")),
    (GPTConfig, "jacobi_sweeps", [0], [1], dict(T2, jacobi_grad_sweeps=1)),
    (GPTConfig, "jacobi_grad_sweeps", [-1], [0], T2),
    (GPTConfig, "jacobi_lag", [-1], [0, 3], T2),
    (GPTConfig, "gate_bias_prob", [0.0, 1.0, NAN], [1e-6, 1 - 1e-6], T2),
    (GPTConfig, "gate_weight_gain", [0.0, INF], [1e-6], T2),
    (GPTConfig, "jacobi_tol", [-1e-3, 1.0, NAN], [0.0, 0.999], T2),
    (GPTConfig, "max_loops", [1, 0], [2, 16], dict(layout="1+1R2+1", state_passing="mesh")),
    (TrainConfig, "eval_interval", [0], [1], {}),
    (TrainConfig, "eval_iters", [0], [1], {}),
    (TrainConfig, "log_interval", [0], [1], {}),
    (TrainConfig, "total_batch_size", [0], [1], {}),
    (TrainConfig, "batch_size", [0], [1], {}),
    (TrainConfig, "max_iters", [-1], [0], {}),
    (TrainConfig, "lr_decay_iters", [0], [1], {}),
    (TrainConfig, "learning_rate", [-1e-3, NAN, INF], [0.0], dict(min_lr=0.0)),
    (TrainConfig, "min_lr", [-1e-5, NAN], [0.0], {}),
    (TrainConfig, "warmup_iters", [-1], [0], {}),
    (TrainConfig, "weight_decay", [-0.1, INF], [0.0], {}),
    (TrainConfig, "beta1", [1.0, -0.1, NAN], [0.0, 0.999], {}),
    (TrainConfig, "beta2", [1.0, 1.5], [0.0, 0.999], {}),
    (TrainConfig, "grad_clip", [-1.0, NAN], [0.0], {}),
    (TrainConfig, "seed", [-1, 2 ** 32], [0, 2 ** 32 - 1], {}),
    (TrainConfig, "peak_flops", [0.0, -1.0, INF], [1.0], {}),
    (TrainConfig, "val_tol", [-1e-6, 1.0, NAN], [0.0, 0.5], {}),
    (TrainConfig, "gate_lr_multiplier", [0.0, -1.0, NAN], [1.0, 10.0], {}),
    (SampleConfig, "num_samples", [0], [1], {}),
    (SampleConfig, "batch_size", [0], [1], {}),
    (SampleConfig, "max_new_tokens", [-1], [0], {}),
    (SampleConfig, "temperature", [-0.1, NAN, INF], [0.0], {}),
    (SampleConfig, "top_k", [0], [1], {}),
    (SampleConfig, "seed", [-1, 2 ** 64], [0, 2 ** 64 - 1], {}),
    (SampleConfig, "prefill_tol", [-1e-6, 1.0, NAN], [0.0, 0.5], {}),
    (SampleConfig, "n_loops", [0, -1], [1, 8], {}),
    (SampleConfig, "exit_threshold", [-1e-6, NAN, INF], [0.0, 0.5], {}),
    (TrainConfig, "loops_backprop", [0, -1], [1], {}),
]
# numeric fields that take any value on their own: negative layer indices count from the end, and
# model.check checks them against n_layer
ANY_VALUE = {(GPTConfig, "l_start"), (GPTConfig, "l_end")}


def numeric_fields(cls):
    """The int and float fields of a dataclass, Optional ones included (bool is not numeric here)."""
    hints = typing.get_type_hints(cls)
    return {
        f.name
        for f in dataclasses.fields(cls)
        if {int, float} & set(typing.get_args(hints[f.name]) or [hints[f.name]])
    }


@pytest.mark.parametrize("cls", [GPTConfig, TrainConfig, SampleConfig])
def test_every_numeric_field_has_a_range_case(cls):
    covered = {name for c, name, *_ in RANGE_CASES if c is cls} | {name for c, name in ANY_VALUE if c is cls}
    assert numeric_fields(cls) == covered


@pytest.mark.parametrize(
    "cls, name, bad, good, others", RANGE_CASES, ids=[f"{c.__name__}.{n}" for c, n, *_ in RANGE_CASES]
)
def test_numeric_field_out_of_range_is_refused(cls, name, bad, good, others):
    for value in bad:
        with pytest.raises(ValueError, match=f"^{name} = {re.escape(repr(value))} must be "):
            cls(**{**others, name: value})
    for value in good:
        assert getattr(cls(**{**others, name: value}), name) == value


def test_check_refuses_a_setting_it_has_no_rule_for():
    """model.check knows every setting it is asked about: a misspelt name is a TypeError, not a pass; a field of
    the config it is given is free without a rule (tie_embeddings), and a field with one is still tested."""
    from model import check
    with pytest.raises(TypeError, match=r"^check: no rule for temprature$"):
        check(temprature=-1.0)
    cfg = GPTConfig()
    check(cfg, tie_embeddings=True, temperature=0.5)
    with pytest.raises(TypeError, match=r"^check: no rule for n_loop$"):
        check(cfg, n_loop=2)
    with pytest.raises(ValueError, match=r"^temperature = -1.0 must be >= 0"):
        check(cfg, tie_embeddings=True, temperature=-1.0)


def test_out_of_range_reaches_the_user_as_a_config_error(tmp_path):
    (tmp_path / "nan.py").write_text("rope_theta = float('nan')\n")
    with pytest.raises(ConfigError, match=r"^rope_theta = nan must be finite and > 0$"):
        load_config([str(tmp_path / "nan.py")], GPTConfig, TrainConfig)
    with pytest.raises(ConfigError, match=r"^jacobi_grad_sweeps = 5 must be in \[0, jacobi_sweeps = 4\]"):
        load_config(["--t2mlr=True", "--jacobi_sweeps=4", "--jacobi_grad_sweeps=5"], GPTConfig, TrainConfig)
