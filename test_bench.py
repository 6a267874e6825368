"""
Smoke test of bench.py: one round of every measurement on the tiny models with a short training batch,
checking that bench.json has every key the README table reads. Run: python -m pytest -q test_bench.py
"""

import json

import bench


def test_bench_runs_and_writes_every_key(tmp_path, capsys):
    out = tmp_path / "bench.json"
    bench.main(["--repeats", "1", "--warmup", "0", "--batch_size", "1", "--seq_len", "64", "--out", str(out)])
    r = json.loads(out.read_text())
    assert set(r["variants"]) == {"vanilla", "base", "mesh", "plain", "t2mlr"}
    for v in r["variants"].values():
        for key in ("fwd_bwd_ms", "step_ms", "fwd_bwd_ratio", "memory_mb", "memory_ratio", "mfu_fwd_bwd",
                    "decode_ms_per_token", "decode_ratio", "flop_ratio"):
            assert v[key] > 0, key
    assert r["variants"]["vanilla"]["fwd_bwd_ratio"] == 1.0 and r["variants"]["plain"]["decode_ratio"] == 1.0
    assert r["variants"]["t2mlr"]["memory_mb"] > r["variants"]["plain"]["memory_mb"]   # b+1 copies of the middle block
    assert set(r["targets"]) == {"t2mlr_jacobi", "t2mlr_decode", "t2mlr_prefill", "mesh_vs_base", "vanilla_mfu"}
    assert r["prefill"]["tokens"] == [4, 64] and r["matmul_peak_flops"] > 0
    assert "| vanilla |" in capsys.readouterr().out
