"""
What older versions of the repository wrote keeps working (support/compat.py): config keys renamed since
(state_mode -> state_passing, state_residual / state_detach -> recurrent_residual / recurrent_detach,
jacobi_iters / jacobi_grad_iters -> jacobi_sweeps / jacobi_grad_sweeps) and values renamed since (weight_init
'reference' -> 'normal_0.02', jacobi_init 'plain' -> 'ungated') are read under their new names from config files,
flags and stored checkpoints, and an old-format checkpoint gives the same logits.
"""

from dataclasses import asdict

import pytest
import torch

from configurator import load_config
from model import GPT, GPTConfig
from support.checkpoints import load_model, save_checkpoint
from support.compat import RENAMED_FIELDS, RENAMED_VALUES, upgrade_config

OLD = {new: old for old, new in RENAMED_FIELDS.items()}          # every new name has one old name
TINY = dict(vocab_size=64, block_size=32, n_embd=32, n_head=4)


def old_format(cfg: GPTConfig) -> dict:
    """cfg as a checkpoint written before the renames stored it: the old key names and values."""
    old_value = {(k, new): old for k, names in RENAMED_VALUES.items() for old, new in names.items()}
    return {OLD.get(k, k): old_value.get((k, v), v) for k, v in asdict(cfg).items()}


def test_upgrade_config_renames_every_old_key_and_keeps_values():
    stored = {"state_mode": "mesh", "state_residual": False, "state_detach": True, "jacobi_iters": 7,
              "jacobi_grad_iters": 2, "n_embd": 32}
    assert upgrade_config(stored) == {"state_passing": "mesh", "recurrent_residual": False,
                                      "recurrent_detach": True, "jacobi_sweeps": 7, "jacobi_grad_sweeps": 2,
                                      "n_embd": 32}
    assert upgrade_config({"state_mode": "base", "state_passing": "mesh"}) == {"state_passing": "mesh"}
    assert "state_mode" in stored                                  # the stored dict is not modified


def test_upgrade_config_renames_old_values_with_a_note():
    notes = []
    stored = {"weight_init": "reference", "jacobi_init": "plain", "flavour": "llama"}
    assert upgrade_config(stored, notes.append) == {"weight_init": "normal_0.02", "jacobi_init": "ungated",
                                                    "flavour": "llama"}
    assert notes == ["weight_init 'reference' is now called 'normal_0.02' (the same setting)",
                     "jacobi_init 'plain' is now called 'ungated' (the same setting)"]
    assert upgrade_config({"jacobi_init": "zero"}, notes.append) == {"jacobi_init": "zero"} and len(notes) == 2


@pytest.mark.parametrize("fields", [
    dict(TINY, layout="1+1R2+1", state_passing="anchor"),
    dict(TINY, flavour="llama", mlp_hidden=48, n_layer=4, t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=5,
         jacobi_grad_sweeps=2, recurrent_residual=False, recurrent_detach=True, weight_init="normal_0.02",
         jacobi_init="ungated"),
])
def test_old_format_checkpoint_loads_with_the_same_logits(tmp_path, capsys, fields):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**fields)).eval()
    if model.gate is not None:
        with torch.no_grad():
            model.gate.theta_r.fill_(0.5)
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, {"model": model.state_dict(), "model_config": old_format(model.cfg)})
    loaded, ckpt = load_model(path)
    assert loaded.cfg == model.cfg and "state_mode" not in ckpt["model_config"]
    notes = capsys.readouterr().err      # a renamed value is read under its new name, with a note
    assert ("jacobi_init 'plain' is now called 'ungated'" in notes) == (fields.get("jacobi_init") == "ungated")
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(idx)[0], model(idx)[0])


def test_old_keys_in_config_files_and_flags_are_read_under_the_new_names(tmp_path, capsys):
    config = tmp_path / "old.py"
    config.write_text('layout = "1+1R2+1"\nstate_mode = "residual"\n')
    (cfg,), _ = load_config([str(config), "--n_embd=32", "--n_head=4"], GPTConfig)
    assert cfg.state_passing == "residual"
    (cfg,), _ = load_config(["--t2mlr=True", "--n_layer=3", "--state_detach=True", "--jacobi_iters=3",
                             "--jacobi_grad_iters=1"], GPTConfig)
    assert (cfg.recurrent_detach, cfg.jacobi_sweeps, cfg.jacobi_grad_sweeps) == (True, 3, 1)
    err = capsys.readouterr().err
    for old in ("state_mode", "state_detach", "jacobi_iters", "jacobi_grad_iters"):
        assert f"config key '{old}'" in err and f"now called '{RENAMED_FIELDS[old]}'" in err


def test_old_values_in_config_files_and_flags_are_read_as_the_new_ones(tmp_path, capsys):
    """A value renamed since (RENAMED_VALUES) in a config file or a flag is read as its new name, with a
    one-line note naming both."""
    config = tmp_path / "old.py"
    config.write_text('weight_init = "reference"\n')
    (cfg,), given = load_config([str(config), "--t2mlr=True", "--n_layer=3", "--jacobi_init=plain"], GPTConfig)
    assert (cfg.weight_init, cfg.jacobi_init) == ("normal_0.02", "ungated")
    assert given == {"weight_init", "t2mlr", "n_layer", "jacobi_init"}
    notes = capsys.readouterr().err.splitlines()
    assert notes == [f"note: weight_init 'reference' in {config} is now 'normal_0.02' (the same setting)",
                     "note: jacobi_init 'plain' in command line is now 'ungated' (the same setting)"]
    for key, renamed in RENAMED_VALUES.items():              # every old value, and the new ones unchanged
        for old, new in renamed.items():
            assert getattr(load_config([f"--{key}={old}"], GPTConfig)[0][0], key) == new
            assert getattr(load_config([f"--{key}={new}"], GPTConfig)[0][0], key) == new
    assert capsys.readouterr().err.count("note: ") == len(sum(map(list, RENAMED_VALUES.values()), []))
