"""
studies/table1.py: the MeSH Table 1 suite on two checkpoints (local tasks), JSON and markdown side by side,
resumed. Needs lm_eval (pip install -r requirements-eval.txt); skipped without it.
"""
import json

import pytest

pytest.importorskip("lm_eval", reason="the Table 1 test needs lm_eval: pip install -r requirements-eval.txt")
import lm_eval                                          # noqa: E402
from lm_eval.tasks import TaskManager                   # noqa: E402

from support.harness import NanoLM                      # noqa: E402
from test_harness import local_tasks_only, offline, write_checkpoint, write_tasks  # noqa: E402,F401 (fixtures)


def test_table1_suite_writes_json_and_markdown_side_by_side_and_resumes(tmp_path, monkeypatch, capsys,
                                                                       local_tasks_only):
    """python -m studies.table1 on two checkpoints, with the suite's tasks swapped for local ones (so it runs
    offline): four runs stored, the T²MLR model's 0-shot scores are lm_eval's own, the markdown has the tasks
    as columns with the average last and a perplexity table; a rerun skips what is stored, one with another
    --limit keeps the old file and starts anew."""
    from studies import table1
    for name in ("vanilla_neox", "t2mlr_llama"):
        write_checkpoint(tmp_path / name, name)
    tasks = write_tasks(tmp_path / "tasks")
    (tasks / "tiny_mc2.yaml").write_text((tasks / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: tiny_mc2"))
    monkeypatch.setattr(table1, "TASKS", {"tiny_mc": ("MC", "acc"), "tiny_mc2": ("MC2", "acc_norm")})
    monkeypatch.setattr(table1, "PERPLEXITIES", {"tiny_roll": ("Roll (word)", "word_perplexity")})
    argv = [str(tmp_path / "vanilla_neox"), str(tmp_path / "t2mlr_llama"), "--out", str(tmp_path / "out"),
            "--shots", "0,2", "--include_path", str(tasks), "--device", "cpu", "--batch_size", "4"]
    table1.main(argv)
    stored = json.loads((tmp_path / "out" / "table1.json").read_text())
    assert sorted(stored["runs"]) == sorted(f"{tmp_path / m} | {k}-shot" for m in ("vanilla_neox", "t2mlr_llama")
                                            for k in (0, 2))
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    lm = NanoLM(checkpoint=str(tmp_path / "t2mlr_llama"), device="cpu", batch_size=4)
    want = lm_eval.simple_evaluate(model=lm, tasks=["tiny_mc", "tiny_mc2", "tiny_roll"], task_manager=manager,
                                   num_fewshot=0, bootstrap_iters=0)["results"]
    run = stored["runs"][f"{tmp_path / 't2mlr_llama'} | 0-shot"]
    assert run["acc"]["tiny_mc"][0] == want["tiny_mc"]["acc,none"]
    assert run["acc"]["tiny_mc2"][0] == want["tiny_mc2"]["acc_norm,none"]
    assert run["ppl"]["tiny_roll"][0] == pytest.approx(want["tiny_roll"]["word_perplexity,none"], rel=1e-12)
    assert stored["runs"][f"{tmp_path / 't2mlr_llama'} | 2-shot"]["ppl"] == {}    # perplexities: 0-shot only
    lines = (tmp_path / "out" / "table1.md").read_text().splitlines()
    header = lines.index("**0-shot** (%)") + 2
    assert lines[header] == "| model | MC (acc) | MC2 (acc_norm) | Avg. |"
    cells = lines[header + 3].strip("|").split("|")                # the second model's row
    mc, mc2, avg = (float(c) for c in cells[1:])
    assert (mc, mc2) == (round(100 * want["tiny_mc"]["acc,none"], 2), round(100 * want["tiny_mc2"]["acc_norm,none"], 2))
    assert avg == pytest.approx((mc + mc2) / 2, abs=0.006)
    assert "| model | Roll (word) |" in lines and "**2-shot** (%)" in lines
    capsys.readouterr()
    table1.main(argv)                                                # everything stored: nothing rerun
    assert capsys.readouterr().err.count("stored, skipped") == 4
    before = (tmp_path / "out" / "table1.json").read_text()
    with pytest.raises(ValueError, match="mode 'fast'"):                 # a bad option moves nothing
        table1.main(argv + ["--mode", "fast"])
    assert (tmp_path / "out" / "table1.json").read_text() == before
    table1.main(argv[:1] + argv[2:] + ["--limit", "2", "--shots", "0", "--tasks", "tiny_mc,tiny_roll"])
    assert "starting anew" in capsys.readouterr().err
    assert (tmp_path / "out" / "table1.json.old").read_text() == before
    stored = json.loads(before)
    del stored["runs"][f"{tmp_path / 't2mlr_llama'} | 2-shot"]           # a run not done yet: dashes
    assert "| " + str(tmp_path / "t2mlr_llama") + " | – | – | – |" in table1.markdown(stored).splitlines()
    assert list(json.loads((tmp_path / "out" / "table1.json").read_text())["runs"]) == \
        [f"{tmp_path / 'vanilla_neox'} | 0-shot"]
