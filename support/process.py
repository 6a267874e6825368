"""
An entry point leaves its process as it found it: `keeps_process_state` puts back, when the entry point
returns or raises (SystemExit included), what it set for the whole process, so a notebook or a test that
calls train.main (or any other script's main) in-process keeps its own Ctrl-C, environment and RNGs.
What deliberately stays is listed in docs/training.md ("Calling a script's main in-process").
No torch import here: prepare_data.py uses it without torch; torch's state is kept when torch is loaded.
"""

import functools
import os
import random
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)     # the ones support.runtime.StopRequest takes over


def keeps_process_state(main):
    """Decorate an entry point's main: on return and on error, put back the SIGINT and SIGTERM handlers, the
    environment, the working directory, the global RNGs and torch's thread count, default dtype and TF32 flags."""
    @functools.wraps(main)
    def kept(*args, **kwargs):
        saved = snapshot()
        try:
            return main(*args, **kwargs)
        finally:
            restore(saved)
    return kept


def snapshot():
    """What keeps_process_state puts back, as it is now (torch's and numpy's only if they are loaded)."""
    torch, np = sys.modules.get("torch"), sys.modules.get("numpy")
    saved = {"signals": {sig: signal.getsignal(sig) for sig in SIGNALS}, "environ": dict(os.environ),
             "cwd": os.getcwd(), "random": random.getstate(), "numpy": np.random.get_state() if np else None}
    if torch is not None:
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        saved["torch"] = (torch.get_rng_state(), cuda, torch.get_num_threads(), torch.get_default_dtype(),
                          torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    return saved


def restore(saved):
    """Put back what snapshot() recorded (the signal handlers from the main thread only: elsewhere they
    never changed, as signal.signal refuses there)."""
    if threading.current_thread() is threading.main_thread():
        for sig, handler in saved["signals"].items():
            if handler is not None and signal.getsignal(sig) is not handler:
                signal.signal(sig, handler)
    for key in set(os.environ) - set(saved["environ"]):
        del os.environ[key]
    os.environ.update(saved["environ"])
    if os.getcwd() != saved["cwd"]:
        os.chdir(saved["cwd"])
    random.setstate(saved["random"])
    if saved["numpy"] is not None:
        sys.modules["numpy"].random.set_state(saved["numpy"])
    if "torch" in saved:
        torch = sys.modules["torch"]
        rng, cuda, threads, dtype, tf32_matmul, tf32_cudnn = saved["torch"]
        torch.set_rng_state(rng)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32_matmul, tf32_cudnn
