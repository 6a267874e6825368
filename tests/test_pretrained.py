"""
Parity with the released architectures, with `transformers` as the reference implementation (tests only;
model.py never imports it): small random GPTNeoXForCausalLM (Pythia) and LlamaForCausalLM (SmolLM2)
models are saved with save_pretrained, loaded with GPT.from_pretrained, and must give the same logits
(float32 to 1e-5, float64 to 1e-10), the same greedy continuation, and, retrofitted with T²MLR, the same
logits at step 0. Also: train.py --init_from=hf:<folder>, prepare_data.py --tokenizer hf:<folder> on a
tokenizer trained here, sample.py decoding with it, and one-line errors for what we cannot honour.

    python -m pytest -q test_pretrained.py          (CPU, about half a minute)
"""

import json
import types

import numpy as np
import pytest

pytestmark = pytest.mark.slow      # the second tier: needs requirements-eval.txt
import torch

import prepare_data
import sample
import train
from model import GPT
from support.accounting import param_counts
from support.checkpoints import load_checkpoint
from support.data import val_starts
from support.pretrained import config_from_hf, neox_qkv_rows
from support.runtime import RunError
from test_train import read_log

transformers = pytest.importorskip("transformers", reason="the parity tests compare against transformers: "
                                                          "pip install transformers")

VOCAB = 96
# Each case is a transformers config: GQA, tied and untied heads, partial rotary, RoPE θ != 10000.
CASES = {
    "pythia_untied_rot25": ("GPTNeoX", dict(hidden_size=32, num_attention_heads=4, intermediate_size=80,
                                            rotary_pct=0.25, rotary_emb_base=5000,
                                            tie_word_embeddings=False)),
    "pythia_tied_rot50": ("GPTNeoX", dict(hidden_size=48, num_attention_heads=3, intermediate_size=64,
                                          rotary_pct=0.5, rotary_emb_base=10000, tie_word_embeddings=True)),
    "smollm2_gqa_tied": ("Llama", dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                                       intermediate_size=64, rope_theta=100000.0, tie_word_embeddings=True)),
    "llama_mha_untied": ("Llama", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                                       intermediate_size=48, rope_theta=500.0, tie_word_embeddings=False,
                                       rms_norm_eps=1e-5)),
}


def hf_model(case, seed=0, n_layer=4, vocab=VOCAB):
    """A random transformers model of `case` (weights ~ N(0, 0.2²), norms random too, so logits are O(1)
    and a wrong mapping shows), eval mode, float32, SDPA attention."""
    family, fields = CASES[case]
    config = getattr(transformers, f"{family}Config")(vocab_size=vocab, num_hidden_layers=n_layer,
                                                       max_position_embeddings=64, **fields)
    torch.manual_seed(seed)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.add_(1.0)
    model.config._attn_implementation = "sdpa"
    return model.eval()


@pytest.fixture(scope="module", params=list(CASES))
def saved(request, tmp_path_factory):
    """(case, folder, transformers model): the random model of the case saved with save_pretrained."""
    folder = tmp_path_factory.mktemp(request.param)
    ref = hf_model(request.param)
    ref.save_pretrained(folder)
    return request.param, str(folder), ref


def float64_transformers(ref):
    """A float64 copy of the transformers model. transformers computes the RoPE tables (both families) and
    LLaMA's RMSNorm in float32 whatever the model's dtype, which caps any float64 comparison at ~1e-7; here
    those two spots are recomputed in float64 (the same formulas), so the comparison tests the architecture
    and the weight mapping at float64 precision. The float32 test uses the library unchanged."""
    ref = ref.to(torch.float64)
    rotary = ref.base_model.rotary_emb
    head_dim = ref.config.hidden_size // ref.config.num_attention_heads
    rope = ref.config.rope_parameters
    dim = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))

    def rotary_forward(self, x, position_ids):
        freqs = position_ids[..., None].to(torch.float64) * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rotary.forward = types.MethodType(rotary_forward, rotary)

    def rms_forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    for module in ref.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(rms_forward, module)
    return ref


def ids(seed, batch=3, length=40):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# -----------------------------------------------------------------------------
# Logits, generation and the T²MLR retrofit against transformers

def test_logits_equal_transformers_float32(saved):
    case, folder, ref = saved
    ours = GPT.from_pretrained(folder).eval()
    x = ids(1)
    with torch.no_grad():
        want, got = ref(x).logits, ours(x)[0]
    assert want.abs().max() > 1.0                                 # logits large enough that a wrong map shows
    assert (got - want).abs().max().item() <= 1e-5


def test_logits_equal_transformers_float64(saved):
    case, folder, ref = saved
    ours = GPT.from_pretrained(folder).to(torch.float64).eval()
    ref64 = float64_transformers(hf_model(case))                     # a fresh copy: `saved`'s stays float32
    x = ids(2)
    with torch.no_grad():
        want, got = ref64(x).logits, ours(x)[0]
    assert got.dtype == torch.float64
    assert (got - want).abs().max().item() <= 1e-10


def test_cached_greedy_generation_equals_transformers(saved):
    case, folder, ref = saved
    ours = GPT.from_pretrained(folder).eval()
    prompt = ids(3, batch=2, length=7)
    with torch.no_grad():
        want = ref.generate(prompt, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt))
        got = ours.generate(prompt, 24, temperature=0.0)
    assert want.shape == got.shape == (2, 31)
    assert torch.equal(got, want)


@pytest.mark.parametrize("mode", ["jacobi", "exact"])
def test_t2mlr_retrofit_equals_the_released_model_at_step_0(saved, mode):
    """The gate starts as an exact identity (θ_r = θ_x = 0): T²MLR on layers 1..2 of the released model gives
    its logits, in Jacobi (training) and exact (token-by-token) mode, float64."""
    case, folder, ref = saved
    ours = GPT.from_pretrained(folder, t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=3, jacobi_grad_sweeps=1)
    ours = ours.to(torch.float64).train(mode == "jacobi")
    ref64 = float64_transformers(hf_model(case))
    x = ids(4, batch=2, length=20)
    with torch.no_grad():
        want, got = ref64(x).logits, ours(x, mode=mode)[0]
    assert ours.gate is not None and ours.gate.theta_r.item() == 0.0
    assert (got - want).abs().max().item() <= 1e-10


# -----------------------------------------------------------------------------
# The mapping itself and what we refuse

def test_neox_qkv_rows_regroup_per_head_layout():
    """Rows [q0 k0 v0 q1 k1 v1] (per head, NeoX) -> [q0 q1 k0 k1 v0 v1] (ours), each block hs rows."""
    n_head, hs = 2, 3
    blocks = {(h, part): torch.full((hs, 1), 10.0 * h + part) for h in range(n_head) for part in range(3)}
    neox = torch.cat([blocks[h, part] for h in range(n_head) for part in range(3)])
    ours = torch.cat([blocks[h, part] for part in range(3) for h in range(n_head)])
    assert torch.equal(neox_qkv_rows(neox, n_head), ours)
    assert torch.equal(neox_qkv_rows(neox[:, 0], n_head), ours[:, 0])       # a bias


def test_config_maps_the_released_configs():
    """config.json of Pythia-160M (transformers 4 keys) and of SmolLM2-135M (as released) -> GPTConfig."""
    pythia = {
        "architectures": ["GPTNeoXForCausalLM"],
        "hidden_act": "gelu",
        "hidden_size": 768,
        "intermediate_size": 3072,
        "layer_norm_eps": 1e-05,
        "max_position_embeddings": 2048,
        "num_attention_heads": 12,
        "num_hidden_layers": 12,
        "rotary_emb_base": 10000,
        "rotary_pct": 0.25,
        "tie_word_embeddings": False,
        "use_parallel_residual": True,
        "vocab_size": 50304,
    }
    cfg = config_from_hf(pythia)
    assert (cfg.flavour, cfg.rope_pct, cfg.rope_theta, cfg.tie_embeddings, cfg.bias, cfg.embed_scale) == \
        ("neox", 0.25, 10000, False, True, False)
    with torch.device("meta"):
        # Pythia-160M's parameter count
        assert param_counts(GPT(cfg))["total"] == 162_322_944
    smollm2 = {"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 576,
               "intermediate_size": 1536, "max_position_embeddings": 8192, "num_attention_heads": 9,
               "num_hidden_layers": 30, "num_key_value_heads": 3, "rms_norm_eps": 1e-05, "rope_theta": 100000,
               "rope_scaling": None, "tie_word_embeddings": True, "vocab_size": 49152, "head_dim": 64,
               "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}
    cfg = config_from_hf(smollm2, t2mlr=True, l_start=12, l_end=17)
    assert (cfg.n_kv_head, cfg.rope_theta, cfg.tie_embeddings, cfg.norm_eps, cfg.recurrent_layers) == \
        (3, 100000, True, 1e-5, (12, 17))
    with torch.device("meta"):
        assert param_counts(GPT(config_from_hf(smollm2)))["total"] == 134_515_008   # SmolLM2-135M's count


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"architectures": ["MistralForCausalLM"]},
            r"^architecture 'MistralForCausalLM' is not supported; from_pretrained",
        ),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            r"^LlamaForCausalLM: rope type = 'llama3' is not supported",
        ),
        (
            {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
            r"^LlamaForCausalLM: rope type = 'yarn'",
        ),
        ({"sliding_window": 4096}, r"^LlamaForCausalLM: sliding_window = 4096 is not supported"),
        ({"attention_bias": True}, r"^LlamaForCausalLM: attention_bias = True is not supported"),
        ({"mlp_bias": True}, r"^LlamaForCausalLM: mlp_bias = True"),
        (
            {"hidden_act": "gelu"},
            r"^LlamaForCausalLM: hidden_act = 'gelu' is not supported \(these layers have 'silu'\)",
        ),
        ({"head_dim": 16}, r"^LlamaForCausalLM: head_dim = 16 is not supported \(these layers have 8\)"),
    ],
)
def test_unsupported_llama_fields_are_named(change, message):
    base = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_act": "silu",
        "hidden_size": 48,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "num_attention_heads": 6,
        "num_hidden_layers": 2,
        "vocab_size": VOCAB,
    }
    with pytest.raises(ValueError, match=message):
        config_from_hf(base | change)


@pytest.mark.parametrize("change, message", [
    ({"use_parallel_residual": False}, r"use_parallel_residual = False is not supported"),
    ({"hidden_act": "gelu_fast"}, r"hidden_act = 'gelu_fast' is not supported"),
    ({"attention_bias": False}, r"attention_bias = False is not supported"),
    ({"hidden_dropout": 0.1}, r"hidden_dropout = 0.1 is not supported"),
])
def test_unsupported_neox_fields_are_named(change, message):
    base = {
        "architectures": ["GPTNeoXForCausalLM"],
        "hidden_act": "gelu",
        "hidden_size": 32,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": VOCAB,
    }
    with pytest.raises(ValueError, match="^GPTNeoXForCausalLM: " + message):
        config_from_hf(base | change)


def test_missing_or_misshapen_weights_are_named(tmp_path):
    """A checkpoint with a tensor removed or a config that no longer fits it: ValueError naming the tensor."""
    from safetensors.torch import load_file, save_file
    ref = hf_model("smollm2_gqa_tied")
    ref.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    tensors = load_file(weights)
    tensors.pop("model.layers.1.mlp.up_proj.weight")
    save_file(tensors, weights)
    with pytest.raises(
        ValueError,
        match=r"^the checkpoint does not fit this config: "
        r"layers\.1\.mlp\.up\.weight \(64, 48\) vs this model's \(128, 48\)$",
    ):
        # only the gate half of the fused up is left
        GPT.from_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match=r"layers\.4\.ln1\.weight is missing"):
        GPT.from_pretrained(str(tmp_path), n_layer=5)
    with pytest.raises(ValueError, match=r"holds no config.json"):
        GPT.from_pretrained(str(tmp_path.parent))
    with pytest.raises(ValueError, match=r"is not a folder"):
        GPT.from_pretrained(str(weights))


# -----------------------------------------------------------------------------
# Training from a released model, and its tokenizer

def train_tokenizer(folder, texts, vocab_size=300):
    """A tiny byte-level BPE tokenizer trained on `texts`, saved as a Hugging Face folder would hold it:
    tokenizer.json and tokenizer_config.json naming "<|endoftext|>" (id 0) as the EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return tok


TEXTS = ["The quick brown fox jumps over the lazy dog. " * 3, "Pack my box with five dozen liquor jugs! " * 3,
         "How vexingly quick daft zebras jump; the five boxing wizards jump quickly. " * 2] * 8


def test_hf_tokenizer_in_prepare_data_and_sample(tmp_path):
    """prepare_data.py --tokenizer hf:<folder>: ids from the tokenizers library, EOS from
    tokenizer_config.json, uint16 storage; decoding the stored ids gives the documents back."""
    folder = tmp_path / "tok"
    tok = train_tokenizer(folder, TEXTS)
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    meta = prepare_data.main(["--input", str(tmp_path / "docs.jsonl"), "--tokenizer", f"hf:{folder}",
                              "--out_dir", str(tmp_path / "data"), "--name", "hf", "--num_proc", "1"])
    assert (meta["tokenizer"], meta["eot"], meta["vocab_size"], meta["dtype"]) == \
        (f"hf:{folder}", 0, tok.get_vocab_size(), "uint16")
    stored = np.concatenate(
        [np.fromfile(tmp_path / "data" / "hf" / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")]
    )
    assert (stored == 0).sum() == len(TEXTS)                       # one EOS per document
    ours = prepare_data.get_tokenizer(f"hf:{folder}")
    assert ours.encode(TEXTS[0]) == tok.encode(TEXTS[0], add_special_tokens=False).ids
    assert ours.decode(ours.encode(TEXTS[2])) == TEXTS[2]
    with pytest.raises(prepare_data.DataError, match=r"^no tokenizer.json for '.*' \(the folder\)"):
        prepare_data.get_tokenizer(f"hf:{tmp_path}")


def test_retrofit_run_from_a_saved_llama_trains_and_starts_at_its_logits(tmp_path, capsys):
    """train.py --init_from=hf:<folder> --t2mlr=True: the config comes from config.json plus the keys given,
    the first val loss equals the released model's own loss on the same val windows, a few steps train,
    and sample.py decodes with the tokenizer recorded in the checkpoint."""
    folder = tmp_path / "llama"
    train_tokenizer(folder, TEXTS)
    # the tokenizer holds 257 ids: 256 bytes + EOS
    ref = hf_model("smollm2_gqa_tied", n_layer=3, vocab=320)
    ref.save_pretrained(folder)
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 4))
    meta = prepare_data.main(
        [
            "--input",
            str(tmp_path / "docs.jsonl"),
            "--tokenizer",
            f"hf:{folder}",
            "--out_dir",
            str(tmp_path / "data"),
            "--name",
            "d",
            "--num_proc",
            "1",
            "--val_fraction",
            "0.2",
        ]
    )
    out = tmp_path / "run"
    args = [
        f"--init_from=hf:{folder}",
        f"--data_dir={tmp_path / 'data' / 'd'}",
        f"--out_dir={out}",
        "--block_size=16",
        "--t2mlr=True",
        "--l_start=1",
        "--l_end=1",
        "--jacobi_sweeps=2",
        "--jacobi_grad_sweeps=1",
        "--batch_size=2",
        "--total_batch_size=32",
        "--max_iters=3",
        "--eval_interval=3",
        "--eval_iters=2",
        "--learning_rate=1e-3",
        "--warmup_iters=1",
        "--lr_decay_iters=3",
        "--min_lr=1e-4",
        "--log_interval=1",
        "--compile=False",
        "--progress=False",
    ]
    train.main(args)
    ckpt = load_checkpoint(str(out / "ckpt.pt"))
    cfg = ckpt["model_config"]
    assert (cfg["n_kv_head"], cfg["rope_theta"], cfg["block_size"], cfg["t2mlr"], cfg["embed_scale"]) == \
        (2, 100000.0, 16, True, False)
    # the released model's loss on train.py's val windows (block 16, eval_iters x batch_size windows)
    val = np.fromfile(tmp_path / "data" / "d" / "val.bin", dtype=np.uint16).astype(np.int64)
    starts = val_starts(meta["val_tokens"], 16, 2 * 2)
    x = torch.stack([torch.from_numpy(val[s:s + 16]) for s in starts])
    y = torch.stack([torch.from_numpy(val[s + 1:s + 17]) for s in starts])
    with torch.no_grad():
        logits = ref(x).logits
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item()
    log = read_log(out)
    first = [r["val_loss"] for r in log if r["step"] == 0 and "val_loss" in r]
    assert first == [pytest.approx(want, abs=1e-5)]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 3 and all(np.isfinite(losses))
    assert ckpt["model"]["gate.theta_r"].item() != 0.0             # the retrofitted gate was trained
    assert ckpt["tokenizer"] == f"hf:{folder}"
    capsys.readouterr()
    sample.main(
        [f"--out_dir={out}", "--start=The quick", "--max_new_tokens=5", "--num_samples=1", "--temperature=0"]
    )
    # decoded by the byte-level BPE trained above
    assert capsys.readouterr().out.startswith("The quick")


def test_hf_init_refuses_data_of_another_tokenizer(tmp_path):
    folder = tmp_path / "llama"
    hf_model("smollm2_gqa_tied", n_layer=2).save_pretrained(folder)
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS * 4))
    prepare_data.main(["--input", str(tmp_path / "docs.jsonl"), "--tokenizer", "byte", "--out_dir",
                       str(tmp_path / "data"), "--name", "b", "--num_proc", "1"])
    with pytest.raises(RunError, match=r"holds byte tokens, but a released model reads its own"):
        train.main([f"--init_from=hf:{folder}", f"--data_dir={tmp_path / 'data' / 'b'}", "--vocab_size=320",
                    f"--out_dir={tmp_path / 'run'}", "--block_size=16"])
    assert not (tmp_path / "run").exists()
    with pytest.raises(
        RunError, match=rf"prepare_data.py --input <your files> --name none --tokenizer hf:{folder}"
    ):
        train.main(
            [
                f"--init_from=hf:{folder}",
                f"--data_dir={tmp_path / 'data' / 'none'}",
                f"--out_dir={tmp_path / 'run'}",
            ]
        )
