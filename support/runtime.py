"""
Where a script runs: the device, the autocast dtype, the mixed-precision context, compiling, the GPUs' peak
FLOP/s, and RunError, the one-line error of a run (train.py, sample.py, the studies).
"""

import os
import signal
from contextlib import nullcontext

import torch
import torch.distributed as dist

from support.config import ConfigError


class RunError(RuntimeError):
    """A problem with the data, a checkpoint or the run itself; printed as one line `error: ...`."""


# Dense bf16 tensor-core peak FLOP/s per GPU, matched against torch.cuda.get_device_name() in this
# order (so "H100 PCIe" before "H100", "L40S" before "L4"). With dtype=float32 MFU reads low.
PEAK_FLOPS = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
}


def compile_model(model, **options):
    """torch.compile what repeats (options: torch.compile's). A flat or looped model: its whole forward, one
    graph (returned). T²MLR, in place: each layer, the gate (T1) and the state update (T2), once each, called
    from the eager loop over Jacobi sweeps and exact tokens, so neither D sweeps nor T tokens unroll into one
    graph; returns `model`, whose hooks and state_dict keys stay as they were."""
    if model.gate is None:
        return torch.compile(model, **options)
    for layer in model.layers:
        layer.forward = torch.compile(layer.forward, **options)
    for name in ("temporal_gate", "state_update"):
        setattr(model, name, torch.compile(getattr(model, name), **options))
    return model


def peak_flops(device, given=None):
    """Peak FLOP/s of one device for MFU: `given` (--peak_flops), else PEAK_FLOPS' entry for this GPU, else None."""
    if given or not device.startswith("cuda"):
        return given or None
    return next((v for k, v in PEAK_FLOPS.items() if k in torch.cuda.get_device_name(device)), None)


def resolve_device(name, local_rank=None):
    """'auto' -> the best device here; under DDP plain 'cuda' -> 'cuda:<local_rank>'. Raises RunError for a
    device this machine does not have (check_device)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    if name == "cuda" and local_rank is not None:
        name = f"cuda:{local_rank}"
    check_device(name)
    return name


def check_device(name):
    """Raise RunError, one line naming what is valid, when the device `name` is malformed or not here."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise RunError(f"device {name!r} is not one of 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'")
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and not n_cuda:
        raise RunError(f"device {name!r} asks for CUDA, which is not available here: choose device 'cpu' "
                       f"(or 'auto', the best one here)")
    if device.type == "cuda" and (device.index or 0) >= n_cuda:
        raise RunError(f"device {name!r}: this machine has {n_cuda} CUDA device(s), cuda:0 to cuda:{n_cuda - 1}")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise RunError(f"device {name!r} asks for Apple's MPS, which is not available here: choose device "
                       f"'cpu' (or 'auto', the best one here)")


def resolve_dtype(name, device_type):
    """The autocast dtype: 'auto' = bf16 on CUDA when supported, else fp32. float16 (it trains with a
    GradScaler) is CUDA-only: asked for elsewhere, ConfigError."""
    if name == "auto":
        return torch.bfloat16 if device_type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    if name == "float16" and device_type != "cuda":
        raise ConfigError(f"dtype 'float16' needs CUDA (it trains with a GradScaler); use bfloat16 or float32 "
                          f"on {device_type}")
    return getattr(torch, name)


def autocast_context(device_type, dtype):
    """Mixed precision for the forward pass; a no-op in fp32. The model computes the loss in fp32."""
    return nullcontext() if dtype == torch.float32 else torch.autocast(device_type, dtype=dtype)


class StopRequest:
    """SIGINT (Ctrl-C) and SIGTERM (a scheduler, or torchrun passing one on) ask the run to stop: the handler
    only sets a flag, so no step, evaluation or checkpoint is cut in half; the loop asks agreed() once a step,
    and under DDP one all-reduce stops every rank at the same step."""

    def __init__(self, master=True):
        self.flag, self.master, self.pid = False, master, os.getpid()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self.handle)

    def handle(self, signum, frame):
        if os.getpid() != self.pid:      # a forked helper (torch.compile's workers): the default action
            signal.signal(signum, signal.SIG_DFL)
            return os.kill(os.getpid(), signum)
        if self.master:
            again = " (again: the checkpoint is being made whole, wait)" if self.flag else ""
            print(f"\n{signal.Signals(signum).name}{again}: stopping after this step and saving it", flush=True)
        self.flag = True

    def agreed(self, ddp, device) -> bool:
        """Whether any rank was asked to stop (on one process: this one)."""
        if not ddp:
            return self.flag
        flag = torch.tensor([float(self.flag)], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def resume_command(argv, ddp, world_size):
    """The command that continues a stopped train.py run: argv with --init_from=resume, under torchrun if DDP."""
    args = [a for a in argv if not a.startswith("--init_from=")] + ["--init_from=resume"]
    launcher = f"torchrun --standalone --nproc_per_node={world_size} train.py" if ddp else "python train.py"
    return " ".join([launcher] + args)
