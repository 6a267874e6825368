"""
sample.py on bad input and on a file of prompts (CPU, ~20 s): a binary prompt file, a checkpoint without the
keys sampling reads, a device this machine does not have, a bad file of prompts: each is one line
`error: ...` and exit status 1, run as a user runs it; a file of prompts gives one continuation each, equal to
the prompt alone.

    python -m pytest -q tests/test_sample.py
"""

import dataclasses
import os
import subprocess
import sys

import torch

from model import GPT, GPTConfig
from support.checkpoints import save_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = dict(vocab_size=320, block_size=16, n_layer=2, n_embd=32, n_head=2)


def write_run(folder, drop=(), **fields):
    """A train.py-shaped checkpoint of a small model in folder/ckpt.pt, without the keys in `drop`."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**(CFG | fields)))
    ckpt = {"model": model.state_dict(), "model_config": dataclasses.asdict(model.cfg), "tokenizer": "byte",
            "train_config": {"dataset": "none"}, "step": 7, "val_loss": 1.5}
    folder.mkdir(parents=True, exist_ok=True)
    save_checkpoint(str(folder / "ckpt.pt"), {k: v for k, v in ckpt.items() if k not in drop})
    return folder


def sample(cwd, *args):
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, os.path.join(ROOT, "sample.py"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def one_line_error(done):
    """The one stderr line of a run that failed as it should (exit status 1), without its 'error: '."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0][len("error: "):]


def test_a_binary_prompt_file_is_one_line(tmp_path):
    write_run(tmp_path / "run")
    (tmp_path / "prompt.bin").write_bytes(b"ok \xff\xfe\x00 binary")
    message = one_line_error(sample(tmp_path, "--out_dir=run", "--start=FILE:prompt.bin", "--max_new_tokens=2"))
    assert message == r"prompt file prompt.bin is not UTF-8 text (byte 3 is b'\xff'): give a text file"


def test_sampling_without_the_step_and_val_loss_works_and_without_a_model_config_is_one_line(tmp_path):
    write_run(tmp_path / "bare", drop=("step", "val_loss"))
    done = sample(tmp_path, "--out_dir=bare", "--max_new_tokens=3", "--num_samples=1", "--temperature=0")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[0] == "bare/ckpt.pt: step ?"
    write_run(tmp_path / "noconfig", drop=("model_config",))
    message = one_line_error(sample(tmp_path, "--out_dir=noconfig"))
    assert message.startswith("noconfig/ckpt.pt lacks model_config: it is not a complete checkpoint of train.py")


def test_a_device_this_machine_lacks_is_one_line(tmp_path):
    write_run(tmp_path / "run")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        message = one_line_error(sample(tmp_path, "--out_dir=run", f"--device=cuda:{n}"))
        assert message.startswith(f"device 'cuda:{n}': this machine has {n} CUDA device(s)")
    else:
        message = one_line_error(sample(tmp_path, "--out_dir=run", "--device=cuda"))
        assert message == ("device 'cuda' asks for CUDA, which is not available here: choose device 'cpu' "
                           "(or 'auto', the best one here)")




def test_a_file_of_prompts_gives_one_continuation_each_equal_to_the_prompt_alone(tmp_path):
    """--prompts: one continuation per line, in the file's order, batched (batch_size 2 over 3 prompts of
    different lengths), each what --start gives that prompt alone (greedy)."""
    write_run(tmp_path / "run", layout="1+1R2+0", block_size=64)
    lines = ["The quick brown fox", "a", "jumps over the lazy"]
    (tmp_path / "prompts.txt").write_text("\n".join(lines) + "\n")
    greedy = ["--out_dir=run", "--max_new_tokens=6", "--temperature=0"]
    done = sample(tmp_path, *greedy, "--prompts=prompts.txt", "--batch_size=2")
    assert done.returncode == 0, done.stderr
    batched = done.stdout.split("-" * 80 + "\n")
    assert len(batched) == 4 and batched[-1] == ""
    for line, got in zip(lines, batched):
        alone = sample(tmp_path, *greedy, f"--start={line}", "--num_samples=1")
        assert alone.returncode == 0, alone.stderr
        assert got.startswith(line) and got == alone.stdout.split("-" * 80 + "\n")[0]


def test_a_bad_file_of_prompts_is_one_line(tmp_path):
    write_run(tmp_path / "run")
    (tmp_path / "gap.txt").write_text("one\n\nthree\n")
    message = one_line_error(sample(tmp_path, "--out_dir=run", "--prompts=gap.txt"))
    assert message == "prompt file gap.txt line 2 is empty: give one prompt a line"
    (tmp_path / "none.txt").write_text("")
    message = one_line_error(sample(tmp_path, "--out_dir=run", "--prompts=none.txt"))
    assert message == "prompt file none.txt has no prompts: give one prompt a line"
    message = one_line_error(sample(tmp_path, "--out_dir=run", "--prompts=gap.txt", "--start=hi"))
    assert message == "give --start (one prompt) or --prompts (a file of them), not both"
