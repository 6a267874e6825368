"""
Checkpoints that survive a full disk, a damaged file and a second run (support/checkpoints.py, CPU, ~15 s):
save_checkpoint keeps the previous checkpoint and leaves the last good one in place when a write fails (a file
size limit in a subprocess stands in for a full disk), load_resumable falls back to the previous one,
lock_out_dir keeps a second process out (and is free again after kill -9 of the holder), and every file that
is not a whole checkpoint, an incomplete checkpoint, an unusable device or an unwritable out_dir is one line.

    python -m pytest -q tests/test_checkpoints.py
"""

import os
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

from support.runtime import check_device
from support.checkpoints import (RESUME_KEYS, load_checkpoint, load_model, load_resumable,
                                 lock_out_dir, previous_path, require_keys, save_checkpoint, temporary_path)
from support.runtime import RunError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def checkpoint(step, numel=10):
    """A checkpoint dict with every key a resume reads, its weight filled with `step`."""
    return {"model": {"w": torch.full((numel,), float(step))}, "optimizer": {}, "step": step,
            "best_val_loss": 1.0, "model_config": {}, "train_config": {}, "tokenizer": "byte"}


def python(code, *args, **kw):
    """Run `code` in a new Python process with the repository importable."""
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True,
                          text=True, timeout=120, **kw)


# -----------------------------------------------------------------------------
# save_checkpoint

def test_save_keeps_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    for step in (1, 2, 3):
        save_checkpoint(path, checkpoint(step))
    assert sorted(os.listdir(tmp_path)) == ["ckpt.prev.pt", "ckpt.pt"]
    assert load_checkpoint(path)["step"] == 3
    assert load_checkpoint(previous_path(path))["step"] == 2
    assert previous_path(path) == str(tmp_path / "ckpt.prev.pt")


def test_a_full_disk_leaves_the_last_good_checkpoint_and_no_temporary_file(tmp_path):
    """A file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes the third write fail as a full disk does: one
    line naming the file and the cause, the temporary file removed, ckpt.pt and ckpt.prev.pt as they were."""
    done = python("""
        import resource, signal, sys, torch
        from support.checkpoints import save_checkpoint
        from support.runtime import RunError
        path = sys.argv[1]
        for step in (1, 2):
            save_checkpoint(path, {"model": {"w": torch.zeros(10)}, "step": step})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))
        try:
            save_checkpoint(path, {"model": {"w": torch.zeros(100_000)}, "step": 3})    # 400 KB
        except RunError as e:
            sys.exit(f"error: {e}")
    """, str(tmp_path / "ckpt.pt"))
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.strip() == (
        f"error: cannot write checkpoint {tmp_path / 'ckpt.pt'}: the file is larger than the file system or a "
        f"size limit (ulimit -f) allows (File too large); {tmp_path / 'ckpt.pt'} still holds the last good "
        f"checkpoint")
    assert sorted(os.listdir(tmp_path)) == ["ckpt.prev.pt", "ckpt.pt"]        # the temporary file is gone
    assert load_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 2
    assert load_checkpoint(str(tmp_path / "ckpt.prev.pt"))["step"] == 1


def test_an_unwritable_folder_is_one_line(tmp_path):
    with pytest.raises(RunError, match=f"^cannot write checkpoint {tmp_path}/none/ckpt.pt: No such file or "
                                       f"directory; no checkpoint was written$"):
        save_checkpoint(str(tmp_path / "none" / "ckpt.pt"), checkpoint(1))


def test_a_damaged_checkpoint_is_not_kept_as_the_previous_one(tmp_path):
    """ckpt.pt truncated (a copy that did not finish): the next save replaces it, and ckpt.prev.pt keeps the
    older complete checkpoint rather than the damaged file."""
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, checkpoint(1))
    save_checkpoint(path, checkpoint(2))
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])
    save_checkpoint(path, checkpoint(3))
    assert load_checkpoint(path)["step"] == 3 and load_checkpoint(previous_path(path))["step"] == 1


def test_each_writer_has_its_own_temporary_file_and_dead_writers_files_are_removed(tmp_path):
    """A temporary file of a live process (here the test's parent) is left alone, one of a process that died is
    removed after the next save; this process writes under its own pid."""
    path = str(tmp_path / "ckpt.pt")
    assert temporary_path(path) == f"{path}.{os.getpid()}.tmp"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    for pid in (dead, os.getppid()):
        open(temporary_path(path, pid), "wb").write(b"PK\x03\x04 half a checkpoint")
    save_checkpoint(path, checkpoint(1))
    assert sorted(os.listdir(tmp_path)) == sorted(["ckpt.pt", os.path.basename(temporary_path(path, os.getppid()))])
    assert load_checkpoint(path)["step"] == 1


# -----------------------------------------------------------------------------
# load_resumable, require_keys, load_checkpoint's reasons

def test_a_truncated_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, checkpoint(1))
    save_checkpoint(path, checkpoint(2))
    assert load_resumable(path)[0]["step"] == 2 and capsys.readouterr().err == ""
    data = open(path, "rb").read()
    open(path, "wb").write(data[:len(data) - 100])
    ckpt, loaded = load_resumable(path)
    assert loaded == previous_path(path) and ckpt["step"] == 1 and torch.equal(ckpt["model"]["w"], torch.ones(10))
    notice = capsys.readouterr().err
    assert notice.count("\n") == 1 and notice.startswith(f"warning: cannot read checkpoint {path}: an incomplete zip")
    assert f"resuming from the previous checkpoint {previous_path(path)} (step 1) instead" in notice


def test_an_incomplete_checkpoint_falls_back_and_neither_loading_names_both(tmp_path, capsys):
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, checkpoint(1))
    save_checkpoint(path, {k: v for k, v in checkpoint(2).items() if k != "optimizer"})
    assert load_resumable(path)[0]["step"] == 1
    assert f"{path} lacks optimizer: it is not a complete checkpoint" in capsys.readouterr().err
    open(previous_path(path), "wb").write(b"")
    with pytest.raises(RunError, match=f"^{path} lacks optimizer: .*; and the previous checkpoint: cannot read "
                                       f"checkpoint {previous_path(path)}: the file is empty$"):
        load_resumable(path)


def test_require_keys_names_every_missing_key(tmp_path):
    ckpt = {"model": {}, "step": 3}
    with pytest.raises(RunError, match=r"^x/ckpt.pt lacks optimizer, best_val_loss, model_config, train_config, "
                                       r"tokenizer: it is not a complete checkpoint of train.py \(it holds model, "
                                       r"step\)$"):
        require_keys(ckpt, "x/ckpt.pt", RESUME_KEYS)
    require_keys(checkpoint(1), "x/ckpt.pt", RESUME_KEYS)          # a complete one passes


def test_load_model_without_a_model_config_is_one_line(tmp_path):
    path = str(tmp_path / "ckpt.pt")
    save_checkpoint(path, {"model": {}, "tokenizer": "byte"})
    with pytest.raises(RunError, match=r"ckpt.pt lacks model_config: it is not a complete checkpoint"):
        load_model(path)


def truncated_checkpoint(path):
    save_checkpoint(str(path), checkpoint(1, numel=1000))
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def zip_without_pickle(path):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("notes.txt", "hello")


@pytest.mark.parametrize("write, reason", [
    (lambda p: p.write_bytes(b"a"), r"not a file torch.save wrote \(those begin with b'PK\\x03\\x04', this one "
                                    r"with b'a'\)"),        # torch: IndexError: pop from empty list
    (lambda p: p.write_bytes(b"hello world"), r"not a file torch.save wrote .*b'hell'"),      # KeyError: 101
    (lambda p: p.write_bytes(b""), r"the file is empty"),
    (truncated_checkpoint, r"an incomplete zip archive: the file is truncated"),
    (zip_without_pickle, r"a zip archive that torch.save did not write \(it holds no data.pkl\)"),
])
def test_a_file_that_is_not_a_whole_checkpoint_says_what_it_is(tmp_path, write, reason):
    path = tmp_path / "ckpt.pt"
    write(path)
    with pytest.raises(RunError, match=f"^cannot read checkpoint {path}: {reason}"):
        load_checkpoint(str(path))


# -----------------------------------------------------------------------------
# check_device

def test_a_device_that_is_not_here_is_one_line():
    check_device("cpu")
    with pytest.raises(RunError, match=r"^device 'gpu' is not one of 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'$"):
        check_device("gpu")
    if torch.cuda.is_available():
        check_device("cuda")
        n = torch.cuda.device_count()
        with pytest.raises(RunError, match=rf"^device 'cuda:{n}': this machine has {n} CUDA device\(s\)"):
            check_device(f"cuda:{n}")
    else:
        with pytest.raises(RunError, match=r"^device 'cuda' asks for CUDA, which is not available here: choose "
                                           r"device 'cpu'"):
            check_device("cuda")
    if not torch.backends.mps.is_available():
        with pytest.raises(RunError, match=r"^device 'mps' asks for Apple's MPS, which is not available here"):
            check_device("mps")


# -----------------------------------------------------------------------------
# lock_out_dir

HOLDER = """
    import sys, time
    from support.checkpoints import lock_out_dir
    handle = lock_out_dir(sys.argv[1])
    print("locked", flush=True)
    time.sleep(120)
"""


def test_a_second_run_is_refused_naming_the_first_and_kill_9_frees_the_lock(tmp_path):
    out = str(tmp_path / "run")
    env = dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), out], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RunError, match=rf"^{out} is in use by another run \(pid {holder.pid}, which holds "
                                           rf"{out}/.lock\): wait for it to end, or choose another out_dir$"):
            lock_out_dir(out)
        second = python("""
            import sys
            from support.checkpoints import lock_out_dir
            from support.runtime import RunError
            try:
                lock_out_dir(sys.argv[1])
            except RunError as e:
                sys.exit(f"error: {e}")
        """, out)
        assert second.returncode == 1 and f"(pid {holder.pid}," in second.stderr
        assert second.stderr.count("\n") == 1
    finally:
        holder.kill()                                   # SIGKILL: no cleanup runs in the holder
        holder.wait()
    handle = lock_out_dir(out)                          # the kernel released the dead holder's lock
    assert open(os.path.join(out, ".lock")).read() == f"{os.getpid()}\n"
    # this process again (train.main run in-process after a run that raised): the lock is taken anew
    again = lock_out_dir(out)
    assert handle.closed and not again.closed
    again.close()
    lock_out_dir(out).close()                           # closing the file released it


def test_an_empty_or_unwritable_out_dir_is_one_line(tmp_path):
    with pytest.raises(RunError, match=r"^out_dir is empty \(''\): name the folder"):
        lock_out_dir("")
    (tmp_path / "file").write_text("")
    with pytest.raises(RunError, match=f"^cannot write in out_dir {tmp_path}/file/run: Not a directory$"):
        lock_out_dir(str(tmp_path / "file" / "run"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_out_dir_is_one_line(tmp_path):
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", 0o500)
    try:
        with pytest.raises(RunError, match=f"^cannot write in out_dir {tmp_path}/ro: Permission denied$"):
            lock_out_dir(str(tmp_path / "ro"))
        with pytest.raises(RunError, match=f"^cannot write checkpoint {tmp_path}/ro/ckpt.pt: Permission denied"):
            save_checkpoint(str(tmp_path / "ro" / "ckpt.pt"), checkpoint(1))
    finally:
        os.chmod(tmp_path / "ro", 0o700)
