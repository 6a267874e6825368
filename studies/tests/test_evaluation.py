"""
Evaluation results that are never stale and runs that never dead-end (studies/table1.py, support/harness.py,
docs/evaluation.md; CPU, ~1 minute): a checkpoint trained further is evaluated again; perplexity-only tables;
the local task YAMLs of docs/evaluation.md run as written there; without the network, a task whose data is
not cached fails at once, in one line.

Needs lm_eval (pip install -r requirements-eval.txt); skipped without it, unless NANOMESH_REQUIRE_LM_EVAL=1.
"""

import json
import math
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval", reason="the evaluation tests need lm_eval: pip install -r requirements-eval.txt")
import lm_eval                                          # noqa: E402
from lm_eval.tasks import TaskManager                   # noqa: E402

from studies import table1                              # noqa: E402
from support import harness                             # noqa: E402
from support.checkpoints import save_checkpoint         # noqa: E402
from test_harness import (adapter, direct_loglikelihood, direct_rolling, direct_scores, local_tasks_only,  # noqa: E402,F401
                          model_of, write_tasks)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def save_run(folder, name, seed, step):
    """A train.py-shaped checkpoint of the variant `name` (weights from `seed`) at folder/ckpt.pt, written as
    train.py writes it; returns the model in float64 for the direct scores."""
    model = model_of(name, torch.float32, seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    save_checkpoint(str(folder / "ckpt.pt"), {"model": model.state_dict(), "model_config": asdict(model.cfg),
                                              "tokenizer": "byte", "step": step, "val_loss": 0.0})
    return model.double()


# -----------------------------------------------------------------------------
# studies.table1: stale runs, perplexities only

def test_a_checkpoint_trained_further_is_evaluated_again(tmp_path, monkeypatch, capsys, offline, local_tasks_only):
    """Evaluate, then write other weights (step 5) to the same ckpt.pt: the rerun evaluates it again and
    stores the new model's scores, equal to the direct computation; a rerun after that skips it."""
    monkeypatch.setattr(table1, "TASKS", {"tiny_mc": ("MC", "acc_norm")})
    monkeypatch.setattr(table1, "PERPLEXITIES", {"tiny_roll": ("Roll (word)", "word_perplexity")})
    tasks = write_tasks(tmp_path / "tasks")
    run = tmp_path / "run"
    argv = [str(run), "--out", str(tmp_path / "out"), "--shots", "0", "--include_path", str(tasks), "--device",
            "cpu", "--batch_size", "4"]
    key = f"{run} | 0-shot"

    def stored():
        return json.loads((tmp_path / "out" / "table1.json").read_text())["runs"][key]

    models = []
    for seed, step in ((0, 2), (1, 5)):
        models.append(save_run(run, "vanilla_neox", seed, step))
        table1.main(argv)
        _, acc_norm, word_ppl = direct_scores(models[-1])
        assert stored()["ppl"]["tiny_roll"][0] == pytest.approx(word_ppl, rel=1e-4)
        assert stored()["acc"]["tiny_mc"][0] == pytest.approx(acc_norm)
        assert stored()["checkpoint"]["step"] == step
    err = capsys.readouterr().err
    assert re.search(rf"{re.escape(key)}: {re.escape(str(run))} changed since it was evaluated \(step 2, written "
                     rf"[-\d :]+; now step 5, written [-\d :]+\): evaluating it again", err), err
    assert direct_scores(models[0])[2] != pytest.approx(direct_scores(models[1])[2], rel=1e-3)   # it matters
    table1.main(argv)
    assert f"{key}: stored, skipped" in capsys.readouterr().err


def test_perplexities_only_make_a_table_and_rerun(tmp_path, monkeypatch, capsys, offline, local_tasks_only):
    """--tasks with perplexities only: the 0-shot run alone (a few-shot count is dropped, saying so), a
    perplexity table with lm_eval's value and no accuracy table; a rerun skips it and writes the same table;
    without 0 among the shots it is one ValueError before anything runs."""
    monkeypatch.setattr(table1, "TASKS", {"tiny_mc": ("MC", "acc")})
    monkeypatch.setattr(table1, "PERPLEXITIES", {"tiny_roll": ("Roll (word)", "word_perplexity")})
    tasks = write_tasks(tmp_path / "tasks")
    model = save_run(tmp_path / "run", "recursive_mesh", seed=0, step=1)
    argv = [str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--tasks", "tiny_roll", "--include_path",
            str(tasks), "--device", "cpu", "--batch_size", "4"]                   # --shots 0,5 by default
    table1.main(argv)
    assert "perplexities only: they are scored 0-shot, so only --shots 0 runs" in capsys.readouterr().err
    stored = json.loads((tmp_path / "out" / "table1.json").read_text())
    assert stored["shots"] == [0] and list(stored["runs"]) == [f"{tmp_path / 'run'} | 0-shot"]
    md = (tmp_path / "out" / "table1.md").read_text()
    ppl = stored["runs"][f"{tmp_path / 'run'} | 0-shot"]["ppl"]["tiny_roll"][0]
    assert ppl == pytest.approx(direct_scores(model)[2], rel=1e-4)
    assert f"| {tmp_path / 'run'} | {ppl:.2f} |" in md.splitlines() and "-shot** (%)" not in md
    table1.main(argv)
    assert "stored, skipped" in capsys.readouterr().err
    assert (tmp_path / "out" / "table1.md").read_text() == md
    with pytest.raises(ValueError, match=r"^tiny_roll: perplexities are scored 0-shot only, and --shots 5 has no 0$"):
        table1.main(argv + ["--shots", "5"])


# -----------------------------------------------------------------------------
# docs/evaluation.md's local tasks, as written there

def doc_files():
    """{path: text} of every block in docs/evaluation.md introduced by its file name (`tasks/...`:)."""
    doc = (ROOT / "docs" / "evaluation.md").read_text()
    return dict(re.findall(r"^`(tasks/[\w.]+)`:\n\n```\w*\n(.*?)^```", doc, flags=re.M | re.S))


def test_the_local_tasks_of_the_docs_run_offline_and_score_what_they_say(tmp_path, monkeypatch, offline):
    """The YAML and data blocks of docs/evaluation.md, written to tasks/ and run through lm_eval from the
    folder above (their data paths are relative to it): acc and acc_norm of the multiple-choice task and the
    perplexities of the rolling one equal the direct computation from the same data; 2-shot prompts hold the
    two training examples. A data file that is not there is one line naming it."""
    files = doc_files()
    assert sorted(files) == ["tasks/my_mc.jsonl", "tasks/my_mc.yaml", "tasks/my_mc_train.jsonl",
                             "tasks/my_ppl.jsonl", "tasks/my_ppl.yaml"]
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    model = model_of("t2mlr_llama")
    manager = TaskManager(include_path="tasks", include_defaults=False)
    out = lm_eval.simple_evaluate(model=adapter(model, batch_size=4), tasks=["my_mc", "my_ppl"], task_manager=manager,
                                  num_fewshot=0, bootstrap_iters=0)["results"]
    questions = [json.loads(line) for line in files["tasks/my_mc.jsonl"].splitlines()]
    acc = acc_norm = 0
    for q in questions:
        lls = [direct_loglikelihood(model, f"Question: {q['question']}\nAnswer:", " " + c)[0] for c in q["choices"]]
        acc += max(range(len(lls)), key=lls.__getitem__) == q["label"]
        acc_norm += max(range(len(lls)), key=lambda i: lls[i] / len(q["choices"][i])) == q["label"]
    assert out["my_mc"]["acc,none"] == pytest.approx(acc / len(questions))
    assert out["my_mc"]["acc_norm,none"] == pytest.approx(acc_norm / len(questions))
    docs = [json.loads(line)["text"] for line in files["tasks/my_ppl.jsonl"].splitlines()]
    total = sum(direct_rolling(model, doc) for doc in docs)
    words = sum(len(re.split(r"\s+", doc)) for doc in docs)
    assert out["my_ppl"]["word_perplexity,none"] == pytest.approx(math.exp(-total / words), rel=1e-9)
    assert out["my_ppl"]["byte_perplexity,none"] == pytest.approx(math.exp(-total / sum(map(len, docs))), rel=1e-9)
    two_shot = lm_eval.simple_evaluate(model=adapter(model, batch_size=4), tasks=["my_mc"], task_manager=manager,
                                       num_fewshot=2, bootstrap_iters=0, log_samples=True)
    context = two_shot["samples"]["my_mc"][0]["arguments"][0][0]
    assert "What is two plus two?" in context and "Which animal barks?" in context
    os.remove("tasks/my_ppl.jsonl")
    with pytest.raises(SystemExit, match=r"^error: Unable to find '.*tasks/my_ppl.jsonl'"):
        harness.exit_on_error(lambda: lm_eval.simple_evaluate(
            model=adapter(model), tasks=["my_ppl"], task_manager=TaskManager(include_path="tasks",
                                                                              include_defaults=False)))


# -----------------------------------------------------------------------------
# No network: offline at once

@pytest.fixture
def closed_port():
    """A local TCP port that refuses connections (bound, never listening), as an unreachable hub does."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


@pytest.fixture
def online(monkeypatch):
    """Offline mode unset for this test; whatever offline_when_unreachable switches is undone after it."""
    from huggingface_hub import constants
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    if "datasets" in sys.modules:
        import datasets.config
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    return constants


def test_an_unreachable_hub_switches_to_offline_mode_and_a_reachable_one_does_not(monkeypatch, online, closed_port,
                                                                                 capsys):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        monkeypatch.setattr(online, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert harness.hub_address() == ("127.0.0.1", server.getsockname()[1])
        assert not harness.offline_when_unreachable() and not online.HF_HUB_OFFLINE
        assert "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.setattr(online, "ENDPOINT", f"http://127.0.0.1:{closed_port}")
    start = time.time()
    assert harness.offline_when_unreachable()
    assert time.time() - start < 3
    assert online.HF_HUB_OFFLINE and os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"
    assert capsys.readouterr().err == (f"nanomesh: the Hugging Face hub (127.0.0.1:{closed_port}) is unreachable: "
                                       f"offline, from the local caches only\n")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")     # a proxy in front: that is what to reach
    assert harness.hub_address() == ("proxy.example", 3128)


def test_without_the_network_a_tasks_data_fails_at_once(closed_port):
    """A hub dataset that is not cached, with the hub unreachable (HF_ENDPOINT at a closed port): after
    offline_when_unreachable, datasets fails in well under a second (without it: ~25 s of retries)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") or k == "HF_HOME"}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_ENDPOINT=f"http://127.0.0.1:{closed_port}",
               HF_DATASETS_CACHE=str(Path(os.environ.get("TMPDIR", "/tmp")) / "nanomesh-empty-datasets-cache"))
    code = """
import time
from support.harness import offline_when_unreachable
assert offline_when_unreachable()
import datasets
start = time.time()
try:
    datasets.load_dataset("nanomesh-test/not-cached-anywhere")
except ConnectionError as e:
    print(f"{time.time() - start:.2f}", type(e).__name__)
"""
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    seconds, kind = done.stdout.split()
    assert kind == "ConnectionError" and float(seconds) < 2, done.stderr[-2000:]
    assert "Retrying" not in done.stderr


def test_table1_without_the_network_is_one_line_with_no_retries(tmp_path, closed_port):
    """python -m studies.table1 on a built-in task with the hub unreachable: the offline notice, then one error
    line naming the dataset, and no retry at all."""
    save_run(tmp_path / "run", "vanilla_neox", seed=0, step=1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") or k == "HF_HOME"}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_ENDPOINT=f"http://127.0.0.1:{closed_port}",
               HF_DATASETS_CACHE=str(tmp_path / "datasets-cache"))
    done = subprocess.run([sys.executable, "-m", "studies.table1", str(tmp_path / "run"), "--tasks", "sciq",
                           "--shots", "0", "--device", "cpu", "--out", str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Retrying" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert lines[0] == (f"nanomesh: the Hugging Face hub (127.0.0.1:{closed_port}) is unreachable: offline, from the "
                        f"local caches only")
    assert re.fullmatch(r"error: Couldn't reach '.*sciq.*' on the Hub \(OfflineModeIsEnabled\) \(a task's data needs "
                        r"the network the first time; see docs/evaluation.md\)", lines[-1]), lines[-1]
