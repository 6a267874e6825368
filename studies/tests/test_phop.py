"""studies/phop.py: the p-hop generator against a slow loop over its definition, the scoring mask,
steps to learn (a run that never learns counts at the cap), the random-depth plan,
and a tiny run resumed bit-equal to an uninterrupted one."""

import json

import pytest
import torch

from studies import phop


def slow_hop_targets(X, p):
    """The definition, one word and one position at a time: hop(i) = the largest j <= i with
    X[j-1] = X[i], else 0; target X[hop^p(i)], scored where hop^p(i) != 0."""
    B, n = X.shape
    targets, scored = torch.zeros_like(X), torch.zeros_like(X, dtype=torch.bool)
    for b in range(B):
        x = X[b].tolist()
        def hop(i):
            return max([j for j in range(1, i + 1) if x[j - 1] == x[i]], default=0)
        for i in range(n):
            j = i
            for _ in range(p):
                j = hop(j)
            targets[b, i], scored[b, i] = x[j], j != 0
    return targets, scored


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_hop_targets_match_the_definition(p):
    X = torch.randint(phop.ALPHABET, (6, 40), generator=torch.Generator().manual_seed(p))
    targets, scored = phop.hop_targets(X, p)
    slow_targets, slow_scored = slow_hop_targets(X, p)
    assert torch.equal(scored, slow_scored)
    assert torch.equal(targets, slow_targets)


def test_a_hand_worked_word():
    # X = a b a b c a: hop = [0, 0, 1, 2, 0, 3]; hop^2 = [0, 0, 0, 1, 0, 2]
    X = torch.tensor([[0, 1, 0, 1, 2, 0]])
    assert phop.hop_positions(X).tolist() == [[0, 0, 1, 2, 0, 3]]
    targets, scored = phop.hop_targets(X, 2)
    assert scored.tolist() == [[False, False, False, True, False, True]]
    assert targets[0, 3].item() == X[0, 1].item() and targets[0, 5].item() == X[0, 2].item()


def test_the_scoring_mask_leaves_out_chains_that_end_at_position_0():
    X, y = phop.make_batch(2048, 64, 4, seed=3)
    _, scored = phop.hop_targets(X, 4)
    assert torch.equal(y == -1, ~scored)
    unscored = (~scored).float().mean().item()
    assert 0.15 < unscored < 0.25            # about 20% at p = 4, n = 64, 4 letters
    _, scored8 = phop.hop_targets(X, 8)
    assert 0.33 < (~scored8).float().mean().item() < 0.45      # about 40% at p = 8


def test_steps_to_learn_and_a_run_that_never_learns():
    assert phop.steps_to_learn([(0, 0.5), (100, 0.89), (200, 0.9), (300, 0.2)], 6000) == (200, True)
    assert phop.steps_to_learn([(0, 0.5), (100, 0.89), (6000, 0.6)], 6000) == (6000, False)
    assert phop.held([(100, 0.99), (200, 0.995)]) and not phop.held([(100, 0.98), (200, 0.999)])


def test_a_run_writes_its_json_and_resumes_bit_equal(tmp_path):
    kw = dict(arm="mesh", K=2, layers=None, p=2, n=16, seed=7, width=32, batch_size=8, eval_every=5,
              log=lambda *a: None)
    whole = phop.run(steps=10, out=str(tmp_path / "a"), ckpt_dir=str(tmp_path / "ca"), **kw)
    phop.run(steps=5, out=str(tmp_path / "b"), ckpt_dir=str(tmp_path / "cb"), **kw)
    ckpt = tmp_path / "cb" / "mesh_K2_p2_n16_s7.pt"
    saved = torch.load(ckpt, weights_only=True)
    saved["spec"]["max_steps"] = 10                     # the same run, continued to 10 steps
    torch.save(saved, ckpt)
    resumed = phop.run(steps=10, out=str(tmp_path / "b"), ckpt_dir=str(tmp_path / "cb"), **kw)
    assert resumed["history"] == whole["history"] and resumed["steps_run"] == 10
    a = torch.load(tmp_path / "ca" / "mesh_K2_p2_n16_s7.pt", weights_only=True)["model"]
    b = torch.load(ckpt, weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    doc = json.loads((tmp_path / "a" / "mesh_K2_p2_n16_s7.json").read_text())
    assert doc["commit"] and set(doc["test_time_K"]) == {str(k) for k in phop.MEASURED_KS}


def test_a_bad_arm_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="'loop' is not one of base, anchor, mesh, vanilla"):
        phop.model_config("loop", 2, None, 16, 32)


def test_a_random_depth_run_draws_its_loops_and_measures_up_to_sixteen(tmp_path):
    kw = dict(arm="mesh", K=2, layers=None, p=2, n=16, seed=7, width=32, batch_size=8, eval_every=5,
              log=lambda *a: None, loops_sampler="uniform")
    doc = phop.run(steps=10, out=str(tmp_path / "a"), ckpt_dir=str(tmp_path / "ca"), **kw)
    assert doc["name"].endswith("_uniform") and doc["loops_sampler"] == "uniform"
    assert doc["max_loops"] == phop.MAX_LOOPS and set(doc["test_time_K"]) >= {"1", "4", "16"}
    saved = torch.load(tmp_path / "ca" / (doc["name"] + ".pt"), weights_only=True)
    assert len([k for k in saved["model"] if k.startswith("mesh.read_routers.")]) == 2 * (phop.MAX_LOOPS + 1)
    fixed = phop.run(steps=10, out=str(tmp_path / "b"), ckpt_dir=str(tmp_path / "cb"), **kw | {"loops_sampler": "fixed"})
    assert fixed["history"][-1] != doc["history"][-1]          # the draws changed the training
    assert phop.load_runs(str(tmp_path / "a"), 2) == {}        # never mixed into the fixed-depth tables


def test_the_random_depth_plan_pairs_every_finished_seed():
    """Workers take the plan in order, so after any prefix of whole seeds every passing has the same seeds;
    the harder p is calibrated by a fixed-depth run before its random-depth runs."""
    runs = phop.plan_random_depth()
    p6 = [r for r in runs if r[4] == phop.P]
    assert all(r[5] == "poisson_lognormal" and r[1] == 4 for r in p6)
    for k in range(1, len(phop.TEST_SEEDS) + 1):
        first = p6[:3 * k]
        assert {(r[0], r[3]) for r in first} == {(a, s) for a in ("base", "mesh", "anchor")
                                                 for s in phop.TEST_SEEDS[:k]}
    hard = [r for r in runs if r[4] == phop.HARD_P]
    assert hard[0][5] == "fixed" and all(r[5] == "poisson_lognormal" for r in hard[1:])
