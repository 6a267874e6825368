"""
S5-Retrieval: the state-tracking task of the T²MLR paper (§3.1), from data generator to figure.

Five cups start in the order 12345. The prompt is a dictionary that maps permutations of the five cups
(elements of the group S5, written as atomic tokens like <A_42351>) to random 4-character codes, then `|`,
then n permutations ("actions"), each followed by 4 blank spaces. At each action the model must output
the cups' order after applying all actions so far (the state) and, on the 4 blanks, the code that the
dictionary gives for that action. Composing permutations of S5 (a non-solvable group) is NC¹-complete,
believed beyond the constant-depth threshold circuits (TC⁰) that a fixed-depth transformer computes in
one pass; the constructions that do exist compose pairs of actions per layer, like a parallel prefix, so
an L-layer transformer covers about 2^L actions. A recurrent state, as T²MLR carries from token to token,
needs one step per action; an LSTM also tracks state, but must squeeze the whole dictionary into its
fixed-size state to do the retrieval.

    python -m studies.s5_retrieval config/s5_tiny_t2mlr.py    # train + evaluate one (out/s5/s5_tiny_t2mlr)
    python -m studies.s5_retrieval config/s5_tiny_t2mlr.py --init_from=resume   # continue it (same config)
    python -m studies.s5_retrieval --compare                  # three models, out/s5/s5_retrieval.{json,png}
    python -m studies.s5_retrieval --quick                    # a one-minute smoke run
    python -m studies.s5_retrieval --rerun                    # setting A again: exact states, init, gate LR
    python -m studies.s5_retrieval config/s5_t2mlr.py         # the paper's settings (a GPU; 400k steps)

Format (the T²MLR code's generator): input = `<A_key>v1v2v3v4` for every dictionary entry, `|`, then
`<A_act>␣␣␣␣` per action; target = the same dictionary and `|`, then `<A_state>` and the action key's code
per action. Labels are not shifted: logits[t] predict target[t]. control = 1 (non-recurrent) on the
dictionary and `|`, 2 (recurrent) on the actions and their blanks. Sequence length (2 + 2·value_len)·n + 1.
"""

import itertools
import json
import os
import random
import re
import string
import sys
import time
from dataclasses import asdict, dataclass

import torch

from configurator import ConfigError, load_config
from model import GPT, GPTConfig
from studies.common import LSTMLM, advance_curriculum, curriculum_length, gate_values, read_json, write_json
from studies.common import lstm_hidden_for  # noqa: F401  (the S5 configs' LSTM width, imported from here)
from support.checkpoints import load_checkpoint, rng_states
from support.compat import upgrade_config
from support.config import check_settings
from support.loop import evaluation_due, make_trainer, optimizer_step, resume, save_state, saved_step
from support.process import keeps_process_state
from support.runtime import RunError, autocast_context, resolve_device, resolve_dtype
from train import TrainConfig


# -----------------------------------------------------------------------------
# The group S5 and the data generator

PERMUTATIONS = list(itertools.permutations((1, 2, 3, 4, 5)))      # all 120, in lexicographic order
IDENTITY = (1, 2, 3, 4, 5)
CODE_SYMBOLS = string.ascii_letters + string.digits                # 62 symbols for the dictionary's values


def perm_token(p) -> str:
    """(4, 2, 3, 5, 1) -> '<A_42351>', the one-line notation as one atomic token."""
    return "<A_" + "".join(map(str, p)) + ">"


def apply_action(state, action):
    """The state after an action: new[i] = old[action[i] - 1] (cup positions, 1-based)."""
    return tuple(state[a - 1] for a in action)


def format_example(dictionary, actions):
    """Serialise one example. dictionary: [(permutation, code), ...] in prompt order; actions: [permutation].
    Returns (input tokens, target tokens, control flow), three lists of equal
    length (2 + 2·value_len)·n + 1."""
    codes = dict(dictionary)
    value_len = len(dictionary[0][1])
    prompt = [tok for key, code in dictionary for tok in (perm_token(key), *code)] + ["|"]
    inputs, targets, state = list(prompt), list(prompt), IDENTITY
    for action in actions:
        state = apply_action(state, action)
        inputs += [perm_token(action)] + [" "] * value_len
        targets += [perm_token(state), *codes[action]]
    control = [1] * len(prompt) + [2] * (len(inputs) - len(prompt))
    return inputs, targets, control


def make_example(n: int, rng: random.Random, value_len: int = 4):
    """One example with n actions drawn i.i.d. uniformly from S5 and a dictionary of n keys: the distinct
    actions plus random distractor permutations, shuffled, each with a random code of value_len symbols."""
    actions = [rng.choice(PERMUTATIONS) for _ in range(n)]
    keys = list(dict.fromkeys(actions))                            # distinct actions, first-seen order
    while len(keys) < n:
        p = rng.choice(PERMUTATIONS)
        if p not in keys:
            keys.append(p)
    rng.shuffle(keys)
    dictionary = [(k, "".join(rng.choice(CODE_SYMBOLS) for _ in range(value_len))) for k in keys]
    return format_example(dictionary, actions)


class S5Tokenizer:
    """The T²MLR code's character tokenizer, 188 ids: <pad> <unk> <bos> <eos> (0-3), 52 letters (4-55),
    10 digits (56-65), space (66), '|' (67), then the 120 permutation tokens in lexicographic order (68-187).
    """

    def __init__(self):
        self.vocab = (["<pad>", "<unk>", "<bos>", "<eos>"] + list(string.ascii_letters) + list(string.digits)
                      + [" ", "|"] + [perm_token(p) for p in PERMUTATIONS])
        self.ids = {tok: i for i, tok in enumerate(self.vocab)}
        self.pad = 0

    def split(self, text: str):
        """'<A_12345>ab |' -> ['<A_12345>', 'a', 'b', ' ', '|']."""
        return re.findall(r"<A_\d{5}>|.", text, flags=re.S)

    def encode(self, tokens):
        """A string or a list of token strings -> ids. Raises ValueError naming a token
        outside the vocabulary."""
        tokens = self.split(tokens) if isinstance(tokens, str) else tokens
        missing = [t for t in tokens if t not in self.ids]
        if missing:
            raise ValueError(
                f"token {missing[0]!r} is not in the S5 vocabulary (letters, digits, ' ', '|', <A_abcde>)"
            )
        return [self.ids[t] for t in tokens]

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)


TOKENIZER = S5Tokenizer()


def make_batch(examples, device="cpu"):
    """Right-pad a list of (inputs, targets, control) to one (B, T) batch: idx (pad id 0), targets (-1 = no
    label, the ignore index of GPT.forward) and control (0 = padding)."""
    T = max(len(inputs) for inputs, _, _ in examples)
    idx = torch.full((len(examples), T), TOKENIZER.pad, dtype=torch.long)
    targets = torch.full((len(examples), T), -1, dtype=torch.long)
    control = torch.zeros((len(examples), T), dtype=torch.long)
    for i, (inputs, target, flow) in enumerate(examples):
        idx[i, :len(inputs)] = torch.tensor(TOKENIZER.encode(inputs))
        targets[i, :len(target)] = torch.tensor(TOKENIZER.encode(target))
        control[i, :len(flow)] = torch.tensor(flow)
    return idx.to(device), targets.to(device), control.to(device)


# -----------------------------------------------------------------------------
# Configuration: GPTConfig (model.py) and TrainConfig (train.py: optimizer, schedule, out_dir, seed,
# device) plus the task's own keys. TrainConfig's dataset, data_dir, total_batch_size, eval_iters, val_mode,
# compile, progress and peak_flops are not used here: batches are generated, one per step; init_from is
# 'scratch' or 'resume'.

@dataclass
class S5Config:
    arch: str = "gpt"                     # 'gpt' (model.py: T²MLR when t2mlr=True) or 'lstm'
    train_min_n: int = 1                  # training lengths n: uniform in [train_min_n, train_max_n]
    train_max_n: int = 12
    test_min_n: int = 1                   # evaluated at every n in [test_min_n, test_max_n]
    test_max_n: int = 24
    value_len: int = 4                    # characters per dictionary code
    eval_examples: int = 64               # test examples per n in the final evaluation (training: a quarter)
    lstm_layers: int = 4                  # the LSTM baseline (arch='lstm')
    lstm_hidden: int = 360                # the T²MLR code's sweep's width (the configs match parameters)
    curriculum_start: int = 0             # 0: n uniform in [train_min_n, train_max_n] from the first step;
    curriculum_threshold: float = 0.3     # else in [train_min_n, L], L from curriculum_start up to
                                          # train_max_n, one more once the loss mean < threshold
    curriculum_draw: str = "uniform"      # 'uniform': n in [train_min_n, L]; 'at_length': n = L (every
                                          # example composes L actions, as a word problem of length L)
    curriculum_loss: str = "all"          # the loss the curriculum's rule reads: 'all' labelled tokens, or
                                          # 'states' alone (a word problem's labels are all states)

    def curriculum(self):
        """The length curriculum over the number of actions (studies.common), or None."""
        if not self.curriculum_start:
            return None
        return {"start": self.curriculum_start, "threshold": self.curriculum_threshold}

    def __post_init__(self):
        if self.arch not in ("gpt", "lstm"):
            raise ValueError(f"arch {self.arch!r} is not one of 'gpt', 'lstm'")
        if self.curriculum_draw not in ("uniform", "at_length"):
            raise ValueError(f"curriculum_draw {self.curriculum_draw!r} is not one of 'uniform', 'at_length'")
        if self.curriculum_loss not in ("all", "states"):
            raise ValueError(f"curriculum_loss {self.curriculum_loss!r} is not one of 'all', 'states'")
        for key, default in (("curriculum_draw", "uniform"), ("curriculum_loss", "all")):
            if getattr(self, key) != default and not self.curriculum_start:
                raise ValueError(f"{key} {getattr(self, key)!r} needs a curriculum: set curriculum_start >= 1")
        check_settings(
            self,
            {
                name: ">= 1"
                for name in (
                    "train_min_n",
                    "train_max_n",
                    "test_min_n",
                    "test_max_n",
                    "value_len",
                    "eval_examples",
                    "lstm_layers",
                    "lstm_hidden",
                )
            }
            | {"curriculum_start": ">= 0", "curriculum_threshold": "> 0"},
        )
        if self.curriculum_start and not self.train_min_n <= self.curriculum_start <= self.train_max_n:
            raise ValueError(f"curriculum_start = {self.curriculum_start} is outside [train_min_n, train_max_n] = "
                             f"[{self.train_min_n}, {self.train_max_n}] (0: no curriculum)")
        if self.train_min_n > self.train_max_n or self.test_min_n > self.test_max_n:
            raise ValueError(
                f"need train_min_n <= train_max_n and test_min_n <= test_max_n; got "
                f"[{self.train_min_n}, {self.train_max_n}] and [{self.test_min_n}, {self.test_max_n}]"
            )

    def max_len(self, n: int) -> int:
        """Tokens in an example with n actions: (2 + 2·value_len)·n + 1."""
        return (2 + 2 * self.value_len) * n + 1


def build_model(model_cfg: GPTConfig, s5: S5Config):
    return (
        GPT(model_cfg) if s5.arch == "gpt" else LSTMLM(model_cfg.vocab_size, s5.lstm_hidden, s5.lstm_layers)
    )


# -----------------------------------------------------------------------------
# Metrics, with the exact recurrence (eval() puts a T²MLR model in exact mode)

FIRST_PERM_ID = TOKENIZER.ids[perm_token(IDENTITY)]      # ids >= this are permutation tokens (68)


def score(logits, targets, control):
    """Per example counts, each a (B,) tensor, from logits (B, T, V) and targets, control (B, T):
    seq: 1 if every labelled position is right (the dictionary copy included), else 0;
    answers / answers_right: tokens of the recurrent segment (c >= 2: states and codes) and how many are
    right; states / states_right: the same for the state tokens alone (the permutation answers), codes = the
    rest."""
    labelled = targets != -1
    right = (logits.argmax(-1) == targets) & labelled
    answers = control >= 2
    states = answers & (targets >= FIRST_PERM_ID)
    return {"seq": (right | ~labelled).all(dim=1).long(),
            "answers": answers.sum(dim=1), "answers_right": (right & answers).sum(dim=1),
            "states": states.sum(dim=1), "states_right": (right & states).sum(dim=1)}


def state_loss(logits, targets, control):
    """The mean cross-entropy in nats over the state tokens alone (as score counts them) of a batch:
    logits (B, T, V), targets and control (B, T)."""
    states = (control >= 2) & (targets >= FIRST_PERM_ID)
    return torch.nn.functional.cross_entropy(logits[states].float(), targets[states])


@torch.no_grad()
def evaluate(model, s5: S5Config, n_values, examples_per_n: int, device, autocast, batch_size: int = 64):
    """{n: {"seq_acc", "token_acc", "state_acc", "code_acc"}} on fixed test examples (the same for every
    model: seeded by n alone). token_acc is over all answer tokens, state_acc over the state tokens,
    code_acc over the retrieved code characters."""
    was_training = model.training
    model.eval()
    results = {}
    for n in n_values:
        rng = random.Random(1_000_003 * n + 7)
        examples = [make_example(n, rng, s5.value_len) for _ in range(examples_per_n)]
        totals = {}
        for i in range(0, len(examples), batch_size):
            idx, targets, control = make_batch(examples[i:i + batch_size], device)
            with autocast:
                logits, _ = model(idx, control=control)
            for key, counts in score(logits, targets, control).items():
                totals[key] = totals.get(key, 0) + counts.sum().item()
        codes, codes_right = (
            totals["answers"] - totals["states"],
            totals["answers_right"] - totals["states_right"],
        )
        results[n] = {
            "seq_acc": totals["seq"] / len(examples),
            "token_acc": totals["answers_right"] / totals["answers"],
            "state_acc": totals["states_right"] / totals["states"],
            "code_acc": codes_right / codes,
        }
    model.train(was_training)
    return results


# -----------------------------------------------------------------------------
# Training: one generated batch per step, seeded by (seed, step), so every model sees the same data and a
# resumed run the same batches as an uninterrupted one

def train_batch(s5: S5Config, seed: int, step: int, batch_size: int, device, max_n=None):
    """The batch of training step `step`: batch_size examples with n uniform in [train_min_n, max_n]
    (default train_max_n; the curriculum's length under one), or n = max_n alone (curriculum_draw
    'at_length'), drawn from a generator seeded by (seed, step) alone. Returns make_batch's
    (idx, targets, control), (B, T)."""
    rng = random.Random(seed * 1_000_000_007 + step)
    max_n = max_n or s5.train_max_n
    min_n = max_n if s5.curriculum_draw == "at_length" else s5.train_min_n
    examples = [make_example(rng.randint(min_n, max_n), rng, s5.value_len) for _ in range(batch_size)]
    return make_batch(examples, device)


TRAINING_KEYS = ("train_mode", "gate_lr_multiplier")    # TrainConfig keys a run is only continued with


def check_same_run(saved, model_cfg: GPTConfig, s5: S5Config, path, cfg=None):
    """Raise RunError unless the checkpoint or results dict `saved` (read from `path`) was made with these
    model and task configs (and, given cfg, the same TRAINING_KEYS; saved before they existed: their
    defaults): a run is only ever continued or reused with its own settings. A model config saved under
    older key names is read under the new ones (support.compat)."""
    stored = {"model_config": upgrade_config(saved["model_config"]),    # saved before a key existed: its default
              "s5_config": {k: f.default for k, f in S5Config.__dataclass_fields__.items()} | saved["s5_config"]}
    differ = [k for config, key in ((model_cfg, "model_config"), (s5, "s5_config"))
              for k, v in asdict(config).items() if stored[key].get(k) != v]
    if cfg is not None:
        train_stored = saved.get("train_config", {})
        differ += [k for k in TRAINING_KEYS
                   if train_stored.get(k, TrainConfig.__dataclass_fields__[k].default) != getattr(cfg, k)]
    if differ:
        raise RunError(f"{path} was made with other values of {', '.join(differ)}: give that run's config, "
                       f"or another out_dir")


def train(model_cfg: GPTConfig, cfg: TrainConfig, s5: S5Config, log=print):
    """Train one model as configured and evaluate it at every n of the test range. Resumable: with
    init_from='resume' it continues out_dir/ckpt.pt; a finished run (out_dir/results.json) is not retrained.
    Give the run's config again to resume (a different model or task config is refused); a larger max_iters
    continues a finished run. Returns the results dict (also written to out_dir/results.json).
    The steps, the schedule, the checkpoints and the resume are train.py's (support/loop.py); the batches
    (train_batch), the evaluation (evaluate) and the curve are the task's."""
    results_path = os.path.join(cfg.out_dir, "results.json")
    ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
    if cfg.init_from not in ("scratch", "resume"):
        raise ConfigError(
            f"init_from {cfg.init_from!r}: s5_retrieval.py starts from 'scratch' or continues with 'resume'"
        )
    if os.path.exists(results_path):
        results = read_json(results_path)
        check_same_run(results, model_cfg, s5, results_path, cfg)
        # finished: skip (a longer max_iters continues it)
        if results["steps"] == cfg.max_iters:
            return results
    needed = s5.max_len(max(s5.train_max_n, s5.test_max_n))
    if s5.arch == "gpt" and model_cfg.block_size < needed:
        raise ConfigError(
            f"block_size = {model_cfg.block_size} is shorter than the longest example, "
            f"{needed} tokens at n = {max(s5.train_max_n, s5.test_max_n)}; set block_size >= {needed}"
        )
    if model_cfg.vocab_size < len(TOKENIZER.vocab):
        raise ConfigError(
            f"vocab_size = {model_cfg.vocab_size} is smaller than the S5 vocabulary, {len(TOKENIZER.vocab)}"
        )
    device = resolve_device(cfg.device)
    device_type = device.split(":")[0]
    dtype = resolve_dtype(cfg.dtype, device_type)
    autocast = autocast_context(device_type, dtype)
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg, s5).to(device)
    trainer = make_trainer(model, cfg, device, dtype, ckpt_path)
    start_step, state = 0, {"seconds": 0.0, "curve": []}     # state: the task's own progress
    if cfg.init_from == "resume":
        ckpt = load_checkpoint(ckpt_path)                           # RunError when there is none
        check_same_run(ckpt, model_cfg, s5, ckpt_path, cfg)
        if saved_step(ckpt) > cfg.max_iters:
            raise ConfigError(
                f"max_iters = {cfg.max_iters} is below the {saved_step(ckpt)} steps {ckpt_path} "
                f"has already trained; give max_iters >= {saved_step(ckpt)}"
            )
        start_step = resume(trainer, ckpt, ckpt_path)
        state = dict(ckpt["state"])                    # seconds, curve, and the curriculum's length
    elif os.path.exists(ckpt_path):
        raise RunError(f"{ckpt_path} exists: continue it with --init_from=resume, or choose another out_dir")
    os.makedirs(cfg.out_dir, exist_ok=True)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"{cfg.out_dir}: {s5.arch}{' (T²MLR)' if s5.arch == 'gpt' and model_cfg.t2mlr else ''}, "
        f"{n_params:,} parameters, steps {start_step}..{cfg.max_iters}")

    def checkpoint(step):
        save_state(trainer, step, [rng_states()], state=state, model_config=asdict(model_cfg),
                   train_config=asdict(cfg), s5_config=asdict(s5))

    losses = []                                        # the training losses since the last curve row
    # T²MLR trains by Jacobi sweeps (D) or the exact recurrence token by token (TrainConfig.train_mode)
    train_mode = cfg.train_mode if s5.arch == "gpt" and model_cfg.t2mlr else None
    curriculum = s5.curriculum()

    def train_step(step):
        """Step `step` on its generated batch; a curve row of the mean loss every log_interval updates."""
        max_n = curriculum_length(state, curriculum, s5.train_max_n)
        idx, targets, control = train_batch(s5, cfg.seed, step, cfg.batch_size, device, max_n)
        kept = {}

        def loss_of(model, _):
            kept["logits"], loss = model(idx, targets, control=control, mode=train_mode)
            return loss

        loss, _, lr = optimizer_step(trainer, step, 1, loss_of)
        losses.append(loss.item())
        done = state["steps_done"] = step + 1
        read = losses[-1] if s5.curriculum_loss == "all" else state_loss(kept["logits"].detach(), targets,
                                                                         control).item()
        advance_curriculum(state, curriculum, s5.train_max_n, read)
        if done % cfg.log_interval == 0 or done == cfg.max_iters:
            row = {"step": done, "loss": sum(losses) / len(losses), "lr": lr} | gate_values(model)
            state["curve"].append(row | ({"max_n": max_n} if curriculum else {}))
            losses.clear()

    def evaluate_and_save(step):
        """The accuracies at the longest training n and at twice it, in the curve, then the checkpoint."""
        probe_ns = sorted({s5.train_max_n, min(2 * s5.train_max_n, s5.test_max_n)})
        quick = evaluate(model, s5, probe_ns, max(1, s5.eval_examples // 4), device, autocast)
        if not state["curve"] or state["curve"][-1]["step"] != step:   # eval_interval off the log grid
            state["curve"].append({"step": step})
        state["curve"][-1].update({f"seq_acc@{n}": r["seq_acc"] for n, r in quick.items()}
                                  | {f"token_acc@{n}": r["token_acc"] for n, r in quick.items()})
        state["seconds"] = time.time() - t0
        row = state["curve"][-1]
        eta = state["seconds"] / max(step, 1) * (cfg.max_iters - step)
        log(f"step {step}: " + (f"loss {row['loss']:.4f}, " if "loss" in row else "") + ", ".join(
            f"n={n} seq {r['seq_acc']:.2f} tok {r['token_acc']:.3f}" for n, r in quick.items())
            + f", {state['seconds'] / 60:.1f} min, ETA {eta / 60:.1f} min")
        checkpoint(step)

    model.train()
    t0 = time.time() - state["seconds"]
    for step in range(start_step, cfg.max_iters + 1):    # the start step is taken as evaluated
        if evaluation_due(cfg, step, evaluated=start_step):
            evaluate_and_save(step)
        if step == cfg.max_iters:
            break
        train_step(step)
    train_seconds = state["seconds"] = time.time() - t0
    per_n = evaluate(model, s5, range(s5.test_min_n, s5.test_max_n + 1), s5.eval_examples, device, autocast)
    results = {
        "arch": s5.arch,
        "t2mlr": s5.arch == "gpt" and model_cfg.t2mlr,
        "params": n_params,
        "train_seconds": train_seconds,
        "steps": cfg.max_iters,
        **gate_values(model),
        "per_n": {str(n): r for n, r in per_n.items()},
        "curve": state["curve"],
        "curriculum_lengths": state.get("lengths", {}) if curriculum else None,
        "model_config": asdict(model_cfg),
        "train_config": asdict(cfg),
        "s5_config": asdict(s5),
    }
    checkpoint(cfg.max_iters)
    write_json(results_path, results)
    return results


# -----------------------------------------------------------------------------
# The comparison: three models, the same data, steps and schedule; one figure and one JSON

COMPARE = {"T²MLR": "config/s5_tiny_t2mlr.py", "transformer": "config/s5_tiny_transformer.py",
           "LSTM": "config/s5_tiny_lstm.py"}


def compare(overrides, root="out/s5"):
    """Train (or resume, or reuse when finished) every model of COMPARE with the same overrides into
    root/<config name>, then write the numbers and figures beside them: root/s5_retrieval.json, .png and
    _curves.png. Returns ({name: results}, [paths written])."""
    all_results = {}
    for i, (name, path) in enumerate(COMPARE.items()):
        out_dir = os.path.join(root, os.path.splitext(os.path.basename(path))[0])
        resume = ["--init_from=resume"] if os.path.exists(os.path.join(out_dir, "ckpt.pt")) else []
        (model_cfg, cfg, s5), _ = load_config(
            [path, *overrides, f"--out_dir={out_dir}", *resume], GPTConfig, TrainConfig, S5Config
        )
        print(f"[{i + 1}/{len(COMPARE)}] {name}")
        all_results[name] = train(model_cfg, cfg, s5)
    stem = os.path.join(root, "s5_retrieval")
    command = " ".join(
        ["python -m studies.s5_retrieval --compare", *overrides]
        + ([f"--out_dir={root}"] if root != "out/s5" else [])
    )
    with open(stem + ".json", "w") as f:
        json.dump({"command": command, "results": all_results}, f, indent=1)
    plot(all_results, stem + ".png")
    return all_results, [stem + ".json", stem + ".png", stem + "_curves.png"]


# -----------------------------------------------------------------------------
# The rerun of setting A: exact training states, and what opens the gate

RERUN_ARMS = {      # name: overrides; every arm on the same batches and the same 2,000-step schedule
    "jacobi D=16 (setting A)": ["config/s5_tiny_t2mlr.py"],
    "exact": ["config/s5_tiny_t2mlr_exact.py"],
    "exact, normal_0.02 init": ["config/s5_tiny_t2mlr_exact.py", "--weight_init=normal_0.02", "--embed_scale=False"],
    "exact, gate lr x10": ["config/s5_tiny_t2mlr_exact.py", "--gate_lr_multiplier=10"],
    "exact, normal_0.02 init, gate lr x10": ["config/s5_tiny_t2mlr_exact.py", "--weight_init=normal_0.02",
                                             "--embed_scale=False", "--gate_lr_multiplier=10"],
}
RERUN_PROBE, RERUN_FULL = 400, 2000     # every arm to RERUN_PROBE steps; two continue to RERUN_FULL
RERUN_COMBINED = "exact, normal_0.02 init, gate lr x10"   # the three changes together: always continued


def rerun(overrides, root="out/s5_rerun", results_path="studies/results/s5_rerun.json",
          arms=RERUN_ARMS, probe_steps=RERUN_PROBE, full_steps=RERUN_FULL, log=print):
    """Every arm of `arms` to probe_steps on the schedule of full_steps (lr_decay_iters = full_steps), into
    root/<arm>; then the exact arm whose |θ_r| is largest at probe_steps (the gate opened furthest) and the
    combined arm (RERUN_COMBINED: exact states, the T²MLR code's initialisation and a 10x gate LR, where it is
    an arm) continue to full_steps (resumed: the same run as if never stopped). Resumable at every stage (a stopped
    arm continues, a finished one is reused). Writes results_path: per arm its θ_r and loss curves, its
    state and code accuracy at the longest training n and at twice it, and setting A's earlier numbers
    (studies/results/s5_retrieval/s5_retrieval.json). Returns that dict."""
    def out_dir_of(name):
        return os.path.join(root, re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_"))

    def finished(name):                # the steps of an arm's finished run (0: none), e.g. continued already
        path = os.path.join(out_dir_of(name), "results.json")
        if not os.path.exists(path):
            return 0
        return read_json(path)["steps"]

    def run_arm(name, steps):
        out_dir = out_dir_of(name)
        resume = ["--init_from=resume"] if os.path.exists(os.path.join(out_dir, "ckpt.pt")) else []
        (model_cfg, cfg, s5), _ = load_config(
            [*arms[name], *overrides, f"--lr_decay_iters={full_steps}", f"--max_iters={steps}",
             f"--out_dir={out_dir}", *resume], GPTConfig, TrainConfig, S5Config)
        log(f"{name}: {steps} steps")
        return train(model_cfg, cfg, s5, log=log)

    results = {name: run_arm(name, max(probe_steps, finished(name))) for name in arms}

    def theta_at_probe(name):
        return next(row["theta_r"] for row in results[name]["curve"] if row["step"] == probe_steps)

    exact = [name for name in arms if name.startswith("exact")]
    best = max(exact, key=lambda name: abs(theta_at_probe(name)))
    continued = list(dict.fromkeys([best] + ([RERUN_COMBINED] if RERUN_COMBINED in arms else [])))
    for name in continued:
        results[name] = run_arm(name, full_steps)

    def summary(r):
        s5 = r["s5_config"]
        ns = sorted({s5["train_max_n"], min(2 * s5["train_max_n"], s5["test_max_n"])})
        return {"steps": r["steps"], "train_seconds": r["train_seconds"], "theta_r": r.get("theta_r"),
                "theta_x": r.get("theta_x"),
                **{f"{k}@{n}": r["per_n"][str(n)][k] for n in ns for k in ("state_acc", "code_acc", "token_acc")},
                "theta_r_curve": [[row["step"], row["theta_r"]] for row in r["curve"] if "theta_r" in row],
                "loss_curve": [[row["step"], row["loss"]] for row in r["curve"] if "loss" in row],
                "per_n": r["per_n"]}

    earlier = {}
    if os.path.exists("studies/results/s5_retrieval/s5_retrieval.json"):
        with open("studies/results/s5_retrieval/s5_retrieval.json") as f:
            old = json.load(f)["results"]["T²MLR"]
        earlier = {"source": "studies/results/s5_retrieval/s5_retrieval.json (setting A, Jacobi D = 16, 2,000 steps); θ_r from "
                             "studies/s5_retrieval.md", "theta_r": -0.018,
                   **{f"{k}@{n}": old["per_n"][str(n)][k] for n in (12, 24)
                      for k in ("state_acc", "code_acc", "token_acc")}}
    command = " ".join(["python -m studies.s5_retrieval --rerun", *overrides]
                       + ([f"--out_dir={root}"] if root != "out/s5_rerun" else []))
    out = {"command": command, "probe_steps": probe_steps, "full_steps": full_steps,
           "continued": continued,
           "rule": f"every arm to {probe_steps} steps on the {full_steps}-step schedule; the exact arm with "
                   f"the largest |θ_r| at {probe_steps} and {RERUN_COMBINED!r} continue to {full_steps}",
           "arms": {name: {"overrides": arms[name], **summary(r)} for name, r in results.items()},
           "earlier": earlier}
    os.makedirs(os.path.dirname(results_path) or ".", exist_ok=True)
    with open(results_path, "w") as f:
        json.dump(out, f, indent=1)
    return out


def plot(all_results, path):
    """Sequence accuracy and answer-token accuracy against n (the paper's two panels), plus the accuracy on
    the state tokens alone, one line per model; vertical lines at the transformer's depth bound 2^L and
    at the longest training n. The state panel's grey curve 1/n is what copying the first action (the
    first state) and nothing else scores."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = (("seq_acc", "sequence accuracy"), ("token_acc", "token accuracy (answers)"),
              ("state_acc", "state-token accuracy"))
    fig, axes = plt.subplots(3, 1, figsize=(7, 8), sharex=True)
    for name, r in all_results.items():
        ns = sorted(map(int, r["per_n"]))
        for ax, (key, _) in zip(axes, panels):
            if key in r["per_n"][str(ns[0])]:
                ax.plot(ns, [r["per_n"][str(n)][key] for n in ns], marker="o", ms=3,
                        label=f"{name} ({r['params'] / 1e6:.2f}M params)")
    ns = sorted(map(int, next(iter(all_results.values()))["per_n"]))
    axes[2].plot(ns, [1 / n for n in ns], color="grey", lw=1, label="1/n: the first state only")
    first = next(iter(all_results.values()))
    depth_bound, train_max = 2 ** first["model_config"]["n_layer"], first["s5_config"]["train_max_n"]
    for ax, (_, label) in zip(axes, panels):
        if depth_bound <= max(ns):
            ax.axvline(depth_bound, color="grey", ls="--", lw=1)
        ax.axvline(train_max, color="black", ls=":", lw=1)
        ax.set_ylabel(label)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=7)
    bound = (
        f"dashed 2^L = {depth_bound} (L = {first['model_config']['n_layer']} layers), "
        if depth_bound <= max(ns)
        else ""
    )
    axes[0].set_title(f"S5-Retrieval: {bound}dotted = longest training n ({train_max})", fontsize=9)
    axes[2].set_xlabel("n (actions)")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    plot_curves(all_results, path.replace(".png", "_curves.png"), plt)


def plot_curves(all_results, path, plt):
    """The learning curves: training loss and answer-token accuracy at the longest training n and at twice
    it (the quick evaluations during training) against the step, one line per model."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for i, (name, r) in enumerate(all_results.items()):
        color = f"C{i}"
        curve = r["curve"]
        axes[0].plot([row["step"] for row in curve], [row["loss"] for row in curve], color=color, label=name)
        for key, style in (
            (k, "-" if j == 0 else "--")
            for j, k in enumerate(
                sorted(
                    {k for row in curve for k in row if k.startswith("token_acc@")},
                    key=lambda k: int(k.split("@")[1]),
                )
            )
        ):
            rows = [row for row in curve if key in row]
            axes[1].plot([row["step"] for row in rows], [row[key] for row in rows], style, color=color,
                         label=f"{name}, n = {key.split('@')[1]}")
    axes[0].set(xlabel="step", ylabel="training loss (nats per labelled token)", yscale="log")
    axes[1].set(xlabel="step", ylabel="answer-token accuracy", ylim=(-0.02, 1.02))
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


QUICK = [
    "config/s5_tiny_t2mlr.py",
    "--max_iters=30",
    "--eval_interval=30",
    "--log_interval=10",
    "--train_max_n=4",
    "--test_max_n=6",
    "--eval_examples=8",
    "--out_dir=out/s5_quick",
    "--warmup_iters=3",
]


@keeps_process_state
def main(argv):
    """Raises ConfigError or RunError."""
    files = [a for a in argv if not a.startswith("--")]
    modes = [m for m in ("--compare", "--quick", "--rerun") if m in argv]
    if modes:
        if files:                       # they bring their own configs: a file would silently override them
            raise ConfigError(f"{modes[0]} takes --key=value overrides only, not a config file ({files[0]})")
    elif not files:
        raise ConfigError("give a config file (e.g. config/s5_tiny_t2mlr.py), --quick or --compare")
    if "--compare" in argv:
        rest = [a for a in argv if a != "--compare"]
        root = next((a.split("=", 1)[1] for a in rest if a.startswith("--out_dir=")), "out/s5")
        results, written = compare([a for a in rest if not a.startswith("--out_dir=")], root)
        print("wrote " + ", ".join(written))
        for name, r in results.items():
            print(f"{name}: {r['params']:,} params, {r['train_seconds'] / 60:.1f} min; " + ", ".join(
                f"n={n}: seq {r['per_n'][str(n)]['seq_acc']:.2f} tok {r['per_n'][str(n)]['token_acc']:.3f}"
                for n in sorted({int(r['s5_config']['train_max_n']), 2 * int(r['s5_config']['train_max_n'])})
                if str(n) in r["per_n"]))
        return
    if "--rerun" in argv:
        rest = [a for a in argv if a != "--rerun"]
        root = next((a.split("=", 1)[1] for a in rest if a.startswith("--out_dir=")), "out/s5_rerun")
        results_path = ("studies/results/s5_rerun.json" if root == "out/s5_rerun"
                        else os.path.join(root, "s5_rerun.json"))
        out = rerun([a for a in rest if not a.startswith("--out_dir=")], root, results_path)
        print(f"wrote {results_path}")
        for name, r in out["arms"].items():
            print(f"{name}: {r['steps']} steps, θ_r {r['theta_r']:+.4f}, "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r.items() if "@" in k))
        return
    if "--quick" in argv:
        argv = QUICK + [a for a in argv if a != "--quick"]
    (model_cfg, cfg, s5), _ = load_config(argv, GPTConfig, TrainConfig, S5Config)
    results = train(model_cfg, cfg, s5)
    for n, r in results["per_n"].items():
        print(f"n={n:>3}: sequence accuracy {r['seq_acc']:.3f}, token accuracy {r['token_acc']:.3f}")


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (ConfigError, RunError) as e:
        sys.exit(f"error: {e}")
