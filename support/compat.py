"""Compatibility: what older versions of this repository wrote keeps loading.

RENAMED_FIELDS maps an old GPTConfig key to its new name. A config file or --flag with an old name is
read under the new one, with a one-line note (configurator.load_config); a checkpoint's stored
model_config and a study's saved JSON are upgraded by upgrade_config. Nothing here changes a value.
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
