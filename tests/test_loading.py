"""
Loading checkpoints and sampling from them (CPU, under a minute): every loader (resume, --init_from=x.pt,
sample.py, probe.py) reads state dicts saved by wrapped models (`_orig_mod.`, `module.` prefixes) and maps
tied / untied embeddings exactly or refuses in one line; sample.py at block_size 1..4 and extreme
temperatures. Trainings run in-process (train.main), a few steps of a tiny model each.

    python -m pytest -q tests/test_loading.py
"""

import dataclasses

import pytest
import torch

import sample
import train
from model import GPT, GPTConfig
from test_train import TINY, read_log, run, write_dataset
from support.checkpoints import clean_state_dict, init_weights_from, load_checkpoint, load_model, save_checkpoint
from support.runtime import RunError
from train import TrainConfig

LLAMA = dict(flavour="llama", vocab_size=320, block_size=16, n_layer=3, n_embd=32, n_head=2, mlp_hidden=48)


def write_checkpoint(path, model, prefix="", drop=()):
    """A train.py-style checkpoint of `model` (byte tokenizer), its state-dict keys prefixed with `prefix`,
    without the keys in `drop`."""
    state = {prefix + k: v for k, v in model.state_dict().items() if k not in drop}
    save_checkpoint(str(path), {"model": state, "model_config": dataclasses.asdict(model.cfg),
                                "train_config": dataclasses.asdict(TrainConfig()), "tokenizer": "byte",
                                "step": 0, "val_loss": 0.0})
    return str(path)


def built(seed=0, **fields):
    torch.manual_seed(seed)
    return GPT(GPTConfig(**fields)).eval()


def tied(model):
    return model.lm_head.weight is model.wte.weight


def train_tiny(tmp_path, name, *args):
    """Train TINY for 2 steps in-process on the fox data; returns the checkpoint path."""
    data = tmp_path / "data" / "fox"
    if not (data / "meta.json").exists():
        write_dataset(data)
    train.main([*TINY, f"--data_dir={data}", "--max_iters=2", f"--out_dir={tmp_path / name}", *args])
    return tmp_path / name / "ckpt.pt"


# -----------------------------------------------------------------------------
# Wrapped-model prefixes: one clean_state_dict (in load_checkpoint) for every loader

@pytest.mark.parametrize("prefix", ["_orig_mod.", "module.", "module._orig_mod."])
def test_every_loader_strips_wrapper_prefixes(tmp_path, prefix):
    source = built(**LLAMA)
    path = write_checkpoint(tmp_path / "ckpt.pt", source, prefix)
    assert all(k.startswith(prefix) for k in torch.load(path, weights_only=True)["model"])
    assert list(load_checkpoint(path)["model"]) == list(source.state_dict())
    loaded, _ = load_model(path)                                   # sample.py, probe.py
    target = built(seed=1, **LLAMA)
    init_weights_from(target, path)                                # --init_from=x.pt
    for model in (loaded, target):
        for k, v in source.state_dict().items():
            assert torch.equal(model.state_dict()[k], v), k
        assert tied(model)


def test_duplicate_keys_after_stripping_are_refused():
    with pytest.raises(RunError, match=r"x\.pt holds wte\.weight twice \(once as module\.wte\.weight\)"):
        clean_state_dict({"wte.weight": torch.zeros(1), "module.wte.weight": torch.zeros(1)}, "x.pt")


# -----------------------------------------------------------------------------
# Tied embeddings: one tensor, mapped exactly or refused in one line

def test_untied_source_into_tied_target_is_refused_or_exact(tmp_path):
    """An untied model's own head cannot live in a tied model's one tensor: a one-line error naming the flag.
    If its head equals its embedding, the mapping is exact: the first logits equal the source's."""
    source = built(**dict(LLAMA, tie_embeddings=False))
    assert not torch.equal(source.lm_head.weight, source.wte.weight)
    target = built(seed=1, **dict(LLAMA, t2mlr=True, l_start=1, l_end=1))
    with pytest.raises(
        RunError,
        match=r"lm_head\.weight that differs from its token embedding wte\.weight .* "
        r"ties them \(tie_embeddings=True\) .*: set --tie_embeddings=False$",
    ):
        init_weights_from(target, write_checkpoint(tmp_path / "untied.pt", source))
    with torch.no_grad():
        source.lm_head.weight.copy_(source.wte.weight)
    init_weights_from(target, write_checkpoint(tmp_path / "equal.pt", source))
    idx = torch.randint(0, 320, (2, 16))
    assert tied(target) and torch.equal(target(idx, mode="jacobi")[0], source(idx)[0])   # the same operations


@pytest.mark.parametrize("drop", [(), ("lm_head.weight",)], ids=["both_keys", "no_head_key"])
def test_tied_source_into_untied_target_is_exact(tmp_path, drop):
    """A tied source maps exactly into an untied model (the head gets wte's values), also from a checkpoint
    that stores the shared tensor once (no lm_head.weight); an untied model keeps two tensors."""
    source = built(**LLAMA)
    assert tied(source)
    path = write_checkpoint(tmp_path / "tied.pt", source, drop=drop)
    idx = torch.randint(0, 320, (2, 16))
    for fields in (dict(LLAMA, tie_embeddings=False), dict(LLAMA, tie_embeddings=False, t2mlr=True), LLAMA):
        target = built(seed=1, **fields)
        init_weights_from(target, path)
        assert tied(target) == fields.get("tie_embeddings", True)
        assert torch.equal(target.lm_head.weight, source.wte.weight)
        assert torch.equal(target(idx, mode="jacobi")[0], source(idx)[0])     # T²MLR: the same operations
    loaded, _ = load_model(path)
    assert tied(loaded) and torch.equal(loaded(idx)[0], source(idx)[0])


def test_retrofit_of_an_untied_run_names_the_flag(tmp_path):
    """The case: train a llama model with --tie_embeddings=False, then start a (tied) T²MLR model from
    it. One-line RunError naming the flag; with --tie_embeddings=False the retrofit's first val loss equals
    the source's final one (the gate starts as an identity)."""
    llama = ["--flavour=llama", "--mlp_hidden=64"]
    source = train_tiny(tmp_path, "llama", *llama, "--tie_embeddings=False")
    retrofit = [
        *llama,
        "--t2mlr=True",
        "--l_start=0",
        "--l_end=0",
        "--jacobi_sweeps=2",
        "--jacobi_grad_sweeps=1",
        f"--init_from={source}",
    ]
    with pytest.raises(RunError, match=r"set --tie_embeddings=False$"):
        train_tiny(tmp_path, "t2mlr_tied", *retrofit)
    assert not (tmp_path / "t2mlr_tied").exists()                   # refused before writing anything
    target = train_tiny(tmp_path, "t2mlr_untied", *retrofit, "--tie_embeddings=False")
    first_val = [r["val_loss"] for r in read_log(target.parent) if r["step"] == 0 and "val_loss" in r]
    assert first_val == [pytest.approx(load_checkpoint(str(source))["val_loss"], abs=1e-6)]


def test_the_tie_survives_load_model_resume_and_retrofit(tmp_path):
    """`lm_head.weight is wte.weight` after load_model and init_weights_from; after a resumed tied run the
    saved state dict still holds one storage for both names (a broken tie would have saved two)."""
    source = built(**LLAMA)
    path = write_checkpoint(tmp_path / "tied.pt", source)
    assert tied(load_model(path)[0])
    target = built(seed=1, **dict(LLAMA, t2mlr=True))
    init_weights_from(target, path)
    assert tied(target)
    ckpt = train_tiny(tmp_path, "run", "--flavour=llama", "--mlp_hidden=64")
    train.main([f"--out_dir={tmp_path / 'run'}", "--init_from=resume", "--max_iters=4"])
    state = load_checkpoint(str(ckpt))["model"]
    assert load_checkpoint(str(ckpt))["step"] == 4
    assert state["lm_head.weight"].data_ptr() == state["wte.weight"].data_ptr()


# -----------------------------------------------------------------------------
# sample.py at the edges

def greedy_by_full_recompute(model, ids, n):
    """Each step: the model without cache on the last block_size tokens, argmax."""
    idx = torch.tensor([ids])
    for _ in range(n):
        logits, _ = model(idx[:, -model.cfg.block_size:])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx[0].tolist()


@pytest.mark.parametrize("block_size", [1, 2, 3, 4])
def test_sample_greedy_at_tiny_block_sizes(tmp_path, capsys, block_size):
    """sample.py --temperature=0 prints the greedy continuation computed by full recompute over the last
    block_size tokens, block_size 1 included."""
    model = built(**dict(LLAMA, block_size=block_size, vocab_size=257))
    write_checkpoint(tmp_path / "ckpt.pt", model)
    capsys.readouterr()
    sample.main([f"--out_dir={tmp_path}", "--device=cpu", "--temperature=0", "--num_samples=1",
                 "--max_new_tokens=10", "--start=ab"])
    printed = capsys.readouterr().out.split("\n" + "-" * 80)[0]
    prompt = list(b"ab")[-block_size:]
    expected = bytes(greedy_by_full_recompute(model, prompt, 10)).decode("utf-8", errors="replace")
    assert printed == expected


def test_sample_tiny_temperature_equals_greedy(tmp_path):
    """sample.py --temperature=1e-39 used to crash ("probability tensor contains inf/nan"); it prints what
    --temperature=0 prints."""
    write_checkpoint(tmp_path / "ckpt.pt", built(**LLAMA))
    outs = [run("sample.py", f"--out_dir={tmp_path}", "--device=cpu", f"--temperature={t}", "--num_samples=2",
                "--max_new_tokens=24", "--start=x", cwd=tmp_path) for t in ("1e-39", "0")]
    assert outs[0].returncode == 0, outs[0].stderr
    assert outs[0].stdout == outs[1].stdout and outs[0].stdout.startswith("x")
