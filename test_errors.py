"""
Bad input to train.py, sample.py and prepare_data.py, run as a user runs them: each case must exit non-zero
with ONE line on stderr, `error: ...`, naming the bad value and what would be valid, and must leave every
existing output (a trained run's ckpt.pt and log.jsonl, the prepared data) byte for byte as it was.

The cases run as subprocesses, four at a time, once per module (about 20 s on 2 cores).

    python -m pytest -q test_errors.py
"""

import hashlib
import json
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from test_train import ROOT, TINY, run, write_dataset

# case -> (script, arguments, a regex the one stderr line must match after "error: ")
T2MLR = ["--flavour=llama", "--mlp_hidden=64", "--t2mlr=True"]
CASES = {
    "unknown key, command line": ("train.py", ["--batch_sise=4"],
                                  r"unknown config key 'batch_sise' in command line \(did you mean 'batch_size'\?\)"),
    "unknown key, config file": ("train.py", ["typo.py"],
                                 r"unknown config key 'n_layers' in typo\.py \(did you mean 'n_layer'\?\)"),
    "wrong value type": ("train.py", ["--learning_rate=fast"], r"learning_rate='fast' \(command line\): expected float"),
    "malformed layout": ("train.py", ["--layout=2+4X2+2"],
                         r"layout '2\+4X2\+2' is malformed; expected 'P\+CRK\+Q' .*e\.g\. '2\+4R2\+2'"),
    "layout without loops": ("train.py", ["--layout=1+1R0+1"], r"layout '1\+1R0\+1' needs .* K >= 1 loops"),
    "l_start > l_end": ("train.py", [*T2MLR, "--l_start=1", "--l_end=0"],
                        r"l_start = 1, l_end = 0 must give 0 <= l_start <= l_end < n_layer = 2"),
    "l_end out of range": ("train.py", [*T2MLR, "--l_start=0", "--l_end=2"],
                           r"l_start = 0, l_end = 2 must give 0 <= l_start <= l_end < n_layer = 2"),
    "mesh_slots < 2": ("train.py", ["--layout=1+1R2+1", "--state_mode=mesh", "--mesh_slots=1"],
                       r"mesh_slots = 1 must be >= 2"),
    "block_size < 1": ("train.py", ["--block_size=0"], r"block_size = 0 must be >= 1"),
    "batch not divisible": ("train.py", ["--total_batch_size=1000"],
                            r"total_batch_size = 1000 tokens is not a multiple of batch_size \* block_size \* "
                            r"world_size = 4 \* 32 \* 1 = 128"),
    "data missing": ("train.py", ["--dataset=nope"], r"no data/nope/meta\.json: prepare the data first with "
                                                     r"`python prepare_data\.py --input <your files> --name nope`"),
    "split too short": ("train.py", ["--dataset=short"], r"the val split has 20 tokens, fewer than block_size \+ 1 = 33"),
    "interrupted prepare": ("train.py", ["--dataset=half"], r"no data/half/meta\.json \(an interrupted prepare_data\.py "
                                                            r"run left \*\.tmp files\): prepare the data first with `python"),
    "data vocab > model vocab": ("train.py", ["--vocab_size=200"], r"the data's vocab_size 257 \(meta\.json\) exceeds "
                                                                   r"the model's vocab_size 200; set vocab_size >= 257"),
    "vocab too big for uint16": ("train.py", ["--dataset=wide", "--vocab_size=70016"],
                                 r"vocab_size 70000 does not fit uint16 tokens \(ids up to 65535\); re-run `python "
                                 r"prepare_data\.py"),
    "another architecture": ("train.py", ["--init_from=resume", "--n_embd=64"],
                             r"the model config differs from the checkpoint's in n_embd \(given 64, checkpoint 32\), mlp_hidden "
                             r"\(given 256, checkpoint 128\); "
                             r"tensor shapes \(checkpoint vs given\): wte\.weight \(320, 32\) vs \(320, 64\), .* more"),
    "scratch over a run": ("train.py", [], r"run/ckpt\.pt exists: continue it with --init_from=resume, or choose "
                                          r"another out_dir"),
    "sample: no checkpoint": ("sample.py", ["--out_dir=nothing"], r"no checkpoint at nothing/ckpt\.pt"),
    "sample: not a checkpoint": ("sample.py", ["--out_dir=garbage"], r"cannot read checkpoint garbage/ckpt\.pt: "),
    "sample: truncated checkpoint": ("sample.py", ["--out_dir=truncated"],
                                     r"cannot read checkpoint truncated/ckpt\.pt: .*zip"),
    "prepare: empty file": ("prepare_data.py", ["--input", "empty/in.jsonl", "--tokenizer=byte"],
                            r"no non-empty documents in: empty/in\.jsonl"),
    "prepare: only empty documents": ("prepare_data.py", ["--input", "blank/in.jsonl", "--tokenizer=byte"],
                                      r"no non-empty documents in: blank/in\.jsonl"),
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
    (ws / "data" / "half").mkdir()                    # what a killed prepare_data.py leaves (see test_data.py)
    (ws / "data" / "half" / "train.bin.tmp").write_bytes(b"\0" * 100)
    (ws / "typo.py").write_text("n_layers = 2\n")
    for name, text in (("good", '{"text": "one"}\n{"text": "two"}\n'), ("empty", ""), ("blank", '{"text": " "}\n')):
        (ws / name).mkdir()
        (ws / name / "in.jsonl").write_text(text)
    prepared = subprocess.run([sys.executable, f"{ROOT}/prepare_data.py", "--input", "good/in.jsonl", "--tokenizer=byte"],
                              cwd=ws, capture_output=True, text=True)
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
    base = {"train.py": [*TINY, "--dataset=fox", "--out_dir=run", "--max_iters=2"], "sample.py": [], "prepare_data.py": []}
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
