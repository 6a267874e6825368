"""Released checkpoints: Pythia (GPTNeoXForCausalLM) and SmolLM2 (LlamaForCausalLM) as Hugging Face saves them.

model.py's neox and llama layers are those architectures (tests/test_pretrained.py checks the logits against
`transformers`), so a released model is a GPTConfig plus renamed tensors, read with `safetensors` only.
GPT.from_pretrained calls hf_checkpoint, config_from_hf and load_hf_weights; train.py's --init_from=hf:...
does the same in two steps (the config first, the weights once the model is built).
"""

import glob
import json
import os

import torch

from model import GPTConfig
from support.checkpoints import state_differences


def hf_checkpoint(name_or_path: str):
    """(config.json as a dict, [*.safetensors paths]) of a Hugging Face checkpoint: a local folder, or a hub id
    such as "HuggingFaceTB/SmolLM2-135M" fetched (and cached) by huggingface_hub. Raises ValueError naming the
    checkpoint when it cannot be found or holds no config.json / safetensors weights."""
    folder = name_or_path
    if not os.path.isdir(folder) and (os.path.exists(folder) or folder.startswith((".", "/"))):
        raise ValueError(f"{name_or_path!r} is not a folder: give a folder holding config.json and *.safetensors, "
                         f"or a hub id such as 'HuggingFaceTB/SmolLM2-135M'")
    if not os.path.isdir(folder):
        try:
            from huggingface_hub import snapshot_download
            folder = snapshot_download(name_or_path, allow_patterns=["*.json", "*.safetensors"])
        except ImportError:
            raise ValueError(f"{name_or_path!r} is not a local folder, and fetching it from the hub needs "
                             f"huggingface_hub: pip install huggingface_hub") from None
        except Exception as e:             # offline, unknown id, gated repo: many exception types
            raise ValueError(f"cannot fetch {name_or_path!r} from the Hugging Face hub ({type(e).__name__}); "
                             f"give a local folder holding config.json and *.safetensors") from None
    config_path, weights = os.path.join(folder, "config.json"), sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not os.path.isfile(config_path) or not weights:
        missing = "config.json" if not os.path.isfile(config_path) else "*.safetensors"
        raise ValueError(f"{name_or_path!r} holds no {missing} (pytorch_model.bin is not read: save the model with "
                         f"safetensors)")
    with open(config_path) as f:
        return json.load(f), weights


def config_from_hf(hf: dict, **overrides) -> GPTConfig:
    """The GPTConfig of a Hugging Face config.json (dict, transformers 4 or 5 keys), then `overrides` (e.g.
    t2mlr=True); token embeddings unscaled. Raises ValueError, naming the field, for an architecture other than
    GPTNeoXForCausalLM / LlamaForCausalLM and for a setting these layers do not have (`expected`)."""
    arch = (hf.get("architectures") or [hf.get("model_type", "?")])[0]
    rope, scaling = hf.get("rope_parameters") or {}, hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    n_embd, n_head = hf["hidden_size"], hf["num_attention_heads"]
    expected = {"rope type": (rope_type, "default"), "sliding_window": (hf.get("sliding_window"), None),
                "attention_dropout": (hf.get("attention_dropout", 0.0), 0.0),
                "hidden_dropout": (hf.get("hidden_dropout", 0.0), 0.0),
                "head_dim": (hf.get("head_dim") or n_embd // n_head, n_embd // n_head)}
    if arch == "GPTNeoXForCausalLM":            # Pythia: parallel residual, LayerNorm, biases, partial rotary
        expected |= {"hidden_act": (hf.get("hidden_act"), "gelu"),
                     "use_parallel_residual": (hf.get("use_parallel_residual", True), True),
                     "attention_bias": (hf.get("attention_bias", True), True)}
        cfg = dict(flavour="neox", n_kv_head=n_head, norm_eps=hf.get("layer_norm_eps", 1e-5), bias=True,
                   rope_theta=rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0)),
                   rope_pct=rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25)))   # GPT-NeoX's default
    elif arch == "LlamaForCausalLM":            # SmolLM2: sequential residual, RMSNorm, SwiGLU, GQA, no biases
        expected |= {"hidden_act": (hf.get("hidden_act"), "silu"),
                     "attention_bias": (hf.get("attention_bias", False), False),
                     "mlp_bias": (hf.get("mlp_bias", False), False)}
        cfg = dict(flavour="llama", n_kv_head=hf.get("num_key_value_heads") or n_head, bias=False,
                   norm_eps=hf.get("rms_norm_eps", 1e-6), rope_pct=rope.get("partial_rotary_factor", 1.0),
                   rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    else:
        raise ValueError(f"architecture {arch!r} is not supported; from_pretrained reads GPTNeoXForCausalLM "
                         f"(Pythia) and LlamaForCausalLM (SmolLM2)")
    for field, (value, ours) in expected.items():
        if value != ours:
            raise ValueError(f"{arch}: {field} = {value!r} is not supported (these layers have {ours!r})")
    cfg |= dict(vocab_size=hf["vocab_size"], block_size=hf["max_position_embeddings"], n_layer=hf["num_hidden_layers"],
                n_head=n_head, n_embd=n_embd, mlp_hidden=hf["intermediate_size"], embed_scale=False,
                tie_embeddings=hf.get("tie_word_embeddings", False))
    return GPTConfig(**(cfg | overrides))


# Per-layer tensor names: Hugging Face's (after "gpt_neox.layers.{i}." / "model.layers.{i}.") -> ours
# (after "layers.{i}."). Several names mapped to one of ours (q/k/v -> attn.qkv, gate/up -> mlp.up) are fused
# by concatenating their rows in the order they appear here.
HF_LAYER_NAMES = {
    "neox": {
        "input_layernorm": "ln1",
        "post_attention_layernorm": "ln2",
        "attention.dense": "attn.proj",
        "attention.query_key_value": "attn.qkv",
        "mlp.dense_h_to_4h": "mlp.up",
        "mlp.dense_4h_to_h": "mlp.down",
    },
    "llama": {
        "input_layernorm": "ln1",
        "post_attention_layernorm": "ln2",
        "self_attn.o_proj": "attn.proj",
        "self_attn.q_proj": "attn.qkv",
        "self_attn.k_proj": "attn.qkv",
        "self_attn.v_proj": "attn.qkv",
        "mlp.gate_proj": "mlp.up",
        "mlp.up_proj": "mlp.up",
        "mlp.down_proj": "mlp.down",
    },
}
HF_TOP_NAMES = {
    "neox": {"gpt_neox.embed_in": "wte", "gpt_neox.final_layer_norm": "ln_f", "embed_out": "lm_head"},
    "llama": {"model.embed_tokens": "wte", "model.norm": "ln_f", "lm_head": "lm_head"},
}
HF_LAYER_PREFIX = {"neox": "gpt_neox.layers.", "llama": "model.layers."}
# buffers that old NeoX checkpoints saved (the causal mask, rotary frequencies): recomputed here, never read
HF_IGNORED = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")


def neox_qkv_rows(t, n_head):
    """NeoX's fused query_key_value rows per head, [q_h, k_h, v_h] for h = 0..n_head-1, regrouped as ours,
    [q_0..q_{n-1}, k_0.., v_0..]. t: weight (3C, C) or bias (3C,)."""
    return t.unflatten(0, (n_head, 3, -1)).transpose(0, 1).flatten(0, 2)


def state_from_hf(tensors: dict, cfg: GPTConfig) -> dict:
    """A Hugging Face state dict (name -> tensor) as this model's: renamed (HF_LAYER_NAMES, HF_TOP_NAMES), q/k/v
    and SwiGLU gate/up fused by rows in the table's order, NeoX's per-head qkv regrouped (neox_qkv_rows). A tied
    model takes the embedding only: a saved lm_head must equal it. Raises ValueError naming a tensor that has
    no place in the model."""
    layer_names, prefix = HF_LAYER_NAMES[cfg.flavour], HF_LAYER_PREFIX[cfg.flavour]
    pieces = {}                                              # our name -> [(order, tensor), ...]
    for name, t in tensors.items():
        if name.endswith(HF_IGNORED):
            continue
        stem, kind = name.rsplit(".", 1)                     # kind: "weight" or "bias"
        if stem.startswith(prefix):                          # "model.layers.3.self_attn.k_proj"
            i, hf_name = stem[len(prefix):].split(".", 1)
            ours = layer_names.get(hf_name)
            order, key = list(layer_names).index(hf_name) if ours else 0, f"layers.{i}.{ours}.{kind}"
        else:
            ours, order = HF_TOP_NAMES[cfg.flavour].get(stem), 0
            key = f"{ours}.{kind}"
        if ours is None:
            raise ValueError(f"tensor {name!r} has no place in a {cfg.flavour} model")
        pieces.setdefault(key, []).append((order, neox_qkv_rows(t, cfg.n_head) if cfg.flavour == "neox"
                                           and ours == "attn.qkv" else t))
    state = {key: torch.cat([t for _, t in sorted(p, key=lambda x: x[0])]) for key, p in pieces.items()}
    if cfg.tie_embeddings and "lm_head.weight" in state and \
            not torch.equal(state.pop("lm_head.weight"), state.get("wte.weight")):
        raise ValueError("the config ties the output head to the embedding (tie_word_embeddings), but the "
                         "checkpoint's lm_head differs from its embedding")
    return state


def load_hf_weights(model, weight_files):
    """Copy the tensors of Hugging Face safetensors files into `model` (a GPT; cast to its dtype). Every tensor
    must find its place and shape, and every tensor of the model must be given, but a T²MLR gate (it keeps its
    identity initialisation). Raises ValueError naming the first problems."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ValueError("reading Hugging Face weights needs safetensors: pip install safetensors") from None
    state = state_from_hf({k: v for path in weight_files for k, v in load_file(path).items()}, model.cfg)
    tied = {"lm_head.weight"} if model.cfg.tie_embeddings else set()
    problems = state_differences(state, model.state_dict(), lambda k: k in tied or k.startswith("gate."))
    if problems:
        more = f" and {len(problems) - 4} more" if len(problems) > 4 else ""
        raise ValueError(f"the checkpoint does not fit this config: {', '.join(problems[:4])}{more}")
    model.load_state_dict(state, strict=False)


def from_pretrained(name_or_path: str, **overrides):
    """GPT.from_pretrained: a released model's config (config.json plus `overrides`) and weights."""
    from model import GPT
    hf_config, weight_files = hf_checkpoint(name_or_path)
    model = GPT(config_from_hf(hf_config, **overrides))
    load_hf_weights(model, weight_files)
    return model
