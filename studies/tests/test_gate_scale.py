"""
studies/gate_scale.py: the RMS ratio it reports equals the direct one.
"""
import math

import pytest
import torch

from test_gate import tiny_t2mlr


def direct_ratio(model, idx, control=None):
    """RMS(W_p R_{t-1}) / RMS(x_t) computed directly at θ = 0 (the gate an identity, so the middle layers' h
    does not depend on R): x = the lower layers' output, h = the middle layers on x, R_t = s·(h_t + R_{t-1})
    at a recurrent token (the raw h_t at another), over t >= 1 with c_t >= 2 (all t without control)."""
    with torch.no_grad():
        h_emb = model.wte(idx) * (math.sqrt(model.cfg.n_embd) if model.cfg.embed_scale else 1.0)
        x = model.run_layers(h_emb, model.lower, 0)
        h = model.run_layers(x, model.middle, 0)
        B, T, C = x.shape
        R, rs, xs = torch.zeros(B, C, dtype=x.dtype), [], []
        for t in range(T):
            keep = torch.ones(B, dtype=torch.bool) if control is None else control[:, t] >= 2
            if t >= 1:
                rs.append(model.gate.W_p(R)[keep])
                xs.append(x[:, t][keep])
            u = h[:, t] + R
            s = u.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt().clamp(0.2, 5.0)
            R = torch.where(keep.unsqueeze(-1), u * s, h[:, t])
        rs, xs = torch.cat(rs), torch.cat(xs)
        return (rs.pow(2).mean().sqrt() / xs.pow(2).mean().sqrt()).item()


@pytest.mark.parametrize("init", [{}, {"weight_init": "normal_0.02", "embed_scale": False}])
def test_gate_scale_reports_the_direct_ratio(init):
    from studies.gate_scale import gate_ratio
    model = tiny_t2mlr(**init).double()
    idx = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(4))
    ratio, rms_r, rms_x = gate_ratio(model, idx)
    assert ratio == pytest.approx(direct_ratio(model, idx), rel=1e-9)
    assert ratio == pytest.approx(rms_r / rms_x, rel=1e-12)
    control = torch.ones(3, 12, dtype=torch.long)
    control[0, 4:], control[1, 7:], control[2, 2:] = 2, 2, 2      # a prompt of 4, 7, 2 tokens, then recurrent
    assert gate_ratio(model, idx, control)[0] == pytest.approx(direct_ratio(model, idx, control), rel=1e-9)


def test_the_t2mlr_codes_initialisation_starts_the_recurrent_branch_far_larger():
    """At C = 128 (the tiny configs' width): ours about 0.9, the T²MLR code's above 5 (RMS(x) ~ 0.02·√(1+...))."""
    from studies.gate_scale import gate_ratio
    keys = dict(vocab_size=188, n_layer=4, n_embd=128, n_head=4, mlp_hidden=512, block_size=64, l_start=1,
                l_end=2)
    idx = torch.randint(0, 188, (2, 64), generator=torch.Generator().manual_seed(5))
    ours = gate_ratio(tiny_t2mlr(**keys), idx)[0]
    normal = gate_ratio(tiny_t2mlr(**keys, weight_init="normal_0.02", embed_scale=False), idx)[0]
    assert 0.6 < ours < 1.3 and normal > 5
