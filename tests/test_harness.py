"""
The lm-evaluation-harness model (support/harness.py), offline: every variant's log-likelihoods against a
direct log_softmax over the continuation tokens written here, batched requests against the same requests one
at a time, rolling windows, greedy generation against GPT.generate, the `hf:` path against lm_eval's own
transformers model, and small tasks built here run end to end through lm_eval's evaluator and command line.

Needs lm_eval (pip install -r requirements-eval.txt), and transformers + accelerate for the hf: comparison;
skipped without them, unless NANOMESH_REQUIRE_LM_EVAL=1 (.ci/run sets it, so CI cannot pass by skipping).
"""

import functools
import json
import math
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

import torch
import torch.nn.functional as F

pytestmark = pytest.mark.slow      # the second tier: needs requirements-eval.txt
REQUIRED = os.environ.get("NANOMESH_REQUIRE_LM_EVAL") == "1"   # CI: the skips below are failures there
# (tests/test_requirements.py checks that the libraries are installed where it is set)
pytest.importorskip("lm_eval", reason="the harness tests need lm_eval: pip install -r requirements-eval.txt")
import lm_eval                                          # noqa: E402
from lm_eval.api.instance import Instance               # noqa: E402
from lm_eval.tasks import TaskManager                   # noqa: E402

from model import GPT, GPTConfig, InferenceCache        # noqa: E402
from support.harness import NanoLM                      # noqa: E402
from support.tokenizers import get_tokenizer            # noqa: E402
from test_equivalence import VARIANTS, build            # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BYTE = get_tokenizer("byte")


@pytest.fixture
def local_tasks_only(monkeypatch):
    """studies.table1's TaskManager indexes the --include_path tasks alone, not lm_eval's ~14k built-in YAMLs
    (~20 s a call): for the tests that evaluate only their own local tasks in process."""
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(TaskManager, include_defaults=False))

BLOCK = 48
# every variant of test_equivalence (gates opened: the T²MLR state matters), with the byte vocabulary
MODELS = {name: dict(fields, vocab_size=320, block_size=BLOCK) for name, fields in VARIANTS.items()}
T2MLR = [name for name in MODELS if MODELS[name].get("t2mlr")]

# (context, continuation): an empty context, a trailing space, lengths from 1 to beyond block_size
PAIRS = [
    ("", "Hello"),
    ("The cat sat on the", " mat"),
    ("Question: what is two plus two?\nAnswer: ", "four"),
    ("a", "b"),
    ("x" * 30 + " and then a much longer context that runs past the block size of the model", " ends here"),
    ("Short", " and a continuation longer than it"),
    ("def f(x):\n    return", " x + 1"),
    (" ", "abc"),              # a context that is only its trailing space: the prefix (EOT) conditions
]


def model_of(name, dtype=torch.float64, seed=0):
    model = build(seed=seed, **MODELS[name])
    return model.to(dtype)


def instances(kind, args):
    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


def adapter(model, **kw):
    return NanoLM(pretrained=model, tokenizer=BYTE, device="cpu", dtype="float64"
                  if next(model.parameters()).dtype == torch.float64 else "float32", **kw)


def direct_loglikelihood(model, context, continuation):
    """log p(continuation | context) and whether it is greedy, straight from the definition: the byte ids of
    context (the EOT when empty) then continuation, the last block_size + 1 of them, one forward pass over all
    but the last (T²MLR in its exact mode, the default in eval), log_softmax, the continuation's entries.
    lm_eval's one rule about text: a context's trailing spaces belong to the continuation."""
    stripped = context.rstrip()
    context, continuation = stripped, context[len(stripped):] + continuation
    return direct_loglikelihood_ids(model, list(context.encode()) or [BYTE.eot], list(continuation.encode()))


def direct_loglikelihood_ids(model, ctx, cont):
    """direct_loglikelihood of token lists."""
    ids = (ctx + cont)[-(BLOCK + 1):]
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids[:-1]]))
    logprobs = F.log_softmax(logits[0].double(), dim=-1)[-len(cont):]            # rows predicting cont
    target = torch.tensor(cont)
    return logprobs[torch.arange(len(cont)), target].sum().item(), bool((logprobs.argmax(-1) == target).all())


@pytest.mark.parametrize("name, mode", [(name, "exact") for name in MODELS] + [(name, "converged") for name in T2MLR])
def test_loglikelihood_equals_a_direct_log_softmax(name, mode):
    """Every variant, float64, batched (batch 3, so batches mix lengths): the adapter's sums and greedy flags
    are the direct computation's, the truncated context included. T²MLR also in mode converged at tol 0 (all
    T sweeps: exact)."""
    model = model_of(name)
    got = adapter(model, batch_size=3, mode=mode).loglikelihood(instances("loglikelihood", PAIRS))
    for (context, continuation), (logprob, greedy) in zip(PAIRS, got, strict=True):
        want, want_greedy = direct_loglikelihood(model, context, continuation)
        assert logprob == pytest.approx(want, abs=1e-10, rel=1e-12), (context, continuation)
        assert greedy == want_greedy


@pytest.mark.parametrize("name, mode", [(name, "exact") for name in MODELS] +
                         [(name, mode) for name in T2MLR for mode in ("jacobi", "converged")])
def test_batched_requests_equal_one_at_a_time(name, mode):
    """Requests of different lengths in one padded batch give what each gives alone: float64 to 1e-10, float32
    to float32 rounding (sums of up to 48 log-probabilities of ~6 nats: 1e-4). T²MLR in every mode: a pad never
    reaches a real token's state."""
    requests = instances("loglikelihood", PAIRS)
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-4)):
        model = model_of(name, dtype)
        batched = adapter(model, batch_size=len(PAIRS), mode=mode).loglikelihood(requests)
        alone = adapter(model, batch_size=1, mode=mode).loglikelihood(requests)
        for (a, greedy_a), (b, greedy_b) in zip(batched, alone, strict=True):
            assert a == pytest.approx(b, abs=tol, rel=0) and greedy_a == greedy_b


def test_the_equality_above_catches_pads_that_reach_the_state():
    """What the equality above guards against, shown to be visible: the same T²MLR model with its pads on the
    LEFT (a pad before the real tokens, the bug class of peers that ignore the mask) or with the state of one
    request carried into the next gives other log-likelihoods (> 1e-3); the adapter's right-padded batch
    gives the alone values to 1e-12. (With right padding and causal attention no pad can reach a real token,
    whatever control marks it: the pads' control 0 only spares them the state.)"""
    model = model_of("t2mlr_llama")
    short, long = list(b"The cat sat"), list(b"A much longer request than the first")
    with torch.no_grad():
        alone = model(torch.tensor([short]))[0][0]
        left = model(torch.tensor([[0] * (len(long) - len(short)) + short, long]))[0][0, -len(short):]
        right = F.log_softmax(adapter(model).logits([long, short])[1, :len(short)], dim=-1)
        cache = InferenceCache(model.cfg.n_unrolled)
        model(torch.tensor([long]), cache=cache)
        cache.layers, cache.length = [{} for _ in cache.layers], 0              # keys reset, cache.R kept
        carried = model(torch.tensor([short]), cache=cache)[0][0]
    expected = F.log_softmax(alone, dim=-1)
    assert (F.log_softmax(left, dim=-1) - expected).abs().max() > 1e-3
    assert (F.log_softmax(carried, dim=-1) - expected).abs().max() > 1e-3
    assert (right - expected).abs().max() < 1e-12


@pytest.mark.parametrize("name", ["t2mlr_llama", "recursive_mesh"])
def test_no_state_carries_from_one_request_into_the_next(name):
    """A request scores and generates the same after other requests as it does first (batch 1: the same
    shapes, so bit for bit)."""
    model = model_of(name)
    lm = adapter(model, batch_size=1)
    first = lm.loglikelihood(instances("loglikelihood", PAIRS[1:2]))
    after = lm.loglikelihood(instances("loglikelihood", PAIRS[2:] + PAIRS[1:2]))[-1]
    assert first[0] == after
    gen = ("The cat", {"until": ["zzz"], "max_gen_toks": 8})
    assert lm.generate_until(instances("generate_until", [gen])) == \
        lm.generate_until(instances("generate_until", [("Another prompt first", gen[1]), gen]))[1:]


@pytest.mark.parametrize("name", ["vanilla_neox", "recursive_anchor", "t2mlr_neox_detached"])
def test_rolling_loglikelihood_scores_every_token_once_in_windows(name):
    """loglikelihood_rolling of a document of 135 bytes (3 windows of 48) equals the direct sum: the first
    window predicts bytes 0..47 from the EOT and bytes 0..46; each next one predicts the next 48 from the 48
    bytes before them; the last predicts what is left from the 48 bytes before it, its full context. An empty
    document scores 0."""
    model = model_of(name)
    doc = "The quick brown fox jumps over the lazy dog; " * 3
    assert len(doc) == 135
    got = adapter(model, batch_size=2).loglikelihood_rolling(instances("loglikelihood_rolling", [(doc,), ("",)]))
    assert got[0] == pytest.approx(direct_rolling(model, doc), abs=1e-9, rel=1e-12) and got[1] == 0.0


def direct_rolling(model, doc):
    """The rolling log-likelihood of an ASCII document, window by window (see the test above)."""
    ids = list(doc.encode())
    want, start = direct_loglikelihood(model, "", doc[:BLOCK])[0], BLOCK    # window 1: context = the EOT
    while start < len(ids):
        stop = min(start + BLOCK, len(ids))
        context, continuation = bytes(ids[stop - BLOCK - 1:start]).decode(), bytes(ids[start:stop]).decode()
        want += direct_loglikelihood_ids(model, list(context.encode()), list(continuation.encode()))[0]
        start = stop
    return want


@pytest.mark.parametrize("name", ["vanilla_llama", "recursive_mesh", "t2mlr_llama"])
def test_greedy_generation_equals_generate_and_stops_at_the_stop_string(name):
    """generate_until at temperature 0 gives GPT.generate's greedy tokens (all recurrent, as trained), cut at
    the first stop string; a context longer than block_size - max_gen_toks keeps its end."""
    model = model_of(name)
    lm = adapter(model)
    prompt = "A prompt that is much longer than the room left in the block for it, so it is cut on the left"
    kept = list(prompt.encode())[-(BLOCK - 10):]
    with torch.no_grad():
        want_ids = model.generate(torch.tensor([kept]), 10, temperature=0, recurrent_prompt=True)[0, len(kept):]
    want = lm.decode(want_ids.tolist())
    text = lm.generate_until(instances("generate_until", [(prompt, {"until": ["\x00never"], "max_gen_toks": 10})]))
    assert text == [want]
    stop = want[3:5]                                 # a stop string inside the greedy text
    cut = lm.generate_until(instances("generate_until", [(prompt, {"until": [stop], "max_gen_toks": 10})]))
    assert cut == [want.split(stop)[0]]
    with pytest.raises(ValueError, match="greedily only"):
        lm.generate_until(instances("generate_until", [(prompt, {"do_sample": True, "temperature": 1.0})]))


@pytest.mark.parametrize("name", list(MODELS))
def test_batched_generation_equals_one_request_at_a_time(name):
    """generate_until in batches of 3 (contexts of different lengths, two groups of settings, one context cut
    to block_size - max_gen_toks, one stop string met) gives each request's text alone (batch 1), in order."""
    model = model_of(name)
    short, long = {"until": ["\x00never"], "max_gen_toks": 7}, {"until": ["\x00never"], "max_gen_toks": 12}
    requests = [("The cat", short), ("A much longer context than the others, longer than the room left", long),
                ("", short), ("Question: two plus two?", long), ("x", short), ("Another one", long)]
    alone = [adapter(model, batch_size=1).generate_until(instances("generate_until", [r]))[0] for r in requests]
    stop = alone[3][2:4]                                      # a stop string inside one greedy text
    requests.append(("Question: two plus two?", {"until": [stop], "max_gen_toks": 12}))
    alone.append(alone[3].split(stop)[0])
    batched = adapter(model, batch_size=3).generate_until(instances("generate_until", requests))
    assert batched == alone and len(set(alone)) > 3


@pytest.mark.parametrize("name", list(MODELS))
def test_the_greedy_flag_is_true_for_the_greedy_continuation_only(name):
    """The flag that is LAMBADA's accuracy: the model's own greedy continuation (GPT.generate, temperature 0)
    is greedy; the same with its last token changed is not; in one batch with other requests."""
    model = model_of(name)
    context = list(b"The cat sat on the mat and")
    with torch.no_grad():
        greedy = model.generate(torch.tensor([context]), 6, temperature=0, recurrent_prompt=True)[0, len(context):]
    greedy = greedy.tolist()
    changed = greedy[:-1] + [(greedy[-1] + 1) % 256]
    requests = [((None, None), context, greedy), ((None, None), context, changed),
                ((None, None), list(b"x"), list(b"yz"))]
    flags = [flag for _, flag in adapter(model, batch_size=3)._loglikelihood_tokens(requests, disable_tqdm=True)]
    assert flags[:2] == [True, False]


class EotAt(type(BYTE)):
    """The byte tokenizer with another id as its end-of-text token, decoded as "<EOT>"."""

    def __init__(self, eot):
        self.eot = eot

    def decode(self, ids):
        return "".join("<EOT>" if i == self.eot else chr(i) for i in ids)


def test_generation_stops_at_the_end_of_text_token():
    """With the 4th-or-later new greedy token declared the EOT, generate_until returns the text before it."""
    model = model_of("t2mlr_neox_detached")          # its greedy text does not just repeat a token
    context = "Once upon a time"
    with torch.no_grad():
        greedy = model.generate(torch.tensor([list(context.encode())]), 12, temperature=0,
                                recurrent_prompt=True)[0, len(context):].tolist()
    k = next(k for k in range(3, 12) if greedy[k] not in greedy[:k] and greedy[k] < 256)
    lm = NanoLM(pretrained=model, tokenizer=EotAt(greedy[k]), device="cpu", dtype="float64")
    text = lm.generate_until(instances("generate_until", [(context, {"until": ["\x00never"], "max_gen_toks": 12})]))
    assert text == ["".join(chr(i) for i in greedy[:k] if i < 256)]


def test_hf_models_give_what_lm_evals_transformers_model_gives(tmp_path):
    """checkpoint=hf:<folder> (a random GPT-NeoX and a random Llama saved with save_pretrained, with a BPE
    tokenizer trained here) against lm_eval's own HFLM on the same folder: the same log-likelihoods (its
    tokenizer, its pairing of context and continuation, transformers' forward), rolling windows, and the same
    greedy text."""
    if not REQUIRED:
        pytest.importorskip("accelerate", reason="lm_eval's HFLM needs accelerate (and transformers)")
    from lm_eval.models.huggingface import HFLM
    from test_pretrained import TEXTS, hf_model, train_tokenizer
    requests = instances("loglikelihood", [("The quick brown", " fox jumps"), ("", "Pack my box"),
                                           ("How vexingly quick daft zebras", " jump; the five boxing wizards"),
                                           ("Pack my box with five dozen liquor jugs! Pack", " my box")])
    rolling = instances("loglikelihood_rolling", [(" ".join(TEXTS[:4]),)])    # > 64 tokens: several windows
    generate = instances("generate_until", [("The quick", {"until": ["zebra"], "max_gen_toks": 12})])
    for case in ("pythia_untied_rot25", "smollm2_gqa_tied"):
        folder = tmp_path / case
        train_tokenizer(folder, TEXTS, vocab_size=300)
        hf_model(case, vocab=300).save_pretrained(folder)
        theirs = HFLM(pretrained=str(folder), device="cpu", batch_size=2, dtype="float32")
        ours = NanoLM(checkpoint=f"hf:{folder}", device="cpu", batch_size=3)
        for (a, greedy_a), (b, greedy_b) in zip(ours.loglikelihood(requests), theirs.loglikelihood(requests),
                                                strict=True):
            assert a == pytest.approx(b, abs=1e-4, rel=0) and greedy_a == greedy_b
        assert ours.loglikelihood_rolling(rolling)[0] == pytest.approx(theirs.loglikelihood_rolling(rolling)[0],
                                                                       rel=1e-6)
        assert ours.generate_until(generate) == theirs.generate_until(generate)


# -----------------------------------------------------------------------------
# lm_eval's evaluator and command line on tasks built here (local JSON files: no network)

CHOICES = [("The sky on a clear day is", ["blue", "made of cheese and sorrow", "green"], 0),
           ("Two plus two is", ["four", "seven", "a fish"], 0),
           ("Water freezes at zero degrees", ["Celsius", "Kelvin warm", "upward"], 0),
           ("A cat says", ["meow", "moo moo", "quack"], 0),
           ("The opposite of up is", ["down", "sideways and around", "left"], 0)]
DOCS = ["The quick brown fox jumps over the lazy dog. " * 2, "Pack my box with five dozen liquor jugs.",
        "How vexingly quick daft zebras jump! " * 4]


def write_tasks(folder: Path):
    """Three lm_eval YAML tasks reading JSON-lines files in `folder`: tiny_mc (multiple choice, acc and
    acc_norm, few-shot examples from the same file), tiny_roll (rolling perplexity) and tiny_gen (greedy
    generation until a newline, exact_match)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = {"mc": [{"q": q, "choices": c, "label": label} for q, c, label in CHOICES],
            "roll": [{"text": d} for d in DOCS],
            "gen": [{"q": "Say hi:", "a": " hi"}, {"q": "Count:", "a": " 1 2 3"}]}
    for name, docs in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    data = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {path}\n    train: {path}\n"
    (folder / "tiny_mc.yaml").write_text(
        "task: tiny_mc\n" + data.format(path=folder / "mc.jsonl") +
        "output_type: multiple_choice\ntest_split: test\nfewshot_split: train\ndoc_to_text: '{{q}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    (folder / "tiny_roll.yaml").write_text(
        "task: tiny_roll\n" + data.format(path=folder / "roll.jsonl") +
        "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    (folder / "tiny_gen.yaml").write_text(
        "task: tiny_gen\n" + data.format(path=folder / "gen.jsonl") +
        "output_type: generate_until\ntest_split: test\ndoc_to_text: '{{q}}'\ndoc_to_target: '{{a}}'\n"
        "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 6\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    return folder


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def direct_scores(model, shots=0):
    """0-shot acc, acc_norm and word perplexity of the tiny tasks, by lm_eval's definitions: each choice is
    scored as the continuation " " + choice (the default target delimiter); acc_norm divides a choice's
    log-likelihood by its length in characters; word perplexity is exp(-total log-likelihood / total words),
    words split at whitespace, the documents' log-likelihoods from the rolling test's direct sum."""
    acc = acc_norm = 0
    for question, choices, label in CHOICES:
        lls = [direct_loglikelihood(model, question, " " + choice)[0] for choice in choices]
        acc += max(range(len(lls)), key=lls.__getitem__) == label
        acc_norm += max(range(len(lls)), key=lambda i: lls[i] / len(choices[i])) == label
    total = sum(direct_rolling(model, doc) for doc in DOCS)
    words = sum(len(re.split(r"\s+", doc)) for doc in DOCS)
    return acc / len(CHOICES), acc_norm / len(CHOICES), math.exp(-total / words)


@pytest.mark.parametrize("name", ["vanilla_neox", "recursive_mesh", "t2mlr_llama"])
def test_tasks_built_here_run_end_to_end_through_lm_evals_evaluator(tmp_path, name):
    """simple_evaluate on the three local tasks: acc, acc_norm and word perplexity equal the direct values, the
    generated texts are GPT.generate's greedy ones cut at the stop; a 2-shot run's prompts hold two solved
    examples."""
    model = model_of(name)
    manager = TaskManager(include_path=str(write_tasks(tmp_path / "tasks")), include_defaults=False)
    lm = adapter(model, batch_size=4)
    full = lm_eval.simple_evaluate(model=lm, tasks=["tiny_mc", "tiny_roll", "tiny_gen"], task_manager=manager,
                                   num_fewshot=0, bootstrap_iters=0)
    out = full["results"]
    acc, acc_norm, word_ppl = direct_scores(model)
    assert out["tiny_mc"]["acc,none"] == pytest.approx(acc)
    assert out["tiny_mc"]["acc_norm,none"] == pytest.approx(acc_norm)
    assert out["tiny_roll"]["word_perplexity,none"] == pytest.approx(word_ppl, rel=1e-9)
    matches = []
    for sample in full["samples"]["tiny_gen"]:       # greedy, 6 tokens at most, cut at a newline or the EOT
        context = sample["arguments"][0][0]
        with torch.no_grad():
            ids = model.generate(torch.tensor([list(context.encode())]), 6, temperature=0, recurrent_prompt=True)
        want = lm.decode(ids[0, len(context):].tolist()).split("\n")[0].split("<|endoftext|>")[0]
        assert sample["resps"][0][0] == want
        matches.append(want == sample["target"])
    assert out["tiny_gen"]["exact_match,none"] == sum(matches) / len(matches)
    two_shot = lm_eval.simple_evaluate(model=adapter(model, batch_size=4), tasks=["tiny_mc"], task_manager=manager,
                                       num_fewshot=2, bootstrap_iters=0, log_samples=True)
    context, continuation = two_shot["samples"]["tiny_mc"][0]["arguments"][0]
    assert context.count("\n\n") == 2 and continuation == " blue"     # two solved examples, then the question


def write_checkpoint(folder, name, tokenizer="byte"):
    """A train.py-shaped checkpoint of the variant `name` in folder/ckpt.pt (float32)."""
    model = model_of(name, torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    ckpt = {"model": model.state_dict(), "model_config": asdict(model.cfg), "step": 0, "val_loss": 0.0}
    if tokenizer:
        ckpt["tokenizer"] = tokenizer
    torch.save(ckpt, folder / "ckpt.pt")
    return model


def test_checkpoint_loading_uses_the_recorded_tokenizer_and_bad_arguments_are_named(tmp_path):
    model = write_checkpoint(tmp_path / "run", "recursive_mesh")
    for source in (tmp_path / "run", tmp_path / "run" / "ckpt.pt"):     # out_dir or the file; pretrained=, too
        lm = NanoLM(**{"checkpoint" if source.is_dir() else "pretrained": str(source)}, device="cpu")
        assert lm.tok.name == "byte" and lm.max_length == BLOCK
        got = lm.loglikelihood(instances("loglikelihood", PAIRS[:2]))
        for (context, continuation), (logprob, _) in zip(PAIRS[:2], got):
            assert logprob == pytest.approx(direct_loglikelihood(model, context, continuation)[0], abs=1e-4)
    write_checkpoint(tmp_path / "s5", "vanilla_neox", tokenizer=None)
    cases = [(dict(checkpoint=str(tmp_path / "s5")), "names no tokenizer"),
             (dict(checkpoint=str(tmp_path / "none")), "no checkpoint at"),
             (dict(checkpoint=str(tmp_path / "run"), mode="fast"), "mode 'fast' is not one of"),
             (dict(checkpoint=str(tmp_path / "run"), batch_size="auto"), "batch_size 'auto' is not an integer"),
             (dict(checkpoint=str(tmp_path / "run"), tol=2.0), r"tol 2.0 is not a number in \[0, 1\)"),
             (dict(checkpoint=str(tmp_path / "run"), tol="abc"), r"tol 'abc' is not a number in \[0, 1\)"),
             (dict(checkpoint=str(tmp_path / "run"), dtype="bogus"), "dtype 'bogus' is not one of 'auto'"),
             (dict(checkpoint=str(tmp_path / "run"), device="gpu"), "device 'gpu' is not one of 'auto'"),
             (dict(checkpoint=str(tmp_path / "run"), modes="jacobi"), "unknown model argument.s. modes"),
             (dict(checkpoint=str(tmp_path / "run"), tokenizer="gpt2"), "tokenizer='gpt2' goes with pretrained"),
             (dict(pretrained=str(tmp_path / "run"), tokenizer="byte"), "tokenizer='byte' goes with pretrained"),
             (dict(pretrained=3, tokenizer=BYTE), "pretrained= takes a GPT object"),
             (dict(), "give checkpoint=")]
    for kwargs, message in cases:
        with pytest.raises(Exception, match=message):
            NanoLM(**{"device": "cpu", **kwargs})
    with pytest.raises(ValueError, match="a continuation of 49 tokens exceeds block_size 48"):
        lm.loglikelihood(instances("loglikelihood", [("a", "b" * 49)]))


def test_a_gpt2_checkpoint_is_read_with_gpt2_bpe(tmp_path):
    """A checkpoint that recorded tokenizer 'gpt2' is scored in GPT-2 BPE ids (tiktoken): the adapter's
    log-likelihood equals the direct one over tiktoken's encoding of context and continuation."""
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", str(ROOT.parent / "shared" / "tiktoken_cache"))
    if not Path(cache).is_dir():
        pytest.skip(f"no offline GPT-2 vocabulary at {cache}")
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", cache)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50304, block_size=32, n_layer=2, n_embd=32, n_head=4)).eval()
    (tmp_path / "run").mkdir()
    torch.save({"model": model.state_dict(), "model_config": asdict(model.cfg), "tokenizer": "gpt2"},
               tmp_path / "run" / "ckpt.pt")
    lm = NanoLM(checkpoint=str(tmp_path / "run"), device="cpu")
    bpe = get_tokenizer("gpt2")
    context, continuation = bpe.encode("The cat sat on the"), bpe.encode(" mat")
    assert lm.tok.name == "gpt2" and len(context) == 5 and len(continuation) == 1
    got = lm.loglikelihood(instances("loglikelihood", [("The cat sat on the", " mat")]))[0][0]
    assert got == pytest.approx(direct_loglikelihood_ids(model, context, continuation)[0], abs=1e-5)


def test_command_line_is_lm_evals_with_nanomesh_registered(tmp_path):
    """python -m support.harness --model nanomesh ... runs lm_eval's command line on a checkpoint and writes
    its results JSON; the scores equal the in-process evaluator's; a bad model argument is one line."""
    write_checkpoint(tmp_path / "run", "t2mlr_llama")
    tasks = write_tasks(tmp_path / "tasks")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "support.harness", "--model", "nanomesh", "--model_args",
           f"checkpoint={tmp_path / 'run'},mode=exact", "--tasks", "tiny_mc", "--include_path", str(tasks),
           "--device", "cpu", "--batch_size", "4", "--output_path", str(tmp_path / "results")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    bad = subprocess.run([arg.replace("mode=exact", "mode=fast") for arg in cmd], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1] == "error: mode 'fast' is not one of 'exact', 'jacobi', 'converged'"
    results = json.loads(next((tmp_path / "results").rglob("results_*.json")).read_text())["results"]
    lm = NanoLM(checkpoint=str(tmp_path / "run"), device="cpu", batch_size=4)
    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    want = lm_eval.simple_evaluate(model=lm, tasks=["tiny_mc"], task_manager=manager, bootstrap_iters=0)
    assert results["tiny_mc"]["acc,none"] == want["results"]["tiny_mc"]["acc,none"]
    assert results["tiny_mc"]["acc_norm,none"] == want["results"]["tiny_mc"]["acc_norm,none"]


if __name__ == "__main__":      # PYTHONPATH=. python tests/test_harness.py: the agreements the tests bound, measured
    import tempfile
    requests = instances("loglikelihood", PAIRS)
    print("| variant | batched vs alone, float32 | float64 | adapter vs direct, float64 |\n|---|---|---|---|")
    for name in MODELS:
        for mode in ("exact", "jacobi", "converged") if name in T2MLR else ("exact",):
            gaps = []
            for dtype in (torch.float32, torch.float64):
                model = model_of(name, dtype)
                batched = adapter(model, batch_size=len(PAIRS), mode=mode).loglikelihood(requests, disable_tqdm=True)
                alone = adapter(model, batch_size=1, mode=mode).loglikelihood(requests, disable_tqdm=True)
                gaps.append(max(abs(a[0] - b[0]) for a, b in zip(batched, alone)))
            direct = [direct_loglikelihood(model, c, x)[0] for c, x in PAIRS]
            gap = f"{max(abs(a[0] - d) for a, d in zip(batched, direct)):.1e}" if mode != "jacobi" else "(D < T)"
            print(f"| {name}{'' if mode == 'exact' else ' ' + mode} | {gaps[0]:.1e} | {gaps[1]:.1e} | {gap} |")
    from lm_eval.models.huggingface import HFLM
    from test_pretrained import TEXTS, hf_model, train_tokenizer
    hf_requests = instances("loglikelihood", [(TEXTS[i][:10 + 3 * i], TEXTS[i][10 + 3 * i:40 + 3 * i]) for i in range(12)])
    with tempfile.TemporaryDirectory() as tmp:
        for case in ("pythia_untied_rot25", "pythia_tied_rot50", "smollm2_gqa_tied", "llama_mha_untied"):
            folder = Path(tmp) / case
            train_tokenizer(folder, TEXTS, vocab_size=300)
            hf_model(case, vocab=300).save_pretrained(folder)
            theirs = HFLM(pretrained=str(folder), device="cpu", batch_size=4, dtype="float32").loglikelihood(hf_requests, disable_tqdm=True)
            ours = NanoLM(checkpoint=f"hf:{folder}", device="cpu", batch_size=5).loglikelihood(hf_requests, disable_tqdm=True)
            print(f"hf:{case} vs lm_eval's HFLM (transformers), float32: max |difference| "
                  f"{max(abs(a[0] - b[0]) for a, b in zip(ours, theirs)):.1e} over {len(ours)} requests, "
                  f"greedy flags equal: {[a[1] for a in ours] == [b[1] for b in theirs]}")


def test_the_command_line_runs_on_the_device_here_unless_told():
    """lm_eval's default device (cuda:0) fails on a CPU machine: without --device the best one here is given."""
    from support.harness import with_device
    from support.runtime import resolve_device
    assert with_device(["--tasks", "piqa"]) == ["--tasks", "piqa", "--device", resolve_device("auto")]
    assert with_device(["--device", "cpu"]) == ["--device", "cpu"]
    assert with_device(["--device=cuda:1"]) == ["--device=cuda:1"]
