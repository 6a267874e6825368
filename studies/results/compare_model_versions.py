"""Another version of model.py against this repository's, side by side in one process: the same weights,
round robin (the order alternating), medians of the per-round times and of the per-round ratios; the
short measures (prefill, exact evaluation, decode) take the fastest of 3 calls per round.

    git worktree add /tmp/before a327fb5     # the version to compare with
    python studies/results/compare_model_versions.py /tmp/before/model.py 9     # 9 rounds, the first unmeasured

An older model.py may know config keys by their old names (support/compat.py): both are handled."""
import importlib.util, os, statistics, sys, time, torch
HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the root
sys.path.insert(0, HERE)
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path); m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m; spec.loader.exec_module(m); return m
old = load("model_old", sys.argv[1]); new = load("model_new", os.path.join(HERE, "model.py"))
from support.compat import RENAMED_FIELDS
OLD_NAME = {new_name: old_name for old_name, new_name in RENAMED_FIELDS.items()}
torch.manual_seed(0)
base = dict(flavour="llama", vocab_size=512, n_embd=128, n_head=4, n_layer=8, mlp_hidden=512, block_size=256)
t2 = dict(t2mlr=True, l_start=2, l_end=5)
def pair(**kw):
    fields = old.GPTConfig.__dataclass_fields__          # an older model.py knows some keys by old names
    oc = {(k if k in fields else OLD_NAME[k]): v for k, v in kw.items()}
    mo = old.GPT(old.GPTConfig(**oc)); mn = new.GPT(new.GPTConfig(**kw)); mn.load_state_dict(mo.state_dict())
    if mo.gate is not None:
        with torch.no_grad():
            for m in (mo, mn): m.gate.theta_r.fill_(0.5); m.gate.theta_x.fill_(0.5)
    return mo.eval(), mn.eval()
pl_o, pl_n = pair(**base); t_o, t_n = pair(**base, **t2)
mesh_o, mesh_n = pair(
    flavour="neox", vocab_size=320, n_embd=128, n_head=4, layout="2+2R2+2", state_passing="mesh", block_size=256
)
van_o, van_n = pair(flavour="neox", vocab_size=320, n_embd=128, n_head=4, n_layer=8, block_size=256)
g = torch.Generator().manual_seed(1)
idx = torch.randint(0, 320, (4, 256), generator=g); prompt = torch.randint(0, 320, (4, 64), generator=g)
def new_cache(m):      # an older model.py has GPT.new_cache; this one an InferenceCache class
    return m.new_cache() if hasattr(m, "new_cache") else sys.modules[type(m).__module__].InferenceCache(m.cfg.n_unrolled)
def train_step(m):
    m.train(); t0 = time.perf_counter(); _, loss = m(idx, idx); loss.backward(); m.zero_grad(); m.eval()
    return time.perf_counter() - t0
@torch.no_grad()
def prefill(m):
    c = new_cache(m); t0 = time.perf_counter(); m(prompt, cache=c); return time.perf_counter() - t0
@torch.no_grad()
def decode(m):
    c = new_cache(m); m(prompt[:1], cache=c); tok = prompt[:1, -1:]
    t0 = time.perf_counter()
    for _ in range(32): m(tok, cache=c)
    return (time.perf_counter() - t0) / 32
@torch.no_grad()
def exact_nocache(m):
    t0 = time.perf_counter(); m(prompt, mode="exact"); return time.perf_counter() - t0
def best_of_3(fn):    # the short measures (tens of ms): the fastest of 3 calls per round, less scheduler noise
    return lambda m: min(fn(m) for _ in range(3))
prefill, decode, exact_nocache = best_of_3(prefill), best_of_3(decode), best_of_3(exact_nocache)
tests = {"train vanilla": (train_step, van_o, van_n), "train mesh": (train_step, mesh_o, mesh_n),
         "train plain": (train_step, pl_o, pl_n), "train t2mlr jacobi": (train_step, t_o, t_n),
         "prefill t2mlr 4x64 (cache)": (prefill, t_o, t_n), "prefill plain 4x64": (prefill, pl_o, pl_n),
         "exact t2mlr 4x64 (no cache)": (exact_nocache, t_o, t_n),
         "decode t2mlr per token": (decode, t_o, t_n), "decode plain per token": (decode, pl_o, pl_n)}
R = {k: ([], []) for k in tests}
for r in range(int(sys.argv[2]) if len(sys.argv) > 2 else 7):
    for k, (fn, mo, mn) in tests.items():
        a, b = (fn(mo), fn(mn)) if r % 2 == 0 else tuple(reversed((fn(mn), fn(mo))))
        if r: R[k][0].append(a); R[k][1].append(b)
for k, (a, b) in R.items():
    ratios = [y / x for x, y in zip(a, b)]
    print(
        f"{k:32s} old {1e3*statistics.median(a):8.2f} ms  new {1e3*statistics.median(b):8.2f} ms  "
        f"new/old {statistics.median(ratios):.3f}"
    )
for name, (ot, nt), (op, np_) in [
    ("T²MLR jacobi / plain step", (R["train t2mlr jacobi"]), (R["train plain"])),
    ("T²MLR prefill / plain", R["prefill t2mlr 4x64 (cache)"], R["prefill plain 4x64"]),
    ("T²MLR decode / plain", R["decode t2mlr per token"], R["decode plain per token"]),
    ("MeSH / vanilla step", R["train mesh"], R["train vanilla"]),
]:
    ro = statistics.median([a / b for a, b in zip(ot, op)])
    rn = statistics.median([a / b for a, b in zip(nt, np_)])
    print(f"{name:32s} old {ro:.3f}  new {rn:.3f}  new/old {rn/ro:.3f}")
