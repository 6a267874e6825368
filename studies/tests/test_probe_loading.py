"""
Resume, sample.py and studies/probe.py on a checkpoint whose keys carry wrapper prefixes equal the clean checkpoint.
"""

import torch

from studies import probe
import sample
import train
from support.checkpoints import load_checkpoint
from test_loading import train_tiny  # noqa: E402

LLAMA = dict(flavour="llama", vocab_size=320, block_size=16, n_layer=3, n_embd=32, n_head=2, mlp_hidden=48)


def test_prefixed_resume_sample_and_probe_equal_the_clean_checkpoint(tmp_path, capsys):
    """--init_from=resume, sample.py and probe.py on a checkpoint whose keys carry `module._orig_mod.`:
    the same results as on the clean checkpoint (resume is bit-exact, so the final weights are equal)."""
    clean = train_tiny(tmp_path, "clean")
    prefixed = tmp_path / "prefixed" / "ckpt.pt"
    prefixed.parent.mkdir()
    ckpt = torch.load(clean, weights_only=True)
    torch.save({**ckpt, "model": {"module._orig_mod." + k: v for k, v in ckpt["model"].items()}}, prefixed)
    for out in ("clean", "prefixed"):
        train.main([f"--out_dir={tmp_path / out}", "--init_from=resume", "--max_iters=3"])
    a, b = (load_checkpoint(str(tmp_path / out / "ckpt.pt")) for out in ("clean", "prefixed"))
    assert a["step"] == b["step"] == 3
    assert a["model"].keys() == b["model"].keys() and all(
        torch.equal(a["model"][k], b["model"][k]) for k in a["model"]
    )

    resumed = torch.load(prefixed, weights_only=True)              # written by the resume, with clean keys
    torch.save({**resumed, "model": {"_orig_mod." + k: v for k, v in resumed["model"].items()}}, prefixed)
    outputs = []
    for out in ("clean", "prefixed"):
        capsys.readouterr()
        sample.main([f"--out_dir={tmp_path / out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=8",
                     "--start=The"])
        printed = capsys.readouterr().out.split("\n" + "-" * 80)[0]
        probed = probe.main([str(tmp_path / out / "ckpt.pt"), "--num_seqs=2", "--seq_len=8",
                             f"--data_dir={tmp_path / 'data' / 'fox'}", f"--out={tmp_path / out / 'probe'}"])
        outputs.append((printed, probed["skew"]["mean"]))
    assert outputs[0][0].startswith("The") and len(outputs[0][1]) > 0
    assert outputs[0] == outputs[1]
