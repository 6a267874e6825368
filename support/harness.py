"""
Every variant through EleutherAI's lm-evaluation-harness (lm_eval 0.4; `pip install -r requirements-eval.txt`):
a model class registered as "nanomesh", so the harness's own tasks, prompts and metrics score our GPT.

    python -m support.harness --model nanomesh --model_args checkpoint=out/mesh_160m/ckpt.pt \\
        --tasks hellaswag,piqa --batch_size 16                  # needs the network (the tasks' datasets)
    python -m support.harness --model nanomesh --model_args checkpoint=hf:EleutherAI/pythia-160m,mode=exact ...

`python -m support.harness` is lm_eval's own command line with this model registered first: lm_eval 0.4 finds
only the models it ships, or those imported before its command line runs. In Python, pass
`NanoLM(checkpoint=...)` (or `NanoLM(pretrained=model, tokenizer=tok)`) to lm_eval.simple_evaluate.

How a request becomes a forward pass:
- The tokenizer is the one the checkpoint recorded (GPT-2, byte, or a released model's own); the EOT token is
  the prefix of an empty context, as lm_eval's Hugging Face model uses its EOS.
- A context longer than block_size is truncated on the left (lm_eval's rule: the last block_size + 1 tokens of
  context + continuation, minus the last, are the input).
- Requests are sorted by length (longest first) and batched, padded on the RIGHT. Attention is causal and T²MLR's
  state flows forward in time, so a pad changes no real token: every variant's log-likelihoods equal those of the
  same requests one at a time (tests/test_harness.py). T²MLR marks pads as control 0, so they neither read nor
  merge the state; every real token is recurrent (c = 2), as train.py trains.
- Every batch starts from R_{-1} = 0 and fresh caches: no state carries from one request into the next.
- T²MLR runs in exact mode by default, token by token through the middle layers, which is the model; `mode=jacobi`
  (the config's D sweeps, as it trains) or `mode=converged` (sweeps until the state moves less than `tol`) are
  there to compare. Stopping rules that look at the whole batch (converged with tol > 0, jacobi_tol > 0) would
  make a request's score depend on its batch, so those run one request at a time.
"""

import math
import os
import socket
import sys
import urllib.parse
import urllib.request
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import Collator, handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from support.config import ConfigError
from model import GPT, InferenceCache
from support.checkpoints import load_model, recorded_tokenizer
from support.runtime import RunError, autocast_context, check_device, resolve_device, resolve_dtype
from support.tokenizers import DataError, get_tokenizer

MODES = ("exact", "jacobi", "converged")
DTYPES = ("auto", "float32", "bfloat16", "float16", "float64")


def load(checkpoint: str):
    """(model in eval mode on the CPU, tokenizer) for `checkpoint`: a train.py ckpt.pt (or the out_dir holding
    it), read with the tokenizer it recorded, or "hf:<hub id or folder>", a released Pythia / SmolLM2 with its
    own tokenizer. Raises RunError (a bad checkpoint) or ValueError / DataError (a bad hf: source)."""
    if checkpoint.startswith("hf:"):
        return GPT.from_pretrained(checkpoint[3:]).eval(), get_tokenizer(checkpoint)
    path = os.path.join(checkpoint, "ckpt.pt") if os.path.isdir(checkpoint) else checkpoint
    model, ckpt = load_model(path)
    return model, get_tokenizer(recorded_tokenizer(ckpt, path))


@register_model("nanomesh")
class NanoLM(TemplateLM):
    """lm_eval's three request types for one GPT of model.py. Give `checkpoint` (see load; `pretrained`, lm_eval's
    usual name, is the same and names lm_eval's output folder), or, from Python, `pretrained` as a GPT (moved
    and cast in place) and `tokenizer` (prepare_data.get_tokenizer's kind).
    mode: T²MLR's forward mode for scoring (MODES; generation decodes exactly, after a converged prefill in
    mode 'converged' and an exact one otherwise); tol: the converged mode's tolerance; batch_size: requests
    per forward pass; device: 'auto', 'cpu', 'cuda', 'cuda:N', 'mps'; dtype: DTYPES ('auto' = bf16 autocast
    on CUDA, else fp32; 'float64' casts the model). max_batch_size is lm_eval's and unused. Raises ValueError
    naming a bad or unknown argument and what is valid."""

    def __init__(self, checkpoint=None, pretrained=None, tokenizer=None, mode="exact", tol=0.0, batch_size=1,
                 device="auto", dtype="auto", max_batch_size=None, **unknown):
        super().__init__()
        if unknown:
            raise ValueError(f"unknown model argument(s) {', '.join(sorted(unknown))}: nanomesh takes checkpoint "
                             f"(or pretrained), mode, tol, dtype (and lm_eval's batch_size, device)")
        if (checkpoint is None) == (pretrained is None):
            raise ValueError("give checkpoint=<ckpt.pt, out_dir or hf:...> (or pretrained=, the same), not both")
        if isinstance(pretrained, str):     # lm_eval's own name for it, which also names its output folder
            checkpoint, pretrained = pretrained, None
        if checkpoint is not None and tokenizer is not None:
            raise ValueError(f"tokenizer={tokenizer!r} goes with pretrained=<a GPT>; a checkpoint is read with "
                             f"the tokenizer it recorded")
        if pretrained is not None and not (hasattr(pretrained, "cfg") and tokenizer is not None):
            raise ValueError("pretrained= takes a GPT object and tokenizer= its tokenizer (from Python); on the "
                             "command line give checkpoint=<ckpt.pt, out_dir or hf:<hub id or folder>>")
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(map(repr, MODES))}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(map(repr, DTYPES))}")
        try:
            self.tol = float(tol)
        except (TypeError, ValueError):
            self.tol = math.nan
        if not 0 <= self.tol < 1:
            raise ValueError(f"tol {tol!r} is not a number in [0, 1)")
        if isinstance(batch_size, bool) or not str(batch_size).isdigit() or int(batch_size) < 1:
            raise ValueError(f"batch_size {batch_size!r} is not an integer >= 1 ('auto' is not supported)")
        self.mode, self.batch_size = mode, int(batch_size)
        try:
            check_device(resolve_device(device))
        except RunError as e:       # malformed, or not on this machine
            default = " (lm_eval's own default; pass --device cpu)" if device == "cuda:0" else ""
            raise ValueError(f"{e}{default}") from None
        self._device = torch.device(resolve_device(device))
        if pretrained is None:
            pretrained, tokenizer = load(checkpoint)
        self.model, self.tok = pretrained.to(self._device).eval(), tokenizer
        if dtype == "float64":
            self.model, self.autocast_dtype = self.model.double(), None
        else:
            self.autocast_dtype = resolve_dtype(dtype, self._device.type)    # ConfigError: float16 off CUDA
        cfg = self.model.cfg
        self.t2mlr, self.max_length = cfg.t2mlr, cfg.block_size
        if mode != "exact" and not cfg.t2mlr:
            print(f"nanomesh: mode={mode} has no effect: this is not a T²MLR model", file=sys.stderr)
        stops_on_batch = (mode == "converged" and self.tol > 0) or (mode == "jacobi" and cfg.jacobi_tol > 0)
        if cfg.t2mlr and stops_on_batch:    # a stopping rule over the batch: one request at a time
            self.batch_size = 1

    def autocast(self):
        """The forward pass's mixed-precision context (none for a float64 model)."""
        return nullcontext() if self.autocast_dtype is None else autocast_context(self._device.type,
                                                                                  self.autocast_dtype)

    @property
    def eot_token_id(self):
        return self.tok.eot

    def tok_encode(self, string, add_special_tokens=None, **kwargs):
        return self.tok.encode(string)

    def get_model_info(self):
        return {"model": "nanomesh", "n_params": sum(p.numel() for p in self.model.parameters()),
                "mode": self.mode if self.t2mlr else None}

    # ---- scoring ---------------------------------------------------------------------------------------

    @torch.no_grad()
    def logits(self, inputs):
        """Logits (B, T, V) of a batch of token lists (each 1..block_size long), padded on the right; the rows
        beyond a list's length are padding and meaningless."""
        T = max(map(len, inputs))
        idx = torch.full((len(inputs), T), self.tok.eot, dtype=torch.long)
        control = torch.zeros(len(inputs), T, dtype=torch.long)       # T²MLR: 0 = pad, 2 = recurrent
        for row, ids in enumerate(inputs):
            idx[row, :len(ids)] = torch.tensor(ids)
            control[row, :len(ids)] = 2
        idx, control = idx.to(self._device), control.to(self._device)
        with self.autocast():
            if self.t2mlr:
                return self.model(idx, mode=self.mode, control=control, tol=self.tol)[0]
            return self.model(idx)[0]

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """[(key, context ids, continuation ids)] -> [(summed log-probability of the continuation, whether it
        is the greedy continuation)], in the requests' order. ValueError for a continuation longer than
        block_size (nothing could condition its first token)."""
        for _, context, continuation in requests:
            if len(continuation) > self.max_length:
                raise ValueError(f"a continuation of {len(continuation)} tokens exceeds block_size "
                                 f"{self.max_length}")
        # a context that encodes to nothing (e.g. " ": its space moved to the continuation) reads the prefix
        requests = [(key, context or [self.prefix_token_id], continuation) for key, context, continuation in requests]
        order = Collator(requests, sort_fn=lambda r: (-len(r[1] + r[2]), tuple(r[1] + r[2])))
        results = []
        with tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="nanomesh scoring") as bar:
            for batch in order.get_batched(n=self.batch_size):
                # the input: the last block_size + 1 tokens of context + continuation, without the last
                inputs = [(context + continuation)[-(self.max_length + 1):][:-1] for _, context, continuation in batch]
                logits = self.logits(inputs)
                for row, (key, _, continuation) in enumerate(batch):
                    n = len(inputs[row])
                    rows = logits[row, n - len(continuation):n]                  # (n_cont, V): predict cont
                    lp = F.log_softmax(rows.to(torch.promote_types(rows.dtype, torch.float32)), dim=-1)
                    target = torch.tensor(continuation, device=lp.device)
                    answer = (float(lp.gather(-1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all()))
                    results.append(answer)
                    if key is not None:               # None: a rolling window, cached as its document
                        self.cache_hook.add_partial("loglikelihood", key, answer)
                    bar.update(1)
        return order.get_original(results)

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """The log-likelihood of each whole document, scored in lm_eval's rolling windows of block_size tokens
        (every token predicted once; the first conditioned on the EOT), windows of all documents batched."""
        windows, owner = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                    context_len=1)):
                windows.append((None, context, continuation))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, scores):
            totals[i] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # ---- generation ------------------------------------------------------------------------------------

    @torch.no_grad()
    def greedy(self, contexts, max_gen_toks):
        """Greedy continuation ids of each token list in `contexts` (each at most block_size - max_gen_toks
        long), generated together (GPT.generate left-pads them: each row as it would be alone): all
        recurrent, as trained (T²MLR: an exact prefill, or converged in mode 'converged'); max_gen_toks
        tokens, or fewer where a row reached the EOT, which the EOT's text would stop anyway."""
        prompts = [torch.tensor(context, device=self._device) for context in contexts]
        stop = self.eot_token_id if self.decode([self.eot_token_id]) else None
        with self.autocast():
            out = self.model.generate(prompts, max_gen_toks, temperature=0, recurrent_prompt=True,
                                      prefill="converged" if self.mode == "converged" else "exact",
                                      prefill_tol=self.tol, stop_token=stop)
        return [row[len(context):].tolist() for row, context in zip(out, contexts)]

    def decode(self, ids):
        """Text of ids, without the padding rows of the embedding (ids >= the tokenizer's vocabulary)."""
        return self.tok.decode([i for i in ids if i < self.tok.vocab_size])

    def generate_until(self, requests, disable_tqdm=False):
        """Greedy text for each (context, gen_kwargs) request, cut at the first stop string (gen_kwargs
        'until', plus the EOT's text) and at most max_gen_toks tokens (default 256); the context keeps its
        last block_size - max_gen_toks tokens. Requests with the same settings are generated together,
        batch_size at a time, longest first, and cut at their stop strings afterwards. ValueError for
        do_sample=True (greedy only) or a max_gen_toks that leaves no room for a context."""
        eos, groups, results = self.tok.decode([self.eot_token_id]), {}, [None] * len(requests)
        for i, (context, gen_kwargs) in enumerate(req.args for req in requests):
            kwargs = normalize_gen_kwargs(dict(gen_kwargs), 256)
            if kwargs.get("do_sample"):
                raise ValueError("do_sample=True: nanomesh generates greedily only (do_sample=False)")
            until = tuple(handle_stop_sequences(kwargs.pop("until", None), eos=eos))
            max_gen_toks = kwargs.pop("max_gen_toks")
            if not 0 < max_gen_toks < self.max_length:
                raise ValueError(f"max_gen_toks {max_gen_toks} leaves no room for a context in block_size "
                                 f"{self.max_length}")
            ids = (self.tok_encode(context) or [self.eot_token_id])[-(self.max_length - max_gen_toks):]
            groups.setdefault((until, max_gen_toks), []).append((i, ids))
        with tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="nanomesh generating") as bar:
            for (until, max_gen_toks), group in groups.items():
                group.sort(key=lambda request: -len(request[1]))           # longest first: less padding
                for first in range(0, len(group), self.batch_size):
                    batch = group[first:first + self.batch_size]
                    for (i, _), new in zip(batch, self.greedy([ids for _, ids in batch], max_gen_toks)):
                        results[i] = postprocess_generated_text(self.decode(new), list(until), None)
                        self.cache_hook.add_partial("generate_until", tuple(requests[i].args), results[i])
                        bar.update(1)
        return results


def exit_on_error(main):
    """Run main() (this module's and studies/table1.py's command lines); a known error ends the process with
    one line `error: ...` and exit status 1: a bad argument, checkpoint or tokenizer, a task's data that the
    datasets library could not reach, or a file that cannot be read or written (e.g. a task's local data)."""
    try:
        main()
    except ConnectionError as e:          # the datasets library, offline or a dataset not in its cache
        sys.exit(f"error: {' '.join(str(e).split())} (a task's data needs the network the first time; "
                 f"see docs/evaluation.md)")
    except (ValueError, KeyError, RunError, DataError, ConfigError, OSError) as e:
        sys.exit(f"error: {' '.join(str(e).split())}")


TRUE = {"1", "ON", "YES", "TRUE"}       # what huggingface_hub and datasets read as a true environment variable


def offline_when_unreachable(timeout=3.0) -> bool:
    """Put huggingface_hub and datasets in offline mode (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) when the hub
    does not take a TCP connection within `timeout` seconds (hub_address), so a task's data or a model that
    is not in the local caches fails at once with one line, not after half a minute of retries. Call it
    before a task is loaded; nothing happens when offline mode is already set. Returns whether it switched."""
    from huggingface_hub import constants
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE", "").upper() in TRUE:
        return False
    host, port = hub_address()
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return False
    except OSError:                       # no such host, refused, or no answer in time
        pass
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"    # for datasets, imported later
    constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:         # already imported: it read the environment then
        import datasets.config
        datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
    print(f"nanomesh: the Hugging Face hub ({host}:{port}) is unreachable: offline, from the local caches only",
          file=sys.stderr)
    return True


def hub_address():
    """(host, port) that a request to the hub (HF_ENDPOINT, default https://huggingface.co) connects to
    first: the HTTPS proxy when one is set for it, else the hub itself."""
    from huggingface_hub import constants
    hub = urllib.parse.urlsplit(constants.ENDPOINT)
    proxy = urllib.request.getproxies().get("https")
    if proxy and not urllib.request.proxy_bypass(hub.hostname):
        hub = urllib.parse.urlsplit(proxy if "//" in proxy else "//" + proxy)
    return hub.hostname, hub.port or (443 if hub.scheme in ("https", "") else 80)


def with_device(argv):
    """lm_eval's arguments with `--device` set to the best device here (support.runtime.resolve_device's
    'auto') when none is given: lm_eval's own default, cuda:0, fails on a machine without a GPU."""
    if any(a == "--device" or a.startswith("--device=") for a in argv):
        return argv
    return argv + ["--device", resolve_device("auto")]


if __name__ == "__main__":      # lm_eval's command line, with "nanomesh" registered
    from lm_eval.__main__ import cli_evaluate
    sys.argv = [sys.argv[0]] + with_device(sys.argv[1:])
    offline_when_unreachable()
    exit_on_error(cli_evaluate)
