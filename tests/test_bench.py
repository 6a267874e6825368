"""
Smoke test of bench.py: one round of every measurement on the tiny models with a short training batch,
checking that bench.json has every key the README table reads. Run: python -m pytest -q test_bench.py
"""

import json
import weakref
from contextlib import nullcontext

import pytest
import torch

import bench


@pytest.mark.slow
def test_bench_runs_and_writes_every_key(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(["--repeats", "1", "--warmup", "0", "--batch_size", "1", "--seq_len", "64", "--out", str(out),
                "--prefill_lengths", "8", "24", "--prefill_tol", "0"])
    r = json.loads(out.read_text())
    assert set(r["variants"]) == {"vanilla", "base", "mesh", "plain", "t2mlr", "t2mlr_tol", "t2mlr_ckpt"}
    for v in r["variants"].values():
        for key in ("fwd_bwd_ms", "step_ms", "fwd_bwd_ratio", "memory_mb", "memory_ratio", "mfu_fwd_bwd",
                    "decode_ms_per_token", "decode_ratio", "flop_ratio"):
            assert v[key] > 0, key
    assert r["variants"]["vanilla"]["fwd_bwd_ratio"] == 1.0 and r["variants"]["plain"]["decode_ratio"] == 1.0
    # b+1 copies of the middle layers
    assert r["variants"]["t2mlr"]["memory_mb"] > r["variants"]["plain"]["memory_mb"]
    assert set(r["targets"]) == {
        "t2mlr_jacobi",
        "t2mlr_decode",
        "t2mlr_prefill",
        "mesh_vs_base",
        "vanilla_mfu",
    }
    assert r["prefill"]["tokens"] == [4, 64] and r["matmul_peak_flops"] > 0
    e = r["exit_decode"]                # the default threshold saves loops on both untrained models
    assert e["exit_threshold"] == 0.3 and e["loops_full"] == 2
    assert all(1 <= e[n]["mean_loops"] < 2 and e[n]["vs_full"] > 0 for n in ("base", "mesh"))
    o = r["jacobi_options"]
    # fewer bytes held
    assert 1 < o["tol"]["passes_mean"] <= 16 and o["checkpoint"]["memory_vs_fixed"] < 1
    assert [p["tokens"] for p in r["jacobi_prefill"]] == [8, 24]
    # tol 0: sweeps to the exactness front, T passes
    for p in r["jacobi_prefill"]:
        assert p["passes"] == p["tokens"] and p["max_logit_diff"] < 1e-3 and p["ratio"] > 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "| vanilla |" in printed and "| 24 tokens | 24 |" in printed
    # every target line: what was measured, the target, met or not, and why it matters
    for key, desc, bound, op, why in bench.TARGETS:
        line = next(row for row in printed.splitlines() if row.startswith(f"| {desc} |"))
        assert f"{op} " in line and why in line and (("| met |" in line) == r["targets"][key]["met"])
    g = r["batched_generation"]              # 16 prompts of different lengths: one batch and one at a time
    assert g["prompts"] == 16 and g["lengths"] == [8, 64] and set(g) >= set(bench.GENERATION)
    assert all(g[n]["batched_tok_s"] > 0 and g[n]["alone_tok_s"] > 0 and g[n]["speedup"] > 0 for n in bench.GENERATION)
    assert "| generation: 16 prompts of 8..64 tokens" in printed
    for stage in ("1/6 training steps", "2/6 decoding", "3/6 batched generation", "4/6 exact prefill",
                  "5/6 Jacobi prefill"):
        assert stage in captured.err                 # the progress bars (stderr)


class LinearChain(torch.nn.Module):
    """L x (Linear(d, d), tanh); loss = sum of the output. Autograd saves the input x and every tanh output
    (each next Linear saves the same tensor as its input; weights are parameters; sum saves nothing): by
    hand, (L + 1) * B * d * 4 bytes. `dead` graphs are built first and discarded (tanh of the first layer)."""

    def __init__(self, L=3, d=64, dead=0):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(L))
        self.dead, self.discarded = dead, []

    def forward(self, x, y):
        for _ in range(self.dead):
            # never used: backward never visits it
            self.discarded.append(weakref.ref(torch.tanh(self.layers[0](x))))
        h = x
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return h, h.sum()


def chain_memory(dead):
    torch.manual_seed(0)
    model = LinearChain(dead=dead).float()          # float32 by hand, whatever the default dtype
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(32, 64, dtype=torch.float32)
    return bench.train_memory_mb(model, optimizer, x, None, "cpu", nullcontext()), model


def test_memory_figure_counts_a_linear_chain_by_hand():
    (memory, activations), model = chain_memory(dead=0)
    n_params = sum(p.numel() for p in model.parameters())
    assert activations * 2**20 == (3 + 1) * 32 * 64 * 4
    assert memory * 2**20 == (3 + 1) * 32 * 64 * 4 + 16 * n_params


def test_discarded_graphs_neither_count_nor_stay_alive():
    """Graphs built and discarded during the step (5 of them, each holding a 32 x 64 tanh output) leave the
    figure exactly that of a fresh measurement, and are freed: the meter's hook must not keep them alive."""
    fresh, _ = chain_memory(dead=0)
    (memory, activations), model = chain_memory(dead=5)
    assert (memory, activations) == fresh
    assert len(model.discarded) == 5 and all(ref() is None for ref in model.discarded)


def test_meter_releases_what_backward_used():
    """After backward nothing is held any more (live 0), and the peak is what was held when backward began."""
    model = LinearChain().float()
    with bench.SavedTensorMeter(exclude=model.parameters()) as meter:
        _, loss = model(torch.randn(8, 64, dtype=torch.float32), None)
    assert meter.live == meter.peak == 4 * 8 * 64 * 4
    loss.backward()
    assert meter.live == 0 and meter.peak == 4 * 8 * 64 * 4
