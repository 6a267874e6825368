"""
Tests of studies/word_problem.py: the groups (sizes, A5 = the even permutations, the identity, inverse and
associative laws of the multiplication table), every running product against an independent composition of
the permutations as functions, the batches (the same for every arm, reproducible by step), the parameter
matching of the three arms, the t interval, exact T²MLR training against Jacobi D >= T (same loss and
gradients), a run stopped and resumed against an uninterrupted one (under the cosine and the annealed
schedule), the annealed schedule (the peak held until the curriculum is complete, then a cosine, and the
run's end), and the --quick study end to end (figures, JSON, and a relaunch that retrains nothing).

Run: python -m pytest -q studies/tests/test_word_problem.py
"""

import itertools
import json
import math
import re
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from scipy import stats

from model import GPT, GPTConfig
from studies import word_problem as wp

ROOT = Path(__file__).resolve().parents[2]


def cycle_parity(p):
    """Parity from the cycle decomposition, (points - cycles) mod 2: independent of the inversion count."""
    seen, cycles = set(), 0
    for i in range(len(p)):
        if i not in seen:
            cycles += 1
            while i not in seen:
                seen.add(i)
                i = p[i]
    return (len(p) - cycles) % 2


def product_as_functions(word):
    """s = a_1 · … · a_t as the function i -> a_1(a_2(… a_t(i))): each point pushed through the word from the
    right. Independent of wp.compose and the multiplication table."""
    k = len(word[0])
    out = []
    for i in range(k):
        v = i
        for a in reversed(word):
            v = a[v]
        out.append(v)
    return tuple(out)


def test_group_sizes_and_a5_is_the_even_permutations():
    assert {g: len(wp.group_elements(g)) for g in wp.GROUPS} == {"Z2": 2, "S3": 6, "A5": 60, "S5": 120}
    s5 = set(itertools.permutations(range(5)))
    assert set(wp.group_elements("S5")) == s5
    assert set(wp.group_elements("A5")) == {p for p in s5 if cycle_parity(p) == 0}
    assert set(wp.group_elements("S3")) == set(itertools.permutations(range(3)))
    for g in wp.GROUPS:                                        # identity first: token id 0
        assert wp.group_elements(g)[0] == tuple(range(wp.GROUP_DEGREE[g]))


@pytest.mark.parametrize("group", wp.GROUPS)
def test_multiplication_table_is_a_group(group):
    table = wp.multiplication_table(group)
    n = len(wp.group_elements(group))
    ids = torch.arange(n)
    assert torch.equal(table[0], ids) and torch.equal(table[:, 0], ids)          # identity law
    for g in range(n):                                                            # inverse law
        right = (table[g] == 0).nonzero().flatten()
        assert len(right) == 1 and table[right[0], g] == 0
    assert all(sorted(row.tolist()) == list(range(n)) for row in table)           # a Latin square
    rng = random.Random(0)
    for _ in range(2000):                                                         # associativity
        a, b, c = (rng.randrange(n) for _ in range(3))
        assert table[table[a, b], c] == table[a, table[b, c]]


@pytest.mark.parametrize("group", wp.GROUPS)
def test_every_running_product_against_composition_of_permutations(group):
    elements = wp.group_elements(group)
    words, states = wp.make_batch(wp.multiplication_table(group), 24, 40, seed=3)
    for w, s in zip(words.tolist(), states.tolist()):
        perms = [elements[i] for i in w]
        for t in range(1, len(w) + 1):
            assert elements[s[t - 1]] == product_as_functions(perms[:t])


def test_z2_is_parity_and_the_convention_is_right_factor_first():
    words, states = wp.make_batch(wp.multiplication_table("Z2"), 16, 30, seed=1)
    assert torch.equal(states, words.cumsum(1) % 2)
    # (p · q)(i) = p(q(i)): in S3, p = (0 1) transposition, q = the 3-cycle 0 -> 1 -> 2 -> 0
    p, q = (1, 0, 2), (1, 2, 0)
    assert wp.compose(p, q) == (0, 2, 1) and wp.compose(q, p) == (2, 1, 0)


def test_a_repeated_prefix_is_seen_only_behind_the_identity():
    """Causal attention without positions gives "a" and "a a" the same last vector in every layer (so s_2 =
    a·a is out of reach); behind the identity start they differ. The start adds a position whose target is
    ignored (-1) and leaves the running products as they were."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**wp.gpt_config(wp.QUICK, "S3"))).eval()
    a, aa = torch.tensor([[3]]), torch.tensor([[3, 3]])
    last = lambda idx: model(idx)[0][0, -1]
    assert torch.allclose(last(a), last(aa), atol=1e-6)                       # blind without the start
    (a1, _), (aa1, _) = wp.with_identity_start(a, a), wp.with_identity_start(aa, aa)
    assert (last(a1) - last(aa1)).abs().max() > 1e-3                           # seen behind it
    words, states = wp.make_batch(wp.multiplication_table("S3"), 8, 5, seed=2)
    x, y = wp.with_identity_start(words, states)
    assert x.shape == (8, 6) and (x[:, 0] == 0).all() and (y[:, 0] == -1).all()
    assert torch.equal(x[:, 1:], words) and torch.equal(y[:, 1:], states)
    assert torch.equal(wp.running_products(x, wp.multiplication_table("S3"))[:, 1:], states)   # e changes no product


def test_batches_are_seeded_by_group_seed_and_step_alone():
    table = wp.multiplication_table("S3")
    a = wp.make_batch(table, 8, 16, wp.batch_seed("S3", 0, 5))
    b = wp.make_batch(table, 8, 16, wp.batch_seed("S3", 0, 5))
    c = wp.make_batch(table, 8, 16, wp.batch_seed("S3", 0, 6))
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and not torch.equal(a[0], c[0])
    assert len({wp.batch_seed(g, s, t) for g in wp.GROUPS for s in range(3) for t in range(100)}) == 1200


@pytest.mark.parametrize("size", ["FULL", "GPU"])
@pytest.mark.parametrize("group", wp.GROUPS)
def test_arms_are_parameter_matched_within_5_percent(group, size):
    arms = wp.matched_arms(getattr(wp, size), group)
    counts = {arm: wp.count_params(wp.build(spec)) for arm, spec in arms.items()}
    target = counts["t2mlr"]
    assert all(abs(c - target) / target < 0.05 for c in counts.values()), counts
    assert arms["t2mlr"]["config"]["rope_pct"] == 0.0 and arms["transformer"]["config"]["rope_pct"] == 0.0


def test_t_interval_is_the_student_t_interval():
    mean, lo, hi = wp.t_interval([0.5, 0.6, 0.7])
    half = stats.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)
    assert math.isclose(mean, 0.6) and math.isclose(lo, 0.6 - half) and math.isclose(hi, 0.6 + half)
    assert wp.t_interval([0.3]) == (0.3, 0.3, 0.3)


def test_exact_training_equals_jacobi_with_d_at_least_t():
    """The T²MLR arm trains with mode="exact"; Jacobi with D = T sweeps and gradient through all of them
    (b = D - 1) computes the same loss and gradients, so the cheaper one may train (the JSON's timing)."""
    size = dict(wp.QUICK, n_embd=32, mlp_hidden=64)
    fields = wp.gpt_config(size, "S3", **wp.t2mlr_fields("mesh")) | {"jacobi_sweeps": 8, "jacobi_grad_sweeps": 7}
    torch.manual_seed(0)
    model = GPT(GPTConfig(**fields)).double().train()
    with torch.no_grad():                        # open the gate, so that the state matters
        model.gate.theta_r.fill_(0.8)
        model.gate.theta_x.fill_(0.3)
    x, y = wp.make_batch(wp.multiplication_table("S3"), 4, 8, seed=0)
    grads = {}
    for mode in ("exact", "jacobi"):
        model.zero_grad()
        loss = wp.step_loss(model, x, y, mode)
        loss.backward()
        grads[mode] = (loss.item(), [p.grad.clone() for p in model.parameters()])
    assert math.isclose(grads["exact"][0], grads["jacobi"][0], rel_tol=1e-10)
    for a, b in zip(grads["exact"][1], grads["jacobi"][1]):
        assert torch.allclose(a, b, atol=1e-10, rtol=1e-8)
    # with fewer sweeps than positions the Jacobi loss is not the exact one
    model.cfg.jacobi_sweeps, model.cfg.jacobi_grad_sweeps = 3, 2
    assert not math.isclose(wp.step_loss(model, x, y, "jacobi").item(), grads["exact"][0], rel_tol=1e-6)


@pytest.mark.parametrize("steps, anneal", [(6, None), (40, 5)])
def test_a_stopped_run_resumes_to_the_uninterrupted_result(tmp_path, steps, anneal):
    size = dict(wp.QUICK, eval_interval=3)
    spec = wp.spec_of(size, "main", "S3", "t2mlr", 0, wp.matched_arms(size, "S3")["t2mlr"], 1e-3, "exact",
                      steps=steps, anneal=anneal)
    whole = wp.run_one(spec, wp.study_paths(str(tmp_path / "whole")), log=lambda *_: None)

    def stop_at_6(message):
        if "step 6/" in message:
            raise KeyboardInterrupt
    paths = wp.study_paths(str(tmp_path / "stopped"))
    with pytest.raises(KeyboardInterrupt):
        wp.run_one(spec, paths, log=stop_at_6)
    assert not os.path.exists(os.path.join(paths["runs"], spec["name"] + ".json"))
    lines = []
    resumed = wp.run_one(spec, paths, log=lines.append)
    assert f"steps 3..{steps}" in lines[0]
    steps_logged = [m for m in lines if m.lstrip().startswith("step ")]
    assert steps_logged and all(re.search(r"ETA \d+\.\d min$", m) for m in steps_logged)   # progress, with its ETA
    assert resumed["acc_by_position"] == whole["acc_by_position"] and resumed["steps"] == whole["steps"]
    assert math.isclose(resumed["final_loss"], whole["final_loss"], rel_tol=1e-6)
    assert wp.run_one(spec, paths, log=lambda m: pytest.fail(m))["params"] == whole["params"]   # finished: skipped
    other = dict(spec, train=dict(spec["train"], learning_rate=2e-3))
    with pytest.raises(wp.RunError):
        wp.run_one(other | {"name": spec["name"]}, paths)


def test_unknown_arguments_are_refused():
    for argv in (["--steps=3"], ["--quick", "--gpu"]):
        with pytest.raises(wp.RunError):
            wp.main(argv)


def test_quick_study_runs_end_to_end_and_a_relaunch_trains_nothing(tmp_path):
    cmd = [sys.executable, "-m", "studies.word_problem", "--quick", f"--root={tmp_path}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    doc = json.loads((tmp_path / "word_problem.json").read_text())
    assert doc["command"] == f"OMP_NUM_THREADS=1 python -m studies.word_problem --quick --root={tmp_path}"
    assert doc["timing"]["chosen_train_mode"] in ("exact", "jacobi")
    assert set(doc["timing"]["seconds_per_step"]) == {"exact", "jacobi_D16_b15", "jacobi_D16_b4"}
    assert set(doc["levers"]) == set(wp.QUICK["levers"])                 # the levers named, one run each
    assert doc["finished_runs"]["levers_expected"] == 5 and len(wp.lever_specs(wp.FULL)) == len(wp.LEVERS)
    annealed = doc["results_annealed"]["S5"]                    # the anneal lever, its decay cut at the end
    assert set(annealed) == {"t2mlr"} and annealed["t2mlr"]["seeds"] == [0]
    assert doc["levers"]["S5_t2mlr_s0_anneal4000"]["steps"] == 8 * wp.QUICK["steps"]
    for arm in wp.ARMS:
        r = doc["results"]["S3"][arm]
        assert len(r["mean"]) == 64 and len(r["seeds"]) == 2
        assert all(lo <= m + 1e-12 and m <= hi + 1e-12 for lo, m, hi in zip(r["lo"], r["mean"], r["hi"]))
    longer = doc["results_four_times_the_steps"]["S3"]                   # every arm at 4x the steps
    assert set(longer) == set(wp.ARMS) and all(r["seeds"] == [0] for r in longer.values())
    run = json.loads((tmp_path / "runs" / "longer_S3_t2mlr_s0.json").read_text())
    steps = wp.LONGER * wp.QUICK["steps"]
    assert run["steps"] == steps and len(run["curve"]) == steps // wp.QUICK["eval_interval"]
    assert all(0 <= row["acc_beyond"] <= 1 for row in run["curve"])   # the probe past the training length
    assert all(0 <= row["acc_at_length"] <= row["sign_at_length"] <= 1 for row in run["curve"])   # S3: signs
    assert longer["t2mlr"]["curves"] == [run["curve"]]                  # the curves figure's rows
    assert set(doc["depth"]["S3"]) == set(wp.DEPTH_ORDER)
    assert all(len(r["mean"]) == 16 for r in doc["depth"]["S3"].values())
    assert set(doc["depth_summary"]["S3"]["mesh_minus_base"]) == {f"K{K}" for K in wp.LOOPS}
    for name in ("word_problem_groups.png", "word_problem_schedules.png", "word_problem_depth_vs_time.png",
                 "word_problem_curves.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")}
    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert "parameters, steps" not in second.stdout                     # nothing trained again
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*.json")} == stamps


def test_the_curriculum_extends_the_length_once_the_loss_mean_falls_below_the_threshold():
    cur, full = {"start": 2, "threshold": 0.3}, 5
    state = {"steps_done": 0}
    assert wp.curriculum_length(state, cur, full) == 2
    for i, loss in enumerate([1.0, 0.2, 0.2, 0.2, 0.2]):           # the mean: 1.0, 0.92, 0.848, ...
        state["steps_done"] = i + 1
        wp.advance_curriculum(state, cur, full, loss)
    assert wp.curriculum_length(state, cur, full) == 2          # 0.8*0.9^4 + 0.2 > 0.3: not yet
    losses = [0.2] * 30
    for i, loss in enumerate(losses):
        state["steps_done"] = 6 + i
        wp.advance_curriculum(state, cur, full, loss)
    assert wp.curriculum_length(state, cur, full) == 5          # every length reached, then it stays
    assert list(state["lengths"]) == ["3", "4", "5"]
    assert state["lengths"]["4"] == state["lengths"]["3"] + 1        # 0.2 < 0.3: one step per new length
    assert wp.curriculum_length({}, None, 16) == 16


def test_the_sign_accuracy_is_right_for_a_coset_mate_and_wrong_across_cosets():
    assert [int(wp.odd_elements(g).sum()) for g in ("Z2", "S3", "A5", "S5")] == [1, 3, 0, 60]
    table, odd = wp.multiplication_table("S5"), wp.odd_elements("S5")
    words, states = wp.make_batch(table, 64, 5, seed=3)
    even, swap = wp.group_elements("S5").index((1, 2, 0, 3, 4)), wp.group_elements("S5").index((1, 0, 2, 3, 4))
    wrong_even, wrong_odd = table[states, even], table[states, swap]      # s·(a 3-cycle), s·(a transposition)
    assert not (wrong_even == states).any() and not (wrong_odd == states).any()
    assert wp.sign_accuracy(wrong_even, states, odd) == 1.0 and wp.sign_accuracy(wrong_odd, states, odd) == 0.0
    half = torch.where(torch.arange(64)[:, None] < 16, wrong_odd, states)  # a quarter with the wrong sign
    assert wp.sign_accuracy(half, states, odd) == 0.75


def test_the_frontier_is_the_last_position_at_or_above_the_level():
    assert wp.frontier([1.0, 0.95, 0.9, 0.5, 0.99]) == 3
    assert wp.frontier([0.5, 1.0]) == 0 and wp.frontier([1.0, 1.0]) == 2


def test_one_run_from_the_command_line_writes_its_result(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "studies.word_problem", "--quick", "--group", "S3", "--arm", "lstm", "--seed",
           "5", "--out", str(out)]
    first = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    r = json.loads((out / "result.json").read_text())
    assert len(r["acc_by_position"]) == 64 and all(0 <= a <= 1 for a in r["acc_by_position"])
    assert r["steps"] == wp.QUICK["steps"] and r["train_seconds"] > 0 and r["spec"]["seed"] == 5
    assert r["recipe"]["curriculum"] == wp.QUICK["curriculum"] and r["recipe"]["train"]["batch_size"] == 8
    assert r["recipe"]["anneal"] is None and "anneal_start" not in r
    bad = subprocess.run([*cmd[:-2]], cwd=ROOT, capture_output=True, text=True, timeout=60)  # no --out
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0 and "--out" in bad.stderr
    zero = subprocess.run([*cmd, "--anneal", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert zero.returncode != 0 and zero.stderr.strip() == "error: --anneal 0: give a number of steps >= 1"


def test_one_run_takes_its_steps_and_the_annealed_schedule_from_the_command_line(tmp_path):
    """--steps 40 --anneal 5: the recipe's run with 40 steps, its decay begun once the curriculum is
    complete (QUICK's threshold 3.0 widens it within a few steps) and the run ended 5 steps later."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "studies.word_problem", "--quick", "--group", "S3", "--arm", "lstm", "--out",
           str(out), "--steps", "40", "--anneal", "5"]
    done = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    r = json.loads((out / "result.json").read_text())
    assert r["recipe"]["train"]["max_iters"] == 40 and r["recipe"]["anneal"] == {"steps": 5}
    assert r["anneal_start"] == r["curriculum_lengths"]["16"] < 35 and r["steps"] == r["anneal_start"] + 5


def test_a_stage_with_a_group_trains_that_groups_runs_alone(tmp_path, monkeypatch):
    paths = wp.study_paths(str(tmp_path))
    os.makedirs(paths["runs"])
    timing = {"seconds_per_step": {"exact": 1.0, "jacobi_D16_b15": 2.0, "jacobi_D16_b4": 1.5},
              "chosen_train_mode": "exact"}
    (tmp_path / "runs" / "timing.json").write_text(json.dumps(timing))            # no step timed here
    trained = []
    monkeypatch.setattr(wp, "run_locked", lambda spec, *_: trained.append(spec["name"]))
    monkeypatch.setattr(wp, "report", lambda *_: ({}, []))                        # no figures drawn
    wp.run_study(wp.FULL, paths, "cmd", stages=("depth",), log=lambda _: None, group="A5")
    assert trained == [s["name"] for s in wp.depth_specs(wp.FULL) if s["group"] == "A5"] and len(trained) == 54
    trained.clear()
    wp.run_study(wp.FULL, paths, "cmd", stages=("longer", "depth"), log=lambda _: None, group="S5")
    assert trained == [s["name"] for s in wp.longer_specs(wp.FULL, "exact")]        # S5 has no depth runs
    assert wp.parse_args(["--stage", "depth", "--group", "A5"]).group == "A5"   # not a one-run command


def test_the_seed_levers_change_the_longer_runs_spec_in_the_named_field_alone():
    levers = {wp.lever_name(s): s for s in wp.lever_specs(wp.FULL)}
    longer = {s["seed"]: s for s in wp.longer_specs(wp.FULL, "exact") if s["arm"] == "t2mlr"}
    plain = lambda s: {k: v for k, v in s.items() if k not in ("name", "stage")}
    changed = {"S5_t2mlr_s2_bptt": ("recurrent_detach", False),
               "S5_t2mlr_s2_plain_state": ("recurrent_residual", False)}
    base = longer[2]
    for name, (field, value) in changed.items():
        spec = levers[name]
        assert spec["name"] == f"lever_S5_t2mlr_{name}_s2" and spec["model"]["config"][field] is value
        assert base["model"]["config"][field] is not value
        config = base["model"]["config"] | {field: value}
        assert plain(spec) == plain(base | {"model": dict(base["model"], config=config)})
    lr = levers["S5_t2mlr_s2_lr1e-3"]
    assert lr["train"]["learning_rate"] == 1e-3 and lr["train"]["min_lr"] == 1e-5 and lr["seed"] == 2
    assert lr["model"] == longer[2]["model"] and lr["train"]["max_iters"] == longer[2]["train"]["max_iters"]
    assert levers["recipe"]["seed"] == wp.FULL["lever_seed"]                    # the others: the lever seed


def test_the_eight_times_levers_are_the_longer_runs_with_twice_the_steps_for_both_arms():
    levers = {wp.lever_name(s): s for s in wp.lever_specs(wp.FULL)}
    longer = {(s["arm"], s["seed"]): s for s in wp.longer_specs(wp.FULL, "exact")}
    but_train = lambda s: {k: v for k, v in s.items() if k not in ("name", "stage", "train")}
    for arm in ("t2mlr", "transformer"):
        for seed in wp.FULL["seeds"]:
            spec, base = levers[f"S5_{arm}_s{seed}_steps16000"], longer[(arm, seed)]
            assert spec["train"]["max_iters"] == 2 * base["train"]["max_iters"] == 16000
            assert spec["train"] == base["train"] | {"max_iters": 16000, "warmup_iters": 800}
            assert but_train(spec) == but_train(base) and spec["seed"] == seed


def test_the_eight_times_result_takes_the_s5_levers_at_8x_on_the_test_seeds_alone():
    specs = {wp.lever_name(s): s for s in wp.lever_specs(wp.FULL)}
    run = lambda name, steps: {"spec": specs[name], "steps": steps}
    at8 = [run(f"S5_{arm}_s{seed}_steps16000", 16000) for arm in ("t2mlr", "transformer") for seed in (0, 1, 2)]
    others = [run("S5_t2mlr_steps8000", 8000), run("S5_t2mlr_s2_bptt", 8000), run("S5_steps8000", 8000),
              run("S5_transformer_steps8000", 8000)]
    chosen = wp.longest_runs(wp.FULL, others + at8)
    assert chosen == at8
    outside = dict(specs["S5_t2mlr_s0_steps16000"], seed=100)                    # a lever seed at 8x: not counted
    assert wp.longest_runs(wp.FULL, [{"spec": outside, "steps": 16000}]) == []
    fake = lambda r, acc: dict(r, params=1, train_seconds=1.0, final_loss=0.0, acc_by_position=[acc] * 64)
    agg = wp.aggregate([fake(r, 1.0 if r["spec"]["arm"] == "t2mlr" else 0.5) for r in chosen], wp.ARMS, 16)
    assert sorted(agg) == ["t2mlr", "transformer"] and agg["transformer"]["seeds"] == [0, 1, 2]
    assert agg["t2mlr"]["frontier"] == [64] * 3 and agg["transformer"]["frontier"] == [0] * 3


def test_a_report_of_the_committed_study_writes_outside_the_tracked_files():
    committed, report = wp.study_paths(), wp.study_paths(report_only=True)
    assert report["runs"] == committed["runs"]                         # it reads the committed runs...
    assert report["json"].startswith("out/") and report["assets"].startswith("out/")   # ...and writes in out/
    assert wp.study_paths("r", report_only=True)["json"] == os.path.join("r", "word_problem.json")


def test_a_truncated_run_json_is_one_line_naming_the_file(tmp_path):
    size = dict(wp.QUICK)
    spec = wp.spec_of(size, "main", "S3", "lstm", 0, wp.matched_arms(size, "S3")["lstm"], None, None)
    paths = wp.study_paths(str(tmp_path))
    os.makedirs(paths["runs"])
    path = os.path.join(paths["runs"], spec["name"] + ".json")
    with open(path, "w") as f:
        f.write('{"spec": {"name": ')                                     # a write that did not finish
    with pytest.raises(wp.RunError, match=r"main_S3_lstm_s0.json is not valid JSON .*delete it to rerun"):
        wp.run_one(spec, paths)


def test_the_annealed_lr_holds_the_peak_then_decays_by_cosine_to_min_lr():
    cfg = wp.TrainConfig(**wp.train_spec(3e-3, 0, 1000, 8, 100))                 # warmup 50 steps
    lr = lambda step, start: wp.annealed_lr(step, cfg, start, 200)
    assert [lr(s, None) for s in range(50)] == [wp.get_lr(s, cfg) for s in range(50)]    # train.py's warmup
    assert lr(50, None) == lr(900, None) == lr(299, 300) == 3e-3                  # the peak, held
    assert lr(300, 300) == 3e-3 and math.isclose(lr(499, 300), 3e-5) and lr(700, 300) == 3e-5
    assert math.isclose(lr(400, 300), 3e-5 + 0.5 * (1 + math.cos(math.pi * 100 / 199)) * (3e-3 - 3e-5))
    assert lr(400, 300) < lr(350, 300) < 3e-3


@pytest.mark.parametrize("steps, anneal", [(40, 5), (10, 4)])
def test_an_annealed_run_decays_once_the_curriculum_is_complete_and_ends_there(tmp_path, steps, anneal):
    size = dict(wp.QUICK, eval_interval=3)        # the quick curriculum: one more position every step
    spec = wp.spec_of(size, "lever", "S3", "lstm", 0, wp.matched_arms(size, "S3")["lstm"], None, None,
                      steps=steps, anneal=anneal)
    rates = []
    real = wp.optimizer_step
    def recording(t, step, accum, loss, lr=None):
        rates.append((step, lr))
        return real(t, step, accum, loss, lr=lr)
    wp.optimizer_step = recording
    try:
        r = wp.run_one(spec, wp.study_paths(str(tmp_path)), log=lambda _: None)
    finally:
        wp.optimizer_step = real
    complete = r["curriculum_lengths"].get("16")
    # 40 steps: the curriculum completes at step 14 and the decay begins there; 10 steps: it never does,
    # and the decay takes the last 4 steps
    assert r["anneal_start"] == (complete if steps == 40 else steps - anneal)
    assert (complete is None) == (steps == 10)
    assert r["steps"] == r["anneal_start"] + anneal == len(rates) and r["curve"][-1]["step"] == r["steps"]
    cfg = wp.TrainConfig(**spec["train"])
    assert [lr for _, lr in rates] == [wp.annealed_lr(s, cfg, r["anneal_start"], anneal) for s, _ in rates]
    assert rates[-1][1] == cfg.min_lr and rates[r["anneal_start"] - 1][1] == cfg.learning_rate


def test_the_anneal_levers_are_the_longer_runs_at_eight_times_with_the_anneal_alone():
    levers = {wp.lever_name(s): s for s in wp.lever_specs(wp.FULL)}
    longer = {(s["arm"], s["seed"]): s for s in wp.longer_specs(wp.FULL, "exact")}
    rest = lambda s: {k: v for k, v in s.items() if k not in ("name", "stage", "train", "anneal")}
    for arm in wp.ARMS:
        for seed in wp.FULL["seeds"]:
            spec, base = levers[f"S5_{arm}_s{seed}_anneal{wp.ANNEAL}"], longer[(arm, seed)]
            assert spec["anneal"] == {"steps": 4000} and "anneal" not in base
            assert spec["train"] == base["train"] | {"max_iters": 16000, "warmup_iters": 800}
            assert rest(spec) == rest(base) and spec["seed"] == seed
            # the one-run command line with --steps 16000 --anneal 4000 trains the same run
            one = wp.arm_spec(wp.FULL, "S5", arm, seed, "exact", stage="run", steps=16000, anneal=4000)
            assert {k: v for k, v in one.items() if k not in ("name", "stage")} == \
                {k: v for k, v in spec.items() if k not in ("name", "stage")}
    runs = [{"spec": levers[f"S5_t2mlr_s{seed}_anneal{wp.ANNEAL}"], "steps": 16000} for seed in (0, 1, 2)]
    plain = [{"spec": levers[f"S5_t2mlr_s{seed}_steps16000"], "steps": 16000} for seed in (0, 1, 2)]
    assert wp.longest_runs(wp.FULL, runs + plain) == plain       # an anneal run that ran 16,000: not 8x
    assert wp.annealed_runs(wp.FULL, runs + plain) == runs


def test_the_gpu_config_anneals_every_run_and_the_cpu_recipe_none():
    stages = lambda size: (wp.main_specs(size, "exact") + wp.longer_specs(size, "exact") + wp.depth_specs(size)
                           + wp.long_specs(size))
    assert all(s["anneal"] == {"steps": 2500} for s in stages(wp.GPU))
    assert not any("anneal" in s for s in stages(wp.FULL))
    assert wp.GPU["steps"] - 2500 > 0 and all(s["train"]["max_iters"] >= 10000 for s in stages(wp.GPU))
