"""Compatibility: what older versions of this repository wrote keeps loading.

RENAMED_FIELDS maps an old GPTConfig key to its new name. A config file or --flag with an old name is
read under the new one, with a one-line note (configurator.load_config); a checkpoint's stored
model_config and a study's saved JSON are upgraded by upgrade_config. RENAMED_VALUES maps a field's old
value to its new name, read alike (a value renamed, never changed). RENAMED_PARAMS maps an old
parameter-name prefix of a model state dict to its new one, and the T²MLR gate's A, once stored by the
input its columns act on, is joined into one matrix; support.checkpoints.load_checkpoint applies
upgrade_state_dict to every checkpoint it reads. Nothing here changes a value.
"""

import torch

RENAMED_FIELDS = {
    "jacobi_iters": "jacobi_sweeps",            # D, the Jacobi sweeps per step
    "jacobi_grad_iters": "jacobi_grad_sweeps",  # b, the sweeps before the final one that keep gradient
    "state_mode": "state_passing",              # MeSH paper §3.1: how the state passes between loops
    "state_residual": "recurrent_residual",     # T²MLR: R_t = s·(h_t + R_{t-1}) instead of h_t
    "state_detach": "recurrent_detach",         # T²MLR: no gradient along the R chain
}

RENAMED_VALUES = {
    "weight_init": {"reference": "normal_0.02"},   # the T²MLR code's N(0, 0.02²) for every weight
    "jacobi_init": {"plain": "ungated"},           # R^(0) from one pass of the middle layers, ungated
}


def renamed_value(key: str, value):
    """The new name of `value` for the field `key`, or `value` itself if it was never renamed."""
    return RENAMED_VALUES.get(key, {}).get(value, value) if isinstance(value, str) else value


def upgrade_config(stored: dict, note=None) -> dict:
    """A stored model-config dict with every renamed key under its new name (a new key already present
    wins) and every renamed value under its new name; note(text), if given, hears one line a renamed
    value. Returns a new dict; no setting changes."""
    upgraded = {RENAMED_FIELDS.get(k, k): v for k, v in stored.items() if k not in RENAMED_FIELDS}
    for old, new in RENAMED_FIELDS.items():
        if old in stored and new not in upgraded:
            upgraded[new] = stored[old]
    for key, value in upgraded.items():
        if note is not None and renamed_value(key, value) != value:
            note(f"{key} {value!r} is now called {renamed_value(key, value)!r} (the same setting)")
    return {k: renamed_value(k, v) for k, v in upgraded.items()}


RENAMED_PARAMS = {
    "gate.gates_x.": "gate.A_on_x.",   # T²MLR gate: the columns of A acting on x_t, and the biases
    "gate.gates_r.": "gate.A_on_r.",   # T²MLR gate: the columns of A acting on r~ = W_p R_{t-1}
    "gate.proj.": "gate.W_p.",         # T²MLR gate: W_p
}


def upgrade_state_dict(state: dict) -> dict:
    """A model state dict with every key that starts with an old prefix of RENAMED_PARAMS under its
    new name (a new key already present wins). Returns a new dict in the same order; tensors are
    untouched."""
    upgraded = {}
    for key, value in state.items():
        new = next((n + key[len(o):] for o, n in RENAMED_PARAMS.items() if key.startswith(o)), key)
        if new == key or new not in state:
            upgraded[new] = value
    return join_gate_columns(upgraded)


def join_gate_columns(state: dict) -> dict:
    """The T²MLR gate's A (2C x 2C, acting on g = [x; r~]) from its two stored halves: A_on_x (its x
    columns, with the biases [b_r; b_x]) and A_on_r (its r~ columns). A state dict without them is
    returned as it is."""
    if "gate.A_on_x.weight" not in state or "gate.A.weight" in state:
        return state
    joined = {}
    for key, value in state.items():
        if key == "gate.A_on_x.weight":
            joined["gate.A.weight"] = torch.cat([value, state["gate.A_on_r.weight"]], dim=1)
        elif key == "gate.A_on_x.bias":
            joined["gate.A.bias"] = value
        elif not key.startswith("gate.A_on_r."):
            joined[key] = value
    return joined
