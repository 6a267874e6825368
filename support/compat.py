"""Compatibility: what older versions of this repository wrote keeps loading.

RENAMED_FIELDS maps an old GPTConfig key to its new name. A config file or --flag with an old name is
read under the new one, with a one-line note (configurator.load_config); a checkpoint's stored
model_config and a study's saved JSON are upgraded by upgrade_config. RENAMED_PARAMS maps an old
parameter-name prefix of a model state dict to its new one; support.checkpoints.load_checkpoint
applies upgrade_state_dict to every checkpoint it reads. Nothing here changes a value.
"""

RENAMED_FIELDS = {
    "jacobi_iters": "jacobi_sweeps",            # D, the Jacobi sweeps per step
    "jacobi_grad_iters": "jacobi_grad_sweeps",  # b, the sweeps before the final one that keep gradient
    "state_mode": "state_passing",              # MeSH paper §3.1: how the state passes between loops
    "state_residual": "recurrent_residual",     # T²MLR: R_t = s·(h_t + R_{t-1}) instead of h_t
    "state_detach": "recurrent_detach",         # T²MLR: no gradient along the R chain
}


def upgrade_config(stored: dict) -> dict:
    """A stored model-config dict with every renamed key under its new name (a new key already present
    wins). Returns a new dict; values are untouched."""
    upgraded = {RENAMED_FIELDS.get(k, k): v for k, v in stored.items() if k not in RENAMED_FIELDS}
    for old, new in RENAMED_FIELDS.items():
        if old in stored and new not in upgraded:
            upgraded[new] = stored[old]
    return upgraded


RENAMED_PARAMS = {
    "gate.gates_x.": "gate.A_on_x.",   # T²MLR gate: the columns of A acting on x_t, and the biases
    "gate.gates_r.": "gate.A_on_r.",   # T²MLR gate: the columns of A acting on r~ = W_p R_{t-1}
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
    return upgraded
