"""studies/jacobi_training.py: what each arm's spec changes, and a toy run's JSON and report."""

import os

from studies import jacobi_training as jt
from studies import word_problem as wp


def test_spec_sets_the_mode_D_b_and_lengths():
    ex, ja = jt.spec("exact", 32, 0), jt.spec("jacobi_D16_b4", 32, 0)
    assert (ex["train_mode"], ja["train_mode"]) == ("exact", "jacobi")
    assert (ex["train_n"], ex["test_n"]) == (32, 128)
    cfg = ja["model"]["config"]
    assert (cfg["jacobi_sweeps"], cfg["jacobi_grad_sweeps"], cfg["block_size"]) == (16, 4, 128)
    assert jt.spec("jacobi_D16_b15", 32, 1)["model"]["config"]["jacobi_grad_sweeps"] == 15
    # everything else is the same model and recipe
    assert {k: v for k, v in ja["model"]["config"].items() if not k.startswith("jacobi")} == \
        {k: v for k, v in ex["model"]["config"].items() if not k.startswith("jacobi")}
    assert ja["train"] == ex["train"] and ja["curriculum"] == ex["curriculum"]
    assert jt.spec("exact", 16, 0)["test_n"] == 64
    # the recipe: D follows the length, one short of it; b as the paper's
    lag = jt.spec("jacobi_lag1_b4", 32, 0)["model"]["config"]
    assert (lag["jacobi_lag"], lag["jacobi_grad_sweeps"]) == (1, 4)
    assert jt.spec("jacobi_lag1_b15", 32, 0)["model"]["config"]["jacobi_grad_sweeps"] == 15


def test_every_committed_run_is_its_plan_entry_under_todays_names():
    """A run stored before a rename (jacobi_init 'plain', now 'ungated') is still the run its plan entry
    makes, so --worker counts it as finished instead of refusing it."""
    found = 0
    for arm, n, seed in jt.PLAN:
        spec = jt.spec(arm, n, seed)
        path = wp.run_json({"runs": jt.OUT}, spec)
        if os.path.exists(path):
            stored = wp.read_json(path)["spec"]
            assert wp.upgrade_spec(stored) == spec, path
            found += 1
    assert found == len(jt.PLAN)
    stored = wp.read_json(wp.run_json({"runs": jt.OUT}, jt.spec("jacobi_D16_b4_plain", 32, 0)))["spec"]
    assert stored["model"]["config"]["jacobi_init"] == "plain" != jt.spec("jacobi_D16_b4_plain", 32, 0)[
        "model"]["config"]["jacobi_init"]


def test_a_toy_run_records_its_setting_and_reports(tmp_path):
    size = dict(wp.QUICK, steps=4, eval_interval=2)
    out, ckpt = str(tmp_path / "runs"), str(tmp_path / "ckpt")
    for arm in ("exact", "jacobi_D16_b4", "jacobi_lag1_b4"):
        r = jt.run(arm, 4, 0, out, ckpt, size, log=lambda *a: None)
        assert (r["arm"], r["train_n"], r["mode"]) == (arm, 4, jt.ARMS[arm][0])
        assert len(r["acc_by_position"]) == 16 and r["commit"]
    again = jt.run("jacobi_D16_b4", 4, 0, out, ckpt, size, log=lambda *a: None)
    assert again["D"] == 16 and again["b"] == 4
    rows = jt.report(out, figure=str(tmp_path / "figure.png"))
    assert [(r["arm"], r["train_n"], r["D"]) for r in rows] == [("exact", 4, None), ("jacobi_D16_b4", 4, 16),
                                                                ("jacobi_lag1_b4", 4, "T - 1")]
    assert rows[1]["beyond_minus_exact"]["n"] == 1 and os.path.exists(os.path.join(out, "report.md"))
    assert os.path.exists(tmp_path / "figure.png")


def test_cost_times_each_arm_and_counts_the_bytes_its_sweeps_hold(tmp_path):
    rows = jt.cost(lengths=(8,), rounds=1, steps=1, size=dict(wp.QUICK), out=str(tmp_path), log=lambda *a: None)
    by = {r["arm"]: r for r in rows}
    assert set(by) == {"exact", "jacobi_D16_b4", "jacobi_lag1_b4", "jacobi_D32_b4", "jacobi_D16_b15"}
    assert by["exact"]["time_vs_exact"] == 1 and by["jacobi_D16_b4"]["held_vs_D16"] == 1
    # every gradient sweep holds its activations: b = 15 (7 at T = 8) holds more than b = 4
    assert by["jacobi_D16_b15"]["held_bytes"] > 1.2 * by["jacobi_D16_b4"]["held_bytes"]
    assert os.path.exists(os.path.join(tmp_path, "cost.json"))


def test_converged_forward_counts_its_sweeps_and_is_exact_without_a_tolerance(tmp_path):
    size = dict(wp.QUICK, steps=4, eval_interval=2)
    out, ckpt = str(tmp_path / "runs"), str(tmp_path / "ckpt")
    jt.run("exact", 6, 0, out, ckpt, size, log=lambda *a: None)
    rows = jt.converged_sweeps(n=6, seeds=(0,), tols=(1e-12, 0.5), examples=16, ckpt=ckpt, out=out, size=size,
                                log=lambda *a: None)
    tol = rows[0]["tol"]
    # at a negligible tolerance every one of the n sweeps runs and the forward is the exact one
    assert tol["1e-12"]["sweeps"] == 6 and tol["1e-12"]["agrees_with_exact"] == 1.0
    assert tol["1e-12"]["acc"] == rows[0]["exact_acc"]
    # a loose one runs at most the n sweeps that make the forward exact
    assert 2 <= tol["0.5"]["sweeps"] <= 6
