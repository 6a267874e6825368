"""Compiling what repeats (support.runtime.compile_model): T²MLR compiles each layer, the gate and the state
update once, whatever D sweeps or T tokens run, and compiled equals eager (slow tier: inductor's C++ build)."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from model import GPT, GPTConfig, InferenceCache
from support.runtime import compile_model

pytestmark = pytest.mark.slow
T2MLR = dict(flavour="llama", vocab_size=64, block_size=64, n_layer=4, n_embd=32, n_head=4, mlp_hidden=64,
             t2mlr=True, l_start=1, l_end=2, jacobi_sweeps=4, jacobi_grad_sweeps=2)


def graphs():
    return counters["stats"]["unique_graphs"]


def test_t2mlr_compiles_each_part_once_whatever_the_sweeps_and_tokens():
    """Graphs compiled (aot_eager: dynamo's capture, without code generation): a Jacobi step with D = 4 then
    D = 8 sweeps; an exact prefill and decoding of 6 tokens, then of 12 (the KV cache's length dynamic after
    its second value). The second of each compiles nothing new."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = compile_model(GPT(GPTConfig(**T2MLR)), backend="aot_eager")
    idx = torch.randint(0, 64, (2, 16))
    model(idx, idx)[1].backward()
    after_d4 = graphs()
    model.cfg.jacobi_sweeps = 8
    model(idx, idx)[1].backward()
    assert graphs() == after_d4 > 0
    model.eval()
    with torch.no_grad():
        for n in (6, 12):
            cache = InferenceCache(model.cfg.n_unrolled)
            model(idx[:, :n], cache=cache, mode="exact")
            for t in range(n, n + 3):
                model(idx[:, t:t + 1], cache=cache)
            if n == 6:
                after_short = graphs()
    assert graphs() == after_short


def test_compiled_t2mlr_equals_eager():
    """Inductor on the CPU against eager, float32: a Jacobi training step's loss and gradients, an exact
    prefill's logits and three cached decoding steps, and greedy generation of two prompts of different
    lengths (generate runs the model's own parts, compiled in place)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = GPT(GPTConfig(**T2MLR))
    compiled_model = GPT(GPTConfig(**T2MLR))
    compiled_model.load_state_dict(eager.state_dict())
    compiled = compile_model(compiled_model)
    idx = torch.randint(0, 64, (2, 12))
    losses = []
    for m in (eager, compiled):
        loss = m(idx, idx)[1]
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    eager.eval(), compiled_model.eval()
    with torch.no_grad():
        outs = []
        for m in (eager, compiled):
            cache = InferenceCache(eager.cfg.n_unrolled)
            steps = [m(idx[:, :8], cache=cache)[0]] + [m(idx[:, t:t + 1], cache=cache)[0] for t in range(8, 11)]
            outs.append(torch.cat(steps, dim=1))
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-5)
        assert torch.equal(compiled_model.generate([idx[0, :5], idx[1, :9]], 6, temperature=0)[1],
                           eager.generate([idx[1, :9]], 6, temperature=0)[0])
