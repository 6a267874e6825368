"""Batched generation (model.GPT.generate): prompts of different lengths, left-padded, give each row what
it gets alone (greedy, token for token), for every variant, with stops, a window that slides past
block_size, loop counts and exits at test time, and T²MLR's prefill modes."""

import pytest
import torch

from model import GPT, GPTConfig

TINY = dict(vocab_size=64, block_size=24, n_embd=32, n_head=4)
VARIANTS = {"vanilla": dict(n_layer=4), "base": dict(layout="1+1R2+1"),
            "mesh": dict(layout="1+1R2+1", state_passing="mesh"),
            "t2mlr": dict(flavour="llama", n_layer=4, mlp_hidden=64, t2mlr=True, l_start=1, l_end=2,
                          jacobi_sweeps=4, recurrent_residual=True)}
CASES = {"vanilla": [{}, dict(stop_token=5)],
         "base": [{}, dict(stop_token=5), dict(n_loops=3), dict(exit_threshold=0.3)],
         "mesh": [{}, dict(stop_token=5), dict(n_loops=3), dict(exit_threshold=0.3)],
         "t2mlr": [{}, dict(stop_token=5), dict(prefill="converged"), dict(recurrent_prompt=True)]}


@pytest.mark.parametrize("name,settings", [(n, c) for n, cs in CASES.items() for c in cs])
def test_batch_of_different_lengths_equals_each_prompt_alone(name, settings):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, **VARIANTS[name])).eval().double()
    prompts = [torch.randint(0, 64, (n,)) for n in (3, 9, 1, 6)]
    batch = model.generate(prompts, 25, temperature=0, **settings)     # 9 + 25 > block_size: it slides
    alone = [model.generate([p], 25, temperature=0, **settings)[0] for p in prompts]
    for b, a, p in zip(batch, alone, prompts):
        assert torch.equal(b, a) and torch.equal(b[:len(p)], p)


@pytest.mark.parametrize("name", VARIANTS)
def test_each_rows_logits_equal_its_prompt_alone(name):
    """The cache of a left-padded batch gives each row the logits of its prompt alone, to float tolerance:
    the prompt's last position, then three decoding steps."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, **VARIANTS[name])).eval()
    from model import InferenceCache
    n = model.cfg.n_unrolled
    prompts = [torch.randint(0, 64, (k,)) for k in (2, 7, 5)]
    T, new = 7, torch.randint(0, 64, (3, 3))
    pads = torch.tensor([T - len(p) for p in prompts])
    idx = torch.stack([torch.cat([torch.zeros(T - len(p), dtype=torch.long), p]) for p in prompts])
    control = (torch.arange(T) >= pads[:, None]).long() * 2
    cache = InferenceCache(n, pads)
    steps = [model(idx, cache=cache, control=control)[0][:, -1]]
    steps += [model(new[:, i:i + 1], cache=cache)[0][:, -1] for i in range(3)]
    for b, p in enumerate(prompts):
        alone = InferenceCache(n)
        want = [model(p[None], cache=alone)[0][0, -1]]
        want += [model(new[b:b + 1, i:i + 1], cache=alone)[0][0, -1] for i in range(3)]
        for got, ref in zip(steps, want):
            torch.testing.assert_close(got[b], ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", VARIANTS)
def test_seeded_sampling_is_reproducible_and_the_seed_matters(name):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, **VARIANTS[name])).eval()
    prompts = [torch.randint(0, 64, (n,)) for n in (4, 2, 7)]

    def draw(seed):
        return model.generate(prompts, 12, temperature=1.0, top_k=20, generator=torch.Generator().manual_seed(seed))
    first, again, other = draw(1), draw(1), draw(2)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert any(not torch.equal(a, b) for a, b in zip(first, other))


@pytest.mark.parametrize("name", VARIANTS)
def test_rows_that_stop_at_different_steps_are_never_changed_again(name):
    """A padded tensor with lengths: rows stop at different steps; each row equals its prompt alone up to
    and including its stop, then holds stop_token; the list form returns each through its stop."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, **VARIANTS[name])).eval().double()
    prompts = [torch.randint(0, 64, (n,)) for n in (5, 2, 8, 3)]
    free = [model.generate([p], 10, temperature=0)[0][len(p):] for p in prompts]   # no stop token
    stop = int(free[1][2])                    # row 1 stops at its third new token; others when they meet it
    T = max(len(p) for p in prompts)
    padded = torch.stack([torch.cat([torch.zeros(T - len(p), dtype=torch.long), p]) for p in prompts])
    out = model.generate(padded, 10, temperature=0, lengths=[len(p) for p in prompts], stop_token=stop)
    listed = model.generate(prompts, 10, temperature=0, stop_token=stop)
    ends = []
    for b, (p, f) in enumerate(zip(prompts, free)):
        hits = (f == stop).nonzero()
        end = int(hits[0]) + 1 if len(hits) else len(f)          # new tokens through the stop
        ends.append(end)
        new = out[b, T:]
        assert torch.equal(new[:end], f[:end]) and (new[end:] == stop).all()
        assert torch.equal(listed[b], torch.cat([p, f[:end]]))
    assert len(set(ends)) > 1, ends                          # the rows did stop at different steps
    assert out.shape[1] <= T + 10


def test_generation_ends_when_every_row_has_stopped():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, **VARIANTS["vanilla"])).eval()
    p = torch.randint(0, 64, (4,))
    first = int(model.generate([p], 1, temperature=0)[0][-1])
    out = model.generate(p[None], 50, temperature=0, stop_token=first)
    assert out.shape == (1, 5) and int(out[0, -1]) == first


def test_bad_input_is_named():
    model = GPT(GPTConfig(**TINY, **VARIANTS["vanilla"])).eval()
    with pytest.raises(ValueError, match=r"^prompt lengths \[3, 0\] must be one per row, in 1\.\.3$"):
        model.generate([torch.tensor([1, 2, 3]), torch.tensor([], dtype=torch.long)], 2)
    with pytest.raises(ValueError, match=r"^stop_token = 64 must be a token id or None$"):
        model.generate([torch.tensor([1, 2])], 2, stop_token=64)
    with pytest.raises(ValueError, match=r"^prompt lengths \[2, 5\] must be one per row, in 1\.\.4$"):
        model.generate(torch.zeros(2, 4, dtype=torch.long), 2, lengths=[2, 5])
    with pytest.warns(UserWarning, match=r"^a 30-token prompt > block_size: last 24 kept$"):
        out = model.generate([torch.randint(0, 64, (30,))], 2, temperature=0)
    assert len(out[0]) == 32
