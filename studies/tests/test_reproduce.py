"""
Tests of studies/reproduce/: the statistics (scipy.stats) against hand-computed values and printed tables,
the paired initialisation, the router initialisation of the mesh_as_base arm, resuming, stored results (also
those written before a config key was renamed), the plot subcommand, and (the SLOW one, about a minute)
`python -m studies.reproduce --quick` end to end.

    python -m pytest -q studies/tests/test_reproduce.py                      # all, ~1-2 min
    python -m pytest -q studies/tests/test_reproduce.py -k "not slow"        # without the --quick run, ~15 s
"""

import contextlib
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import torch

import train
from model import GPT, GPTConfig
from studies import probe
from studies.reproduce import jacobi, protocol, runs, stats, summary, tables
from studies.reproduce.__main__ import main
from support.checkpoints import load_checkpoint
from support.runtime import RunError

HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -----------------------------------------------------------------------------
# Statistics

# Two-sided 95% Student-t multipliers t_{0.975, df}, as printed in every statistics table.
T_TABLE = {
    1: 12.7062,
    2: 4.3027,
    3: 3.1824,
    4: 2.7764,
    5: 2.5706,
    6: 2.4469,
    9: 2.2622,
    10: 2.2281,
    20: 2.0860,
    30: 2.0423,
}


@pytest.mark.parametrize("df", sorted(T_TABLE))
def test_t_quantile_matches_the_printed_table(df):
    assert stats.t_quantile(0.975, df) == pytest.approx(T_TABLE[df], abs=1e-4)


def test_t_distribution_closed_forms():
    # df = 1 is the Cauchy distribution: P(|T| < 1) = 1/2; df = 2: P(|T| < t) = t / sqrt(2 + t²)
    assert stats.t_two_sided(1.0, 1) == pytest.approx(0.5, abs=1e-15)
    for t in (0.3, 1.0, 4.3):
        assert stats.t_two_sided(t, 2) == pytest.approx(t / math.sqrt(2 + t * t), abs=1e-15)
    # large df tends to the normal: P(|Z| < 1.959964) = 0.95
    assert stats.t_quantile(0.975, 100000) == pytest.approx(1.959964, abs=1e-4)
    assert stats.t_quantile(0.95, 4) == pytest.approx(2.1318, abs=1e-4)


def test_t_quantile_is_scipys():
    from scipy.stats import t as student_t
    for df in range(1, 41):
        for p in (0.9, 0.975, 0.995):
            assert stats.t_quantile(p, df) == pytest.approx(student_t.ppf(p, df), rel=1e-9)


def test_paired_stats_against_hand_computed_values():
    # arm 1, 2, 3 against baseline 0.5, 1, 2.5: differences 0.5, 1, 0.5, mean 2/3, std sqrt(1/12);
    # half-width = t_{0.975,2} · sqrt(1/12) / sqrt(3) = 4.302653 / 6 = 0.717109
    st = stats.paired_stats({1: 1.0, 2: 2.0, 3: 3.0}, {1: 0.5, 2: 1.0, 3: 2.5})
    assert st["n"] == 3 and st["seeds"] == [1, 2, 3]
    assert st["mean"] == pytest.approx(2.0) and st["std"] == pytest.approx(1.0)
    assert st["baseline_mean"] == pytest.approx(4 / 3) and st["baseline_std"] == pytest.approx(
        math.sqrt(13 / 12)
    )
    assert st["diff"] == pytest.approx(2 / 3) and st["diff_std"] == pytest.approx(math.sqrt(1 / 12))
    assert st["t"] == pytest.approx(4.302653, abs=1e-6)
    assert st["half_width"] == pytest.approx(0.717109, abs=1e-6)
    assert st["ci"] == pytest.approx([2 / 3 - 0.717109, 2 / 3 + 0.717109], abs=1e-6)
    assert st["excludes_zero"] is False
    assert stats.verdict(st, -1) == stats.verdict(st, +1) == "not resolvable at this scale"


def test_paired_stats_pairs_by_seed_and_calls_orderings_only_outside_the_interval():
    # seeds 2 and 4 have no partner and are left out; differences -0.10, -0.12, -0.11 (mean -0.11, std 0.01)
    arm = {1: 1.00, 2: 9.0, 3: 1.08, 5: 1.19}
    base = {1: 1.10, 3: 1.20, 4: 9.0, 5: 1.30}
    st = stats.paired_stats(arm, base)
    assert st["seeds"] == [1, 3, 5] and st["diff"] == pytest.approx(-0.11)
    assert st["diff_std"] == pytest.approx(0.01)
    assert st["half_width"] == pytest.approx(4.302653 * 0.01 / math.sqrt(3), abs=1e-7)   # 0.024842
    assert st["excludes_zero"] is True
    assert stats.verdict(st, -1) == "reproduced" and stats.verdict(st, +1) == "not reproduced"
    one = stats.paired_stats({1: 1.0}, {1: 2.0})                       # one pair: no interval
    assert (
        one["diff"] == -1.0
        and one["ci"] is None
        and stats.verdict(one, -1) == "not resolvable at this scale"
    )
    with pytest.raises(ValueError):
        stats.paired_stats({1: 1.0}, {2: 1.0})


def test_crossover_interpolates_in_flops():
    def run(arm, steps, fpt, curve_steps, vals):
        return {"study": "t2mlr", "arm": arm, "layout": "", "seed": 1, "steps": steps, "flops_per_token": fpt,
                "tokens_per_step": 10, "curve": {"step": curve_steps, "val_loss": vals}}
    runs = {"a": run("t2mlr", 10, 5.0, [0, 10], [9.0, 3.0]), "b": run("plain", 10, 1.0, [0, 10], [9.0, 3.5]),
            "c": run("plain_flops", 50, 1.0, [0, 20, 40, 50], [9.0, 4.0, 2.0, 1.8])}
    # t2mlr ends at 3.0; plain_flops passes 3.0 halfway between steps 20 (4.0) and 40 (2.0): step 30, i.e.
    # 30 x 10 x 1 = 300 FLOPs = 0.6 x t2mlr's 10 x 10 x 5 = 500 and 3 x plain's 10 x 10 x 1 = 100
    cr = tables.crossover(runs)
    assert cr["per_seed"][1] == {"step": 30.0, "of_t2mlr_flops": 0.6, "of_plain_flops": 3.0}
    runs["c"]["curve"]["val_loss"] = [9.0, 8.0, 7.0, 6.0]                     # never gets there
    assert tables.crossover(runs) == {"per_seed": {1: None}, "n_reached": 0, "mean_of_t2mlr_flops": None,
                                         "mean_of_plain_flops": None}


# -----------------------------------------------------------------------------
# The grid, paired initialisation, router initialisation

def test_grid_is_paired_and_uses_one_protocol():
    runs = protocol.make_grid(protocol.FULL)
    names = [r.name for r in runs]
    assert len(names) == len(set(names)) == 3 * 10 + 3 * 4
    mesh = [r for r in runs if r.study == "mesh"]
    # every MeSH-study run: the same schedule and batch, unrolled depth 8; seeds 1..3
    assert (
        len({json.dumps({k: v for k, v in r.train.items() if k != "seed"}, sort_keys=True) for r in mesh})
        == 1
    )
    assert {GPTConfig(**r.model).n_unrolled for r in mesh} == {8}
    assert {r.seed for r in mesh} == {1, 2, 3}
    # seeds outermost, across both studies
    assert [r.seed for r in runs] == sorted(r.seed for r in runs)
    t2 = [r for r in runs if r.study == "t2mlr"]
    flops = {r.arm: protocol.flops_per_token(r.model) * r.steps for r in t2 if r.seed == 1}
    assert flops["plain_flops"] == pytest.approx(flops["t2mlr"], rel=0.01)     # equal training FLOPs
    assert {r.steps for r in t2 if r.arm in ("plain", "t2mlr")} == {protocol.FULL.t2mlr_steps}
    assert {r.steps for r in t2 if r.arm == "plain_224"} == {round(2.24 * protocol.FULL.t2mlr_steps)}


def tiny(**overrides):
    return replace(protocol.QUICK, **overrides)


def run_named(pr, name):
    return next(r for r in protocol.make_grid(pr) if r.name == name)


def test_arms_share_the_seeds_initial_weights_wherever_shapes_agree():
    pr = tiny()
    vanilla = protocol.initial_model(run_named(pr, "mesh_vanilla_s1")).state_dict()
    for name in ("mesh_K2_base_s1", "mesh_K2_mesh_s1", "mesh_K4_anchor_s1", "mesh_K2_mesh_as_base_s1"):
        own = protocol.initial_model(run_named(pr, name)).state_dict()
        shared = [k for k in own if k in vanilla and own[k].shape == vanilla[k].shape]
        # all but the routers
        assert set(own) - set(shared) == {k for k in own if k.startswith("mesh.")}, name
        assert all(torch.equal(own[k], vanilla[k]) for k in shared), name
    other_seed = protocol.initial_model(run_named(pr, "mesh_K2_base_s2")).state_dict()
    assert not torch.equal(other_seed["wte.weight"], vanilla["wte.weight"])
    # mesh and mesh_as_base differ only in the router biases
    mesh = protocol.initial_model(run_named(pr, "mesh_K2_mesh_s1")).state_dict()
    as_base = protocol.initial_model(run_named(pr, "mesh_K2_mesh_as_base_s1")).state_dict()
    assert [k for k in mesh if not torch.equal(mesh[k], as_base[k])] == \
        [k for k in mesh if k.startswith("mesh.") and k.endswith(".bias")]
    # T²MLR: everything but the gate is the plain model's
    plain = protocol.initial_model(run_named(pr, "t2mlr_plain_s2")).state_dict()
    t2 = protocol.initial_model(run_named(pr, "t2mlr_t2mlr_s2")).state_dict()
    assert all(torch.equal(t2[k], plain[k]) for k in plain) and any(k.startswith("gate.") for k in t2)


def mesh_pair(state_passing, seed=0):
    cfg = dict(flavour="neox", vocab_size=64, block_size=16, n_embd=32, n_head=2, layout="1+1R3+1")
    torch.manual_seed(seed)
    mesh = GPT(GPTConfig(**cfg, state_passing="mesh")).double()
    other = GPT(GPTConfig(**cfg, state_passing=state_passing)).double()
    other.load_state_dict({k: v for k, v in mesh.state_dict().items() if not k.startswith("mesh.")})
    return mesh, other


@pytest.mark.parametrize("kind", ["base", "residual"])
def test_router_bias_starts_mesh_as_base_or_residual(kind):
    mesh, other = mesh_pair(kind)
    protocol.set_router_bias(mesh, kind, p=1 - 1e-15)       # one-hot in the limit: exactly the special case
    idx = torch.randint(64, (2, 16), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(mesh(idx)[0], other(idx)[0], rtol=0, atol=1e-9)
    # the arm's p: weight p on the slot at zero logits
    protocol.set_router_bias(mesh, kind)
    for router in (*mesh.mesh.write_routers, *mesh.mesh.read_routers):
        assert torch.softmax(router.bias, 0).max().item() == pytest.approx(protocol.ROUTER_P, abs=1e-12)


def test_scale_probe_agrees_with_probe_py_and_undoes_a_state_scale():
    mesh, _ = mesh_pair("base")
    mesh = mesh.float().eval()
    seqs = torch.randint(64, (4, 16), generator=torch.Generator().manual_seed(2))
    sc = summary.scale_probe(mesh, seqs, batch_size=2)
    res = probe.run_probe(mesh, seqs, batch_size=2, top=8)
    assert sc["blocks"] == res["skew"]["blocks"] == ["prelude", "core0", "core1", "core2", "coda"]
    assert sc["skew"] == pytest.approx(res["skew"]["mean"], abs=1e-6)
    # skew_unit is the relative update of the block applied to its input at RMS 1: for the prelude (input
    # h_emb) it is the skew of a model whose embeddings are rescaled so that h_emb has RMS 1
    scaled = GPT(mesh.cfg)
    scaled.load_state_dict(mesh.state_dict())
    with torch.no_grad():
        scaled.wte.weight /= sc["state_rms"]["h_emb"]        # one global RMS: close to the per-sequence one
    sc2 = summary.scale_probe(scaled.eval(), seqs, batch_size=2)
    assert sc2["state_rms"]["h_emb"] == pytest.approx(1.0, rel=0.05)
    assert sc2["skew"][0] == pytest.approx(sc["skew_unit"][0], rel=0.05)
    assert sc2["skew_unit"][0] == pytest.approx(sc["skew_unit"][0], rel=1e-4)


# -----------------------------------------------------------------------------
# Training runs: resuming, stored results, plotting

@pytest.fixture(scope="module")
def pydoc(tmp_path_factory):
    """Byte tokens of the Python manual (ships with CPython): data for tiny runs, prepared in a few
    seconds."""
    out = tmp_path_factory.mktemp("data")
    subprocess.run(
        [
            sys.executable,
            os.path.join(HERE, "prepare_data.py"),
            "--source",
            "pydoc",
            "--tokenizer",
            "byte",
            "--out_dir",
            str(out),
        ],
        check=True,
        capture_output=True,
        cwd=HERE,
    )
    return str(out / "pydoc")


def test_the_shared_init_is_what_train_py_builds(pydoc, tmp_path):
    run = run_named(tiny(), "mesh_vanilla_s2")
    argv = runs.launch_argv(run, str(tmp_path / "scratch"), pydoc, "cpu", "scratch") + ["--max_iters=0"]
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        train.main(argv)                                       # train.py's own init, saved at step 0
    saved = load_checkpoint(str(tmp_path / "scratch" / "ckpt.pt"))["model"]
    mine = protocol.initial_model(run).state_dict()
    assert saved.keys() == mine.keys() and all(torch.equal(saved[k], mine[k]) for k in mine)


def test_an_interrupted_run_continues_bit_for_bit(pydoc, tmp_path):
    run = run_named(tiny(), "mesh_K2_mesh_as_base_s1")         # 4 steps, evaluated every 2
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    assert runs.train_run(run, whole, pydoc, "cpu") == "trained"
    assert runs.train_run(run, parts, pydoc, "cpu", stop_at=2) == "trained"   # "killed" after step 2
    assert load_checkpoint(os.path.join(parts, "ckpt.pt"))["step"] == 2
    assert runs.train_run(run, parts, pydoc, "cpu") == "resumed"
    assert runs.train_run(run, parts, pydoc, "cpu") == "complete"
    a, b = (load_checkpoint(os.path.join(d, "ckpt.pt")) for d in (whole, parts))
    assert a["step"] == b["step"] == 4 and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    _, val_a, _ = runs.read_log(whole)
    _, val_b, _ = runs.read_log(parts)
    assert val_a == val_b and list(val_a) == [0, 2, 4]
    # a checkpoint of other settings in the run's folder is refused, not continued
    other = replace(run, train=run.train | {"learning_rate": 1e-3})
    with pytest.raises(RunError, match="learning_rate"):
        runs.train_run(other, parts, pydoc, "cpu")
    # the summary: curve, final loss over the requested windows, probe and scale numbers
    s = summary.summarize(run, whole, pydoc, tiny())
    assert s["curve"]["step"] == [0, 2, 4] and s["final"]["windows"] == tiny().final_windows
    assert s["final"]["val_bpb"] == pytest.approx(s["final"]["val_loss"] / math.log(2), rel=1e-5)
    assert set(s["diagnostics"]) >= {"skew_unit_last", "cka_consecutive", "erank_loops", "rms_h0"}
    # a stored result counts only for the same settings
    path = str(tmp_path / "s.json")
    runs.write_json(path, s)
    assert runs.load_summary(path, run)["final"] == s["final"]
    with pytest.raises(RunError, match="train.learning_rate"):
        runs.load_summary(path, other)


def test_committed_results_count_as_finished_runs_of_the_grid():
    """studies/results/reproduce/*.json were written before state_mode was renamed state_passing: each still
    counts as its run of today's grid (so the study resumes across the rename), read under the new name."""
    grid = {r.name: r for r in protocol.make_grid(protocol.FULL)}
    folder = os.path.join(HERE, "studies", "results", "reproduce")
    names = sorted(f[:-len(".json")] for f in os.listdir(folder) if f.endswith(".json"))
    assert names == sorted(grid)
    for name in names:
        s = runs.load_summary(os.path.join(folder, f"{name}.json"), grid[name])
        assert s is not None and s["config"] == grid[name].fingerprint(), name
        assert "state_mode" not in s["config"]["model"]


def test_plot_subcommand_draws_any_runs(pydoc, tmp_path):
    pytest.importorskip("matplotlib")
    dirs = []
    for name in ("t2mlr_plain_s1", "mesh_K2_base_s1"):
        run = run_named(tiny(t2mlr_steps=2, mesh_steps=2), name)
        dirs.append(str(tmp_path / name))
        runs.train_run(run, dirs[-1], pydoc, "cpu")
    out = str(tmp_path / "curves.png")
    assert main(["plot", *dirs, "--out", out]) == out and os.path.getsize(out) > 10_000
    with pytest.raises(RunError, match="log.jsonl"):
        main(["plot", str(tmp_path), "--out", out])


# -----------------------------------------------------------------------------
# SLOW: the whole --quick grid end to end (about a minute; the CI target is under 2 minutes)

def test_quick_mode_end_to_end_slow(pydoc, tmp_path):
    """`python -m studies.reproduce --quick` trains every arm of both studies (2 seeds, a few steps), probes, evaluates the
    Jacobi gaps, writes the per-run JSONs, reproduce.json, reproduce.md and the figures; run again, it skips
    every run and assembles the same report."""
    cmd = [sys.executable, "-m", "studies.reproduce", "--quick", "--data_dir", pydoc,
           "--out_dir", str(tmp_path / "out")]
    t0 = time.time()
    first = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=600)
    elapsed = time.time() - t0
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    print(f"--quick took {elapsed:.0f} s")
    assert elapsed < 300          # the target is 2 minutes on 2 idle cores; this bound only catches runaways
    results = tmp_path / "out" / "results"
    report = json.loads((results / "reproduce.json").read_text())
    grid = protocol.make_grid(protocol.QUICK)
    assert report["complete"] and report["n_done"] == len(grid) == 28
    assert set(report) >= {
        "protocol",
        "data",
        "tables",
        "claims",
        "resolution_bpb",
        "runs",
        "figures",
        "wall_s_runs",
    }
    assert (
        set(report["runs"])
        == {r.name for r in grid}
        == {p.stem for p in (results / "reproduce").glob("*.json")}
    )
    for name, s in report["runs"].items():
        assert set(s) >= {"config", "seed", "curve", "train_curve", "final", "flops_per_token", "wall_s"}
        assert s["final"]["val_bpb"] > 0 and s["curve"]["step"][-1] == s["steps"]
        recursive = s["study"] == "mesh" and s["arm"] != "vanilla"
        assert ("probe" in s) == ("diagnostics" in s) == recursive, name
        assert ("jacobi_gap" in s) == (s["arm"] == "t2mlr"), name
    assert set(report["tables"]["mesh"]) == {"K2", "K4"}
    assert set(report["tables"]["t2mlr"]["arms"]) == {"plain", "t2mlr", "plain_224", "plain_flops"}
    assert list(report["tables"]["jacobi_gap"]) == ["1", "2", "4", "8", "16"]
    claims = {c["id"]: c for c in report["claims"]}
    assert {"mesh-K2-1", "mesh-K4-3", "diag-K4-1b", "t2mlr-1", "t2mlr-2", "t2mlr-2b", "t2mlr-3"} <= set(
        claims
    )
    assert all(c["ours"]["n"] == 2 and c["ours"]["ci"] is not None for c in claims.values())
    assert "mesh-K4-6" not in claims                                # K4 has no mesh_as_base arm
    assert all(c["verdict"].startswith("smoke test only") for c in claims.values())   # never "reproduced"
    assert "| reproduced" not in (results / "reproduce.md").read_text()
    for path in report["figures"]:
        assert os.path.getsize(path) > 10_000
    assert len(report["figures"]) == 5 and "Claims" in (results / "reproduce.md").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=300)
    assert again.returncode == 0 and again.stdout.count("done earlier, skipped") == len(grid)
    assert json.loads((results / "reproduce.json").read_text())["tables"] == report["tables"]
    # a stored run made on other data is refused, not reused (the same folder, one JSON changed)
    stored = results / "reproduce" / "t2mlr_plain_s1.json"
    s = json.loads(stored.read_text())
    s["data"]["train_tokens"] += 1
    stored.write_text(json.dumps(s))
    other = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=300)
    assert other.returncode != 0 and "was made on other data" in other.stderr, other.stderr[-2000:]
    # `... starts`: the zero start's Jacobi gaps equal the run's own gap table (same windows)
    ckpt = tmp_path / "out" / "t2mlr_t2mlr_s1" / "ckpt.pt"
    rows = main(
        [
            "starts",
            str(ckpt),
            "--data_dir",
            pydoc,
            "--windows",
            str(protocol.QUICK.gap_windows),
            "--out",
            str(tmp_path / "starts.json"),
        ]
    )
    gap = report["runs"]["t2mlr_t2mlr_s1"]["jacobi_gap"]
    assert rows[0]["exact"] == pytest.approx(gap["exact"], abs=1e-5)
    assert rows[0]["zero"] == pytest.approx([j - gap["exact"] for j in gap["jacobi"]], abs=2e-5)
    assert len(rows[0]["ungated"]) == 5 and rows[0]["ungated"] != rows[0]["zero"]
    assert json.loads((tmp_path / "starts.json").read_text())["runs"][0]["depths"] == [1, 2, 4, 8, 16]


def test_tolerance_summary_pairs_seeds_and_calls_a_win_only_within_the_spread():
    """The tolerance subcommand: runs pair by seed (an unpaired seed is left out); the tolerance wins only when
    it is faster and its mean val-loss difference lies within the fixed arm's seed spread."""
    def run(seed, loss, wall, passes):
        return {"seed": seed, "final_exact_val_loss": loss, "wall_s": wall, "median_step_ms": wall,
                "mean_passes": passes}
    fixed = [run(1, 1.50, 100.0, 16.0), run(2, 1.52, 110.0, 16.0), run(3, 9.0, 1.0, 16.0)]
    tol = [run(1, 1.505, 80.0, 12.0), run(2, 1.515, 99.0, 13.0)]
    s = jacobi.tolerance_summary(fixed, tol)
    assert s["seeds"] == [1, 2]
    assert s["val_loss_diff"] == pytest.approx([0.005, -0.005])
    assert s["val_loss_diff_mean"] == pytest.approx(0)
    assert s["fixed_seed_spread"] == pytest.approx(0.02)
    assert s["wall_ratio"] == pytest.approx([0.8, 0.9]) and s["passes"]["tol"] == [12.0, 13.0]
    assert s["win"] is True
    worse = [run(1, 1.55, 80.0, 12.0), run(2, 1.57, 99.0, 13.0)]          # 0.05 worse: beyond the spread
    assert jacobi.tolerance_summary(fixed, worse)["win"] is False
    slower = [run(1, 1.50, 120.0, 16.0), run(2, 1.52, 130.0, 16.0)]       # no loss change but slower
    assert jacobi.tolerance_summary(fixed, slower)["win"] is False
    with pytest.raises(ValueError, match="no seed"):
        jacobi.tolerance_summary(fixed, [run(7, 1.5, 1.0, 1.0)])


def test_gap_rows_pair_mesh_with_base_by_seed(tmp_path):
    """studies.reproduce.gap: the MeSH - base difference at each evaluation and at the end, paired by seed
    (seed 2's base is missing, so only seeds 1 and 3 pair), in bits/byte."""
    import json
    import math
    from studies.reproduce.gap import gap_rows
    (tmp_path / "reproduce").mkdir()
    losses = {("base", 1): 2.0, ("base", 3): 2.2, ("mesh", 1): 2.1, ("mesh", 2): 9.0, ("mesh", 3): 2.5}
    for (arm, seed), loss in losses.items():
        run = {"seed": seed, "steps": 10, "tokens_per_step": 100,
               "curve": {"step": [0, 10], "val_loss": [5.0, loss * math.log(2)], "windows": 4},
               "final": {"val_bpb": loss, "windows": 8}}
        (tmp_path / "reproduce" / f"mesh_K2_{arm}_s{seed}.json").write_text(json.dumps(run))
    rows = gap_rows(str(tmp_path))
    assert [(r["tokens"], r["on"], r["n"]) for r in rows] == [
        (0, "curve windows", 2), (1000, "curve windows", 2), (1000, "val split", 2)]
    assert rows[0]["diff"] == pytest.approx(0.0)
    assert rows[1]["diff"] == pytest.approx(0.2) and rows[2]["diff"] == pytest.approx(0.2)
    assert rows[2]["ci"][0] < 0.2 < rows[2]["ci"][1]
