"""
Tests of s5_retrieval.py: the S5 state rule against an independent composition of permutations, the worked
example of the generator's format, the tokenizer, the layout of control flow and padding, the metrics, the
LSTM's parameter matching, and a one-minute training run that lowers the loss.

Run: python -m pytest -q studies/tests/test_s5_retrieval.py
"""

import dataclasses
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from studies.s5_retrieval import (
    PERMUTATIONS,
    TOKENIZER,
    LSTMLM,
    S5Config,
    apply_action,
    format_example,
    lstm_hidden_for,
    make_batch,
    make_example,
    perm_token,
    score,
)

ROOT = Path(__file__).resolve().parents[2]


def compose_as_functions(actions):
    """Independent check of the state rule: an action a maps position i to the cup at position a[i] - 1 of the
    old state, i.e. state_new = state_old ∘ a as functions on positions 0..4. Compose the functions first,
    then apply the composite once to the identity arrangement."""
    composite = list(range(5))                                   # position -> source position, identity
    for a in actions:
        composite = [composite[a[i] - 1] for i in range(5)]
    return tuple(composite[i] + 1 for i in range(5))


def test_state_rule_matches_composition_of_permutations():
    rng = random.Random(0)
    for _ in range(200):
        actions = [rng.choice(PERMUTATIONS) for _ in range(rng.randint(1, 30))]
        state = (1, 2, 3, 4, 5)
        for a in actions:
            state = apply_action(state, a)
        assert state == compose_as_functions(actions)


def test_worked_example_token_for_token():
    """The generator's documented example (n = 3, value_len = 4), rebuilt from its dictionary and actions."""
    dictionary = [((4, 2, 3, 5, 1), "gRV5"), ((1, 4, 3, 2, 5), "IfLB"), ((1, 2, 4, 5, 3), "poiV")]
    actions = [(4, 2, 3, 5, 1), (1, 4, 3, 2, 5), (1, 2, 4, 5, 3)]
    inputs, targets, control = format_example(dictionary, actions)
    assert (
        "".join(inputs) == "<A_42351>gRV5<A_14325>IfLB<A_12453>poiV|<A_42351>    <A_14325>    <A_12453>    "
    )
    assert (
        "".join(targets) == "<A_42351>gRV5<A_14325>IfLB<A_12453>poiV|<A_42351>gRV5<A_45321>IfLB<A_45213>poiV"
    )
    assert len(inputs) == len(targets) == len(control) == 10 * 3 + 1
    assert control == [1] * 16 + [2] * 15
    # atomic permutation tokens survive a round trip
    assert TOKENIZER.split("".join(inputs)) == inputs


def test_tokenizer_has_the_t2mlr_codes_layout_and_round_trips():
    vocab = TOKENIZER.vocab
    assert len(vocab) == 188
    assert vocab[:4] == ["<pad>", "<unk>", "<bos>", "<eos>"]
    assert vocab[4] == "a" and vocab[55] == "Z" and vocab[56] == "0" and vocab[65] == "9"
    assert vocab[66] == " " and vocab[67] == "|"
    assert vocab[68] == "<A_12345>" and vocab[187] == "<A_54321>"
    assert vocab[68:] == sorted(vocab[68:])                      # lexicographic order of the permutations
    rng = random.Random(3)
    for n in (1, 5, 17):
        inputs, targets, _ = make_example(n, rng)
        for tokens in (inputs, targets):
            text = "".join(tokens)
            assert TOKENIZER.decode(TOKENIZER.encode(text)) == text
            assert TOKENIZER.encode(text) == TOKENIZER.encode(tokens)
    with pytest.raises(ValueError, match="'#'"):
        TOKENIZER.encode("ab#")


def test_generator_is_seeded_and_follows_the_format():
    a, b = make_example(9, random.Random(5)), make_example(9, random.Random(5))
    assert a == b and make_example(9, random.Random(6)) != a
    rng = random.Random(1)
    for n in (1, 2, 8, 20):
        inputs, targets, control = make_example(n, rng, value_len=3)
        assert len(inputs) == (2 + 2 * 3) * n + 1
        prompt = inputs[:inputs.index("|") + 1]
        keys = prompt[0:-1:4]
        # n distinct keys: actions plus distractors
        assert len(keys) == n and len(set(keys)) == n
        codes = {prompt[i]: "".join(prompt[i + 1:i + 4]) for i in range(0, len(prompt) - 1, 4)}
        actions = inputs[len(prompt)::4]
        assert all(a in codes for a in actions)                      # every action has its entry
        assert all(t == " " for i, t in enumerate(inputs[len(prompt):]) if i % 4)
        state = (1, 2, 3, 4, 5)
        for j, action in enumerate(actions):                          # state token, then the ACTION's code
            state = apply_action(state, tuple(int(c) for c in action[3:8]))
            at = len(prompt) + 4 * j
            assert targets[at] == perm_token(state) and "".join(targets[at + 1:at + 4]) == codes[action]
        assert targets[:len(prompt)] == prompt


def test_lengths_are_drawn_uniformly():
    from studies.s5_retrieval import train_batch
    s5 = S5Config(train_min_n=2, train_max_n=5)
    lengths = []
    for step in range(200):
        _, _, control = train_batch(s5, seed=0, step=step, batch_size=8, device="cpu")
        lengths += ((control == 2).sum(dim=1) // 5).tolist()
    assert set(lengths) == {2, 3, 4, 5}
    assert all(abs(lengths.count(n) / len(lengths) - 0.25) < 0.05 for n in (2, 3, 4, 5))


def test_batch_layout_control_and_padding():
    rng = random.Random(0)
    short, long = make_example(1, rng), make_example(3, rng)
    idx, targets, control = make_batch([short, long])
    assert idx.shape == (2, 31)
    assert idx[0, 11:].eq(0).all() and targets[0, 11:].eq(-1).all() and control[0, 11:].eq(0).all()
    assert control[0, :6].eq(1).all() and control[0, 6:11].eq(2).all()
    assert control[1, :16].eq(1).all() and control[1, 16:].eq(2).all()
    assert TOKENIZER.decode(targets[1].tolist()) == "".join(long[1])
    assert (targets[0, :11] >= 0).all()                           # every real position is labelled (shift 0)


def test_metrics_on_hand_made_predictions():
    rng = random.Random(0)
    idx, targets, control = make_batch([make_example(2, rng), make_example(1, rng)])
    perfect = torch.nn.functional.one_hot(targets.clamp_min(0), 188).double()
    counts = lambda logits: {k: v.tolist() for k, v in score(logits, targets, control).items()}
    assert counts(perfect) == {"seq": [1, 1], "answers": [10, 5], "answers_right": [10, 5],
                               "states": [2, 1], "states_right": [2, 1]}
    one_wrong = perfect.clone()
    # the last code character
    one_wrong[0, -1] = torch.nn.functional.one_hot((targets[0, -1] + 1) % 188, 188)
    assert counts(one_wrong) == {"seq": [0, 1], "answers": [10, 5], "answers_right": [9, 5],
                                 "states": [2, 1], "states_right": [2, 1]}
    state_wrong = perfect.clone()
    # the only state of row 1
    state_wrong[1, 6] = torch.nn.functional.one_hot((targets[1, 6] + 1) % 188, 188)
    assert counts(state_wrong)["states_right"] == [2, 0] and counts(state_wrong)["seq"] == [1, 0]
    prompt_wrong = perfect.clone()
    prompt_wrong[1, 0] = torch.nn.functional.one_hot((targets[1, 0] + 1) % 188, 188)   # the dictionary copy
    assert counts(prompt_wrong)["seq"] == [1, 0] and counts(prompt_wrong)["answers_right"] == [10, 5]
    padded_garbage = perfect.clone()
    padded_garbage[1, 12:] = 0.0                                   # predictions at padding are never scored
    assert counts(padded_garbage)["seq"] == [1, 1]


def test_evaluate_aggregates_per_n():
    """A model that predicts the targets perfectly except every state token scores 0 state and 1 code
    accuracy."""
    from studies.s5_retrieval import evaluate
    from support.runtime import autocast_context

    class Oracle(torch.nn.Module):
        def __init__(self, break_states):
            super().__init__()
            self.break_states = break_states

        def forward(self, idx, control=None):
            n = int((control == 2).sum(dim=1)[0]) // 5
            rng = random.Random(1_000_003 * n + 7)             # evaluate()'s own test examples
            _, targets, _ = make_batch([make_example(n, rng) for _ in range(idx.shape[0])])
            if self.break_states:
                targets = torch.where(targets >= 68, 68 + (targets - 67) % 120, targets)
            return torch.nn.functional.one_hot(targets.clamp_min(0), 188).double(), None

    s5 = S5Config()
    good = evaluate(Oracle(False), s5, [1, 3], 8, "cpu", autocast_context("cpu", torch.float32))
    assert good == {n: {"seq_acc": 1.0, "token_acc": 1.0, "state_acc": 1.0, "code_acc": 1.0} for n in (1, 3)}
    bad = evaluate(Oracle(True), s5, [3], 8, "cpu", autocast_context("cpu", torch.float32))
    assert bad[3] == {"seq_acc": 0.0, "token_acc": 0.8, "state_acc": 0.0, "code_acc": 1.0}


def test_lstm_is_tied_and_parameter_matched():
    h = lstm_hidden_for(1_180_034, 188, 4)
    lstm = LSTMLM(188, h, 4)
    n = sum(p.numel() for p in lstm.parameters())
    assert abs(n - 1_180_034) / 1_180_034 < 0.05
    assert n == 188 * h + 4 * 4 * (2 * h * h + 2 * h)              # the embedding is also the head
    logits, loss = lstm(
        torch.zeros(2, 5, dtype=torch.long), torch.full((2, 5), -1).index_fill_(1, torch.tensor([0]), 3)
    )
    assert logits.shape == (2, 5, 188) and torch.isfinite(loss)


@pytest.mark.parametrize("prefix, width", [("s5_tiny_", 128), ("s5_", 384)])
def test_configs_are_parameter_matched(prefix, width):
    """Each comparison's LSTM has within 5% of its T²MLR model's parameters (laptop and paper settings); the
    transformer is the T²MLR model without its gate."""
    from configurator import load_config
    from model import GPT, GPTConfig
    from train import TrainConfig
    counts = {}
    for name in ("t2mlr", "transformer", "lstm"):
        (model_cfg, _, s5), _ = load_config([f"config/{prefix}{name}.py"], GPTConfig, TrainConfig, S5Config)
        model = (
            GPT(model_cfg)
            if s5.arch == "gpt"
            else LSTMLM(model_cfg.vocab_size, s5.lstm_hidden, s5.lstm_layers)
        )
        counts[name] = sum(p.numel() for p in model.parameters())
    assert abs(counts["lstm"] - counts["t2mlr"]) / counts["t2mlr"] < 0.05, counts
    # the gate, nothing else
    assert counts["t2mlr"] - counts["transformer"] == 5 * width ** 2 + 2 * width + 2


@pytest.mark.parametrize("arm", ["t2mlr", "transformer", "lstm"])
def test_the_curriculum_overlay_changes_the_schedule_alone_and_keeps_the_papers_examples(arm):
    """config/s5_curriculum.py after a paper config: the same model, task lengths and training mode; the
    curriculum from one action, read on the state tokens; batch x steps = the paper's 400,000 x 16 examples."""
    from configurator import load_config
    from model import GPTConfig
    from train import TrainConfig
    load = lambda *files: load_config(list(files), GPTConfig, TrainConfig, S5Config)[0]
    (model, cfg, s5), (model_c, cfg_c, s5_c) = load(f"config/s5_{arm}.py"), load(f"config/s5_{arm}.py",
                                                                                  "config/s5_curriculum.py")
    assert model_c == model and cfg_c.train_mode == cfg.train_mode and s5.curriculum() is None
    assert s5_c.curriculum() == {"start": 1, "threshold": 0.3}
    assert (s5_c.curriculum_loss, s5_c.curriculum_draw) == ("states", "at_length")
    assert dataclasses.replace(s5_c, curriculum_start=0, curriculum_loss="all", curriculum_draw="uniform") == s5
    assert cfg_c.batch_size * cfg_c.max_iters == cfg.batch_size * cfg.max_iters == 16 * 400_000
    assert cfg_c.warmup_iters == cfg_c.max_iters // 20 and cfg_c.batch_size == 256


def test_quick_run_lowers_the_training_loss(tmp_path):
    out = tmp_path / "quick"
    result = subprocess.run([sys.executable, "-m", "studies.s5_retrieval", "--quick", f"--out_dir={out}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    curve = [row["loss"] for row in results["curve"]]
    assert curve[-1] < curve[0] - 0.5, curve
    assert sorted(map(int, results["per_n"])) == list(range(1, 7))
    assert "n=  6: sequence accuracy" in result.stdout


TINY_RUN = [
    "config/s5_tiny_t2mlr.py",
    "--n_layer=2",
    "--l_end=1",
    "--n_embd=32",
    "--n_head=2",
    "--n_kv_head=2",
    "--mlp_hidden=64",
    "--jacobi_sweeps=4",
    "--jacobi_grad_sweeps=2",
    "--train_max_n=3",
    "--test_max_n=3",
    "--batch_size=4",
    "--eval_examples=4",
    "--warmup_iters=1",
    "--log_interval=1",
    "--eval_interval=2",
    "--lr_decay_iters=4",
]


def tiny_run(*extra):
    from configurator import load_config
    from model import GPTConfig
    from studies.s5_retrieval import train
    from train import TrainConfig
    return train(*load_config([*TINY_RUN, *extra], GPTConfig, TrainConfig, S5Config)[0], log=lambda _: None)


def test_runs_are_only_continued_or_reused_with_their_own_settings(tmp_path):
    from configurator import ConfigError
    from support.runtime import RunError
    out = f"--out_dir={tmp_path / 'run'}"
    with pytest.raises(RunError, match="no checkpoint at"):
        tiny_run("--max_iters=2", out, "--init_from=resume")                # nothing to resume
    with pytest.raises(ConfigError, match="init_from 'x.pt'"):
        tiny_run("--max_iters=2", out, "--init_from=x.pt")
    tiny_run("--max_iters=4", out)
    # a finished run, another model
    with pytest.raises(
        RunError, match=r"results.json was made with other values of n_head, n_kv_head, n_embd"
    ):
        tiny_run("--max_iters=4", out, "--n_embd=64", "--n_head=4", "--n_kv_head=4")
    with pytest.raises(RunError, match=r"other values of arch"):
        tiny_run("--max_iters=4", out, "--arch=lstm")
    with pytest.raises(ConfigError, match="max_iters = 2 is below the 4 steps"):
        tiny_run("--max_iters=2", out, "--init_from=resume")


def test_the_curriculum_bounds_the_lengths_and_widens_them_once_the_loss_is_low(tmp_path):
    from studies.s5_retrieval import train_batch
    s5 = S5Config(train_min_n=1, train_max_n=6, curriculum_start=2)
    assert s5.curriculum() == {"start": 2, "threshold": 0.3} and S5Config().curriculum() is None
    for max_n in (2, 4):
        lengths = set()
        for step in range(60):
            _, _, control = train_batch(s5, seed=0, step=step, batch_size=8, device="cpu", max_n=max_n)
            lengths |= set(((control == 2).sum(dim=1) // 5).tolist())
        assert lengths == set(range(1, max_n + 1))
    # a threshold no loss reaches keeps the length at the start; without a curriculum no length is logged
    stays = tiny_run("--max_iters=4", "--curriculum_start=1", "--curriculum_threshold=1e-9",
                     f"--out_dir={tmp_path / 'never'}")
    assert [r["max_n"] for r in stays["curve"]] == [1, 1, 1, 1] and stays["curriculum_lengths"] == {}
    assert "max_n" not in tiny_run("--max_iters=1", f"--out_dir={tmp_path / 'off'}")["curve"][0]


def test_the_at_length_draw_composes_the_curriculums_length_in_every_example():
    """curriculum_draw='at_length': every example of a batch has n = L actions (uniform draws all of
    1..L); the draw needs a curriculum and is one of two names."""
    from studies.s5_retrieval import train_batch
    s5 = S5Config(train_min_n=1, train_max_n=6, curriculum_start=2, curriculum_draw="at_length")
    for max_n in (2, 5):
        _, _, control = train_batch(s5, seed=0, step=3, batch_size=16, device="cpu", max_n=max_n)
        assert ((control == 2).sum(dim=1) // 5).tolist() == [max_n] * 16
    with pytest.raises(ValueError, match="curriculum_draw 'every' is not one of 'uniform', 'at_length'"):
        S5Config(curriculum_start=1, curriculum_draw="every")
    with pytest.raises(ValueError, match="needs a curriculum: set curriculum_start >= 1"):
        S5Config(curriculum_draw="at_length")


def test_the_state_loss_is_the_cross_entropy_of_the_state_tokens_alone():
    """state_loss against a loop over each example's state positions, read off the format: the prompt
    ((1 + value_len)·n + 1 tokens, whose keys are permutation tokens too), then a state every 1 + value_len."""
    import torch.nn.functional as F
    from studies.s5_retrieval import state_loss
    rng = random.Random(3)
    examples = [make_example(n, rng, value_len=2) for n in (1, 3, 2)]
    idx, targets, control = make_batch(examples)
    logits = torch.randn(*idx.shape, len(TOKENIZER.vocab), generator=torch.Generator().manual_seed(0))
    terms = []
    for b, (inputs, _, _) in enumerate(examples):
        n = (len(inputs) - 1) // 6
        prompt = 3 * n + 1
        terms += [F.cross_entropy(logits[b, t], targets[b, t]) for t in range(prompt, prompt + 3 * n, 3)]
    assert len(terms) == 6
    torch.testing.assert_close(state_loss(logits, targets, control), torch.stack(terms).mean())


def test_a_curriculum_on_the_states_reads_their_loss_alone(tmp_path):
    """curriculum_loss='states': the curriculum's loss mean after one step is the state tokens' loss of
    step 0's batch under the initial model, not the loss over every labelled token; the option needs a
    curriculum and is one of two names."""
    from configurator import load_config
    from model import GPTConfig
    from studies.s5_retrieval import build_model, state_loss, train_batch
    from support.checkpoints import load_checkpoint
    from train import TrainConfig
    args = ["--max_iters=1", "--curriculum_start=1", "--curriculum_threshold=1e-9", "--curriculum_loss=states",
            f"--out_dir={tmp_path / 'states'}"]
    run = tiny_run(*args)
    model_cfg, cfg, s5 = load_config([*TINY_RUN, *args], GPTConfig, TrainConfig, S5Config)[0]
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg, s5)
    idx, targets, control = train_batch(s5, cfg.seed, 0, cfg.batch_size, "cpu", max_n=1)
    with torch.no_grad():
        logits, loss = model(idx, targets, control=control, mode=cfg.train_mode)
    mean = load_checkpoint(str(tmp_path / "states" / "ckpt.pt"))["state"]["loss_mean"]
    assert mean == pytest.approx(state_loss(logits, targets, control).item(), rel=1e-5)
    assert run["curve"][0]["loss"] == pytest.approx(loss.item(), rel=1e-5)
    assert abs(mean - loss.item()) > 0.1
    with pytest.raises(ValueError, match="curriculum_loss 'codes' is not one of 'all', 'states'"):
        S5Config(curriculum_start=1, curriculum_loss="codes")
    with pytest.raises(ValueError, match="curriculum_loss 'states' needs a curriculum"):
        S5Config(curriculum_loss="states")


def test_a_curriculum_run_resumes_to_the_uninterrupted_one(tmp_path):
    """The curriculum's length and loss mean travel in the checkpoint: stopped at step 2 and resumed, the
    same lengths, losses and weights as 4 steps at once."""
    widen = ["--curriculum_start=1", "--curriculum_threshold=100"]
    whole = tiny_run("--max_iters=4", *widen, f"--out_dir={tmp_path / 'whole'}")
    assert [r["max_n"] for r in whole["curve"]] == [1, 2, 3, 3]            # train_max_n = 3
    assert whole["curriculum_lengths"] == {"2": 1, "3": 2}
    tiny_run("--max_iters=2", *widen, f"--out_dir={tmp_path / 'split'}")
    split = tiny_run("--max_iters=4", *widen, f"--out_dir={tmp_path / 'split'}", "--init_from=resume")
    assert split["curve"] == whole["curve"] and split["curriculum_lengths"] == whole["curriculum_lengths"]
    a, b = (torch.load(tmp_path / d / "ckpt.pt", weights_only=True)["model"] for d in ("whole", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_saved_before_the_curriculum_existed_resumes(tmp_path):
    """Its s5_config lacks the curriculum's keys: read as their defaults (no curriculum), not refused."""
    whole = tiny_run("--max_iters=4", f"--out_dir={tmp_path / 'whole'}")
    tiny_run("--max_iters=2", f"--out_dir={tmp_path / 'old'}")
    path = tmp_path / "old" / "ckpt.pt"
    ckpt = torch.load(path, weights_only=True)
    ckpt["s5_config"] = {k: v for k, v in ckpt["s5_config"].items() if not k.startswith("curriculum")}
    torch.save(ckpt, path)
    resumed = tiny_run("--max_iters=4", f"--out_dir={tmp_path / 'old'}", "--init_from=resume")
    assert resumed["curve"] == whole["curve"] and resumed["per_n"] == whole["per_n"]


def test_evaluations_off_the_log_grid_get_their_own_rows(tmp_path):
    result = tiny_run("--max_iters=5", "--log_interval=2", "--eval_interval=3", f"--out_dir={tmp_path}")
    rows = {row["step"]: row for row in result["curve"]}
    assert sorted(rows) == [2, 3, 4, 5]
    assert "loss" in rows[2] and "token_acc@3" not in rows[2]
    assert "loss" not in rows[3] and "token_acc@3" in rows[3]              # the step-3 evaluation, at step 3
    assert "loss" in rows[5] and "token_acc@3" in rows[5]


def test_resume_continues_exactly(tmp_path):
    """Stopped at step 2 (on the schedule of 4 steps) and resumed: the same weights, losses and accuracies as
    an uninterrupted run of 4 steps; a finished run is returned as is; another model config is refused."""
    from support.runtime import RunError
    run = tiny_run
    whole = run("--max_iters=4", f"--out_dir={tmp_path / 'whole'}")
    run("--max_iters=2", f"--out_dir={tmp_path / 'split'}")
    split = run("--max_iters=4", f"--out_dir={tmp_path / 'split'}", "--init_from=resume")
    assert [r["loss"] for r in split["curve"]] == [r["loss"] for r in whole["curve"]]
    assert split["per_n"] == whole["per_n"]
    a, b = (torch.load(tmp_path / d / "ckpt.pt", weights_only=True)["model"] for d in ("whole", "split"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # finished: skipped
    assert run("--max_iters=4", f"--out_dir={tmp_path / 'split'}")["curve"] == split["curve"]
    with pytest.raises(RunError, match="n_embd"):
        run(
            "--max_iters=6",
            f"--out_dir={tmp_path / 'split'}",
            "--init_from=resume",
            "--n_embd=64",
            "--n_head=4",
            "--n_kv_head=4",
        )


def test_a_checkpoint_of_the_loop_before_support_loop_resumes_exactly(tmp_path):
    """The study's checkpoints before it trained through support/loop.py kept the step in ckpt["state"] and
    held no scaler or RNG states: one rewritten that way resumes to the uninterrupted run."""
    whole = tiny_run("--max_iters=4", f"--out_dir={tmp_path / 'whole'}")
    tiny_run("--max_iters=2", f"--out_dir={tmp_path / 'old'}")
    path = tmp_path / "old" / "ckpt.pt"
    ckpt = torch.load(path, weights_only=True)
    old = {k: v for k, v in ckpt.items() if k not in ("step", "rng", "scaler")}
    torch.save(old | {"state": {"step": ckpt["step"], **ckpt["state"]}}, path)
    resumed = tiny_run("--max_iters=4", f"--out_dir={tmp_path / 'old'}", "--init_from=resume")
    assert resumed["curve"] == whole["curve"] and resumed["per_n"] == whole["per_n"]


def test_plot_writes_the_figure_and_the_curves(tmp_path):
    pytest.importorskip("matplotlib")
    from studies.s5_retrieval import plot
    fake = lambda acc: {
        "params": 1_000_000,
        "per_n": {str(n): {"seq_acc": acc / n, "token_acc": acc} for n in range(1, 5)},
        "curve": [
            {"step": 10, "loss": 2.0, "token_acc@2": 0.1, "token_acc@4": 0.05},
            {"step": 20, "loss": 1.0, "token_acc@2": acc, "token_acc@4": acc / 2},
        ],
        "model_config": {"n_layer": 2},
        "s5_config": {"train_max_n": 2},
    }
    plot({"T²MLR": fake(0.9), "LSTM": fake(0.3)}, str(tmp_path / "s5.png"))
    for name in ("s5.png", "s5_curves.png"):
        assert (tmp_path / name).stat().st_size > 10_000


@pytest.mark.parametrize("args, message", [
    (["--train_max_n=0"], r"train_max_n = 0 must be >= 1"),
    (["--train_min_n=5", "--train_max_n=3"], r"need train_min_n <= train_max_n"),
    (["--arch=gru"], r"arch 'gru' is not one of 'gpt', 'lstm'"),
    (["--test_max_n=30"], r"block_size = 256 is shorter than the longest example, 301 tokens at n = 30"),
    (["--vocab_size=100"], r"vocab_size = 100 is smaller than the S5 vocabulary, 188"),
    (["--curriculum_start=13"], r"curriculum_start = 13 is outside \[train_min_n, train_max_n\] = \[1, 12\]"),
    (["--curriculum_threshold=0"], r"curriculum_threshold = 0(\.0)? must be > 0"),
])
def test_bad_input_is_one_error_line(tmp_path, args, message):
    result = subprocess.run(
        [sys.executable, "-m", "studies.s5_retrieval", "config/s5_tiny_t2mlr.py", f"--out_dir={tmp_path}/run", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "run").exists()                          # nothing written


@pytest.mark.parametrize(
    "args, message",
    [
        ([], r"give a config file \(e\.g\. config/s5_tiny_t2mlr\.py\), --quick or --compare"),
        (
            ["--compare", "config/s5_tiny_lstm.py"],
            r"--compare takes --key=value overrides only, not a config file",
        ),
        (["--quick", "config/s5_tiny_lstm.py"], r"--quick takes --key=value overrides only"),
    ],
)
def test_modes_refuse_what_they_would_silently_ignore(args, message):
    result = subprocess.run(
        [sys.executable, "-m", "studies.s5_retrieval", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and re.search(message, lines[0]), result.stderr


def test_sample_and_resume_refuse_an_s5_checkpoint_in_one_line(tmp_path):
    tiny_run("--max_iters=2", f"--out_dir={tmp_path / 's5'}")
    for cmd in (["sample.py", f"--out_dir={tmp_path / 's5'}"],):
        result = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=60)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and lines[-1].endswith(
            "names no tokenizer: it is not a checkpoint of train.py"
        ), result.stderr


def test_train_mode_and_gate_lr_multiplier_reach_the_study(tmp_path):
    """--gate_lr_multiplier=100 moves θ_r a hundred times as far in Adam's first step (lr · sign); with the
    gate so opened, --train_mode=exact trains on the exact recurrence, another loss than Jacobi at D = 4 < T;
    the curve logs θ_r; a run is continued only with its own train_mode and gate_lr_multiplier."""
    from support.runtime import RunError
    runs = {name: tiny_run("--max_iters=4", f"--out_dir={tmp_path / name}", *extra) for name, extra in (
        ("exact", ["--train_mode=exact"]), ("boosted", ["--train_mode=exact", "--gate_lr_multiplier=100"]),
        ("jacobi boosted", ["--gate_lr_multiplier=100"]))}
    first = {name: r["curve"][0]["theta_r"] for name, r in runs.items()}
    assert abs(first["exact"]) == pytest.approx(5e-4, rel=1e-3)           # lr at step 0: 1e-3 · 1/2 (warmup)
    assert first["boosted"] == pytest.approx(100 * first["exact"], rel=1e-3)
    assert runs["exact"]["theta_r"] == runs["exact"]["curve"][-1]["theta_r"]
    losses = {name: [row["loss"] for row in r["curve"] if "loss" in row] for name, r in runs.items()}
    assert losses["boosted"][0] == pytest.approx(losses["jacobi boosted"][0], rel=1e-5)   # θ = 0 at step 0
    assert abs(losses["boosted"][-1] - losses["jacobi boosted"][-1]) > 1e-4, losses
    with pytest.raises(RunError, match="other values of train_mode"):
        tiny_run("--max_iters=6", f"--out_dir={tmp_path / 'boosted'}", "--init_from=resume",
                 "--gate_lr_multiplier=100")
    with pytest.raises(RunError, match="other values of gate_lr_multiplier"):
        tiny_run("--max_iters=4", f"--out_dir={tmp_path / 'exact'}", "--train_mode=exact", "--gate_lr_multiplier=2")


def test_rerun_probes_every_arm_and_continues_the_widest_open_gate(tmp_path):
    """studies.s5_retrieval.rerun: every arm to the probe step on the full schedule, the exact arm with the
    largest |θ_r| continued to the full step count, θ_r curves and accuracies in the JSON."""
    from studies.s5_retrieval import rerun
    small = [a for a in TINY_RUN[1:] if not a.startswith(("--lr_decay_iters", "--eval_interval"))] + ["--eval_interval=2"]
    arms = {"jacobi": ["config/s5_tiny_t2mlr.py"], "exact": ["config/s5_tiny_t2mlr_exact.py"],
            "exact, gate lr x10": ["config/s5_tiny_t2mlr_exact.py", "--gate_lr_multiplier=10"]}
    path = tmp_path / "rerun.json"
    out = rerun(small, str(tmp_path / "runs"), str(path), arms=arms, probe_steps=2, full_steps=4, log=lambda *_: None)
    assert json.loads(path.read_text()) == out
    assert out["continued"] == ["exact, gate lr x10"]            # m = 10: θ_r's steps are 10x as long
    steps = {name: r["steps"] for name, r in out["arms"].items()}
    assert steps == {"jacobi": 2, "exact": 2, "exact, gate lr x10": 4}
    arm = out["arms"]["exact, gate lr x10"]
    assert [s for s, _ in arm["theta_r_curve"]] == [1, 2, 3, 4] and arm["theta_r"] == arm["theta_r_curve"][-1][1]
    assert {"state_acc@3", "code_acc@3"} <= arm.keys() and out["earlier"]["theta_r"] == -0.018
    again = rerun(small, str(tmp_path / "runs"), str(path), arms=arms, probe_steps=2, full_steps=4,
                  log=lambda *_: None)                  # finished arms reused, the continued one as it is
    assert again == out
