"""The first compiled training step (forward and backward, the compile included) of T²MLR against the plain
model of the same shape, compiled two ways, each in a fresh process with an empty inductor cache:
"whole" (torch.compile of the model: D Jacobi sweeps unrolled into one graph, as train.py compiled T²MLR
before support.runtime.compile_model) and "parts" (compile_model: each layer, the gate and the state
update once). Then the compiled exact prefill of T²MLR against plain's. Writes a JSON beside this file.

    python studies/results/compile_times.py tiny         # the bench.py tiny shapes, batch 4 x 256 tokens
    python studies/results/compile_times.py smollm2 300  # SmolLM2-135M's shape with T²MLR on 12..17, 1 x 64;
                                                         # a measurement past 300 s is stopped and recorded so
"""
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHAPES = {
    "tiny": (dict(flavour="llama", vocab_size=512, n_embd=128, n_head=4, n_layer=8, mlp_hidden=512),
             dict(l_start=2, l_end=5), (4, 256)),
    "smollm2": (dict(flavour="llama", vocab_size=49152, n_embd=576, n_head=9, n_kv_head=3, n_layer=30,
                     mlp_hidden=1536, rope_theta=100000.0), dict(l_start=12, l_end=17), (1, 64)),
}
ONE = """
import sys, time, json, torch
sys.path.insert(0, {root!r})
from model import GPT, GPTConfig, InferenceCache
from support.runtime import compile_model
fields, how, B, T, prefill = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.manual_seed(0)
model = GPT(GPTConfig(block_size=T, **fields))
run = torch.compile(model) if how == "whole" else compile_model(model)
x = torch.randint(0, fields["vocab_size"], (B, T))
if prefill == "yes":
    model.eval()
    times = []
    with torch.no_grad():
        for _ in range(4):
            t0 = time.perf_counter()
            run(x, cache=InferenceCache(model.cfg.n_unrolled))
            times.append(time.perf_counter() - t0)
    print(json.dumps({{"first_s": times[0], "later_s": sorted(times[1:])[1]}}))
else:
    t0 = time.perf_counter()
    run(x, x)[1].backward()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    run(x, x)[1].backward()
    print(json.dumps({{"first_s": first, "second_s": time.perf_counter() - t0}}))
"""


def one(fields, how, B, T, prefill=False, timeout=1800):
    """One measurement in a fresh process with its own empty inductor cache; None past `timeout` seconds."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
        try:
            done = subprocess.run([sys.executable, "-c", ONE.format(root=ROOT), json.dumps(fields), how, str(B),
                                   str(T), "yes" if prefill else "no"], env=env, capture_output=True, text=True,
                                  timeout=timeout, check=True)
        except subprocess.TimeoutExpired:
            return {"first_s": None, "timed_out_s": timeout}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(name, timeout=1800):
    shape, recurrent, (B, T) = SHAPES[name]
    t2mlr = dict(shape, **recurrent, t2mlr=True, jacobi_sweeps=16, jacobi_grad_sweeps=4)
    result = {"shape": name, "batch": B, "T": T, "threads": os.cpu_count(), "timeout_s": timeout, "rows": []}
    for how, variant, fields in (("parts", "plain", shape), ("parts", "t2mlr", t2mlr), ("whole", "t2mlr", t2mlr)):
        # (plain: compile_model compiles the whole model, so its "whole" is the same)
        t0 = time.time()
        r = one(fields, how, B, T, timeout=timeout)
        print(f"{how:5s} {variant:5s} first step {r['first_s']} s (took {time.time() - t0:.0f} s)", flush=True)
        result["rows"].append(dict(r, how=how, variant=variant, step="train"))
    for variant, fields in (("plain", shape), ("t2mlr", t2mlr)):
        r = one(fields, "parts", B, T, prefill=True, timeout=timeout)
        print(f"parts {variant:5s} exact prefill {r}", flush=True)
        result["rows"].append(dict(r, how="parts", variant=variant, step="prefill"))
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"compile_times_{name}.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny", int(sys.argv[2]) if len(sys.argv) > 2 else 1800)
