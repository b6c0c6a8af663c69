"""The C step ops (norm, rotary + K/V write, attention, gated activation): close to PyTorch's
formulas, bitwise row-invariant, bitwise the same on every instruction-set path, and a
token tree's row bitwise the chain row over the same keys; the model's CPU float32 route
through them gives the logits of the PyTorch route."""
from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from promptlookup.runtime import kernels
from promptlookup.runtime.kernels import step_ops
from promptlookup.runtime.rotary import apply_rotary

if not step_ops.available():
    if os.environ.get("PLD_REQUIRE_NATIVE") == "1":
        pytest.fail("the C step ops are not built; PLD_REQUIRE_NATIVE=1 requires them", pytrace=False)
    pytest.skip("the C step ops are not built (make native)", allow_module_level=True)

H, KVH, D, S = 6, 2, 32, 256


@pytest.fixture(autouse=True)
def widest_path():
    yield
    kernels.set_isa(None)


def levels() -> list[str]:
    return list(kernels.available_isas())


def pools(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(KVH, S, D, generator=g), torch.randn(KVH, S, D, generator=g)


def sdpa(q: torch.Tensor, pk: torch.Tensor, pv: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor | None,
         scale: float) -> torch.Tensor:
    """Reference: q [rows, H, D] of one sequence over the keys at ``slots``."""
    keys, values = pk[:, slots].unsqueeze(0), pv[:, slots].unsqueeze(0)
    out = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), keys, values,
                                         attn_mask=None if mask is None else mask.unsqueeze(0).unsqueeze(0),
                                         scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


def tiny_llama(seed: int, vocab: int, hidden: int, intermediate: int, layers: int, max_positions: int,
               needs_layers: bool = False):
    """A random Hugging Face Llama of 4 heads over 2 KV heads (``needs_layers``: the test skips
    where ``step_ops.layers`` cannot run)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if needs_layers and not step_ops.runs_layers():
        pytest.skip("the products' C module is not built")
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions)
    return LlamaForCausalLM(config).eval()


def test_exp_is_within_two_ulp_of_exp():
    xs = torch.linspace(-87.0, 88.0, 20001, dtype=torch.float64)
    got = torch.tensor([step_ops.exp(float(x)) for x in xs], dtype=torch.float64)
    want = torch.exp(xs.float().double())
    assert ((got - want).abs() / want).max() < 2.5e-7
    assert step_ops.exp(-1000.0) < 1e-37 and step_ops.exp(1000.0) < float("inf")


@pytest.mark.parametrize("level", levels())
def test_exp_on_vector_lanes_is_exp_one_bitwise(level):
    """SiLU and the softmax take e^x 8 or 16 lanes at a time (exp_block_*: intrinsics on the
    x86 paths, GCC's vector lanes on the generic one); each lane must be exactly the scalar
    exp_one's value, across the clamps (below -87.34, above 88) too."""
    kernels.set_isa(level)
    specials = [-1000.0, -200.0, -88.0, -87.4, -87.33654, -50.5, -1.0, -1e-30, -0.0, 0.0, 1e-30, 0.5, 3.25,
                40.0, 87.9, 88.0, 88.5, 200.0]
    g = torch.cat([torch.tensor(specials), torch.linspace(-100.0, 100.0, 483)]).float()  # 501: a tail of 5
    up = torch.ones_like(g)
    got = step_ops.silu_mul(torch.cat([g, up]).view(1, -1))[0]
    e = torch.tensor([step_ops.exp(float(-x)) for x in g], dtype=torch.float32)
    assert torch.equal(got, g / (1.0 + e))  # float32 operations, one rounding each, as in C


@pytest.mark.parametrize("level", levels())
def test_norm_and_activation_equal_the_formulas_and_are_row_invariant(level):
    kernels.set_isa(level)
    g = torch.Generator().manual_seed(1)
    h, delta, w = torch.randn(7, 200, generator=g), torch.randn(7, 200, generator=g), torch.randn(200, generator=g)
    summed = h + delta
    y = step_ops.rms_norm(h, w, 1e-5, delta=delta)
    assert torch.equal(h, summed)  # the residual add, in place, exactly
    want = w * (summed * torch.rsqrt(summed.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    for r in range(7):
        assert torch.equal(step_ops.rms_norm(summed[r : r + 1].clone(), w, 1e-5), y[r : r + 1])
    gu = torch.randn(5, 2 * 300, generator=g) * 6
    act = step_ops.silu_mul(gu)
    torch.testing.assert_close(act, F.silu(gu[:, :300]) * gu[:, 300:], rtol=1e-5, atol=1e-6)
    assert torch.equal(step_ops.silu_mul(gu[3:4].clone()), act[3:4])


def test_rotary_write_is_apply_rotary_bitwise_and_writes_the_pool():
    g = torch.Generator().manual_seed(2)
    rows = 5
    qkv = torch.randn(rows, (H + 2 * KVH) * D, generator=g)
    cos, sin = torch.randn(64, D, generator=g), torch.randn(64, D, generator=g)
    positions = torch.tensor([3, 9, 10, 11, 40])
    slots = torch.tensor([100, 7, 8, 200, 31])
    pk, pv = torch.zeros(KVH, S, D), torch.zeros(KVH, S, D)
    q = step_ops.rotary_write(qkv, cos, sin, positions, slots, pk, pv, H)
    c, s = cos[positions].unsqueeze(1), sin[positions].unsqueeze(1)
    heads = qkv.view(rows, H + 2 * KVH, D)
    assert torch.equal(q, apply_rotary(heads[:, :H], c, s))
    assert torch.equal(pk[:, slots].transpose(0, 1), apply_rotary(heads[:, H : H + KVH], c, s))
    assert torch.equal(pv[:, slots].transpose(0, 1), heads[:, H + KVH :])
    assert pk.abs().sum(-1).ne(0).sum() == rows * KVH  # nothing else written


@pytest.mark.parametrize("level", levels())
def test_attention_equals_sdpa_for_one_row_chains_and_batches(level):
    kernels.set_isa(level)
    pk, pv = pools()
    g = torch.Generator().manual_seed(3)
    scale = D**-0.5
    # one row over a contiguous run of keys
    q = torch.randn(1, H, D, generator=g)
    got = step_ops.attention(q, pk, pv, 1, 70, scale, start=20)
    torch.testing.assert_close(got, sdpa(q, pk, pv, torch.arange(20, 90), None, scale), rtol=1e-5, atol=1e-5)
    # a chain of 4 rows ending at key 50, read through slots
    q4 = torch.randn(4, H, D, generator=g)
    slots = torch.randperm(S, generator=g)[:50]
    mask = torch.ones(4, 50, dtype=torch.bool).tril_(diagonal=46)
    got = step_ops.attention(q4, pk, pv, 1, 50, scale, slots.view(1, 50), mask=mask.view(1, 4, 50))
    torch.testing.assert_close(got, sdpa(q4, pk, pv, slots, mask, scale), rtol=1e-5, atol=1e-5)
    # two sequences, one padded: each as if alone
    read = torch.stack([slots, torch.randperm(S, generator=g)[:50]])
    masks = torch.stack([mask, torch.zeros(4, 50, dtype=torch.bool)])
    masks[1, :2, :30] = True
    masks[1, 2:, 0] = True  # padded rows see one key
    qq = torch.randn(8, H, D, generator=g)
    got = step_ops.attention(qq, pk, pv, 2, 50, scale, read, mask=masks)
    torch.testing.assert_close(got[:4], sdpa(qq[:4], pk, pv, read[0], masks[0], scale), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[4:6], sdpa(qq[4:6], pk, pv, read[1, :30], None, scale), rtol=1e-5, atol=1e-5)


def test_attention_rows_are_bitwise_invariant_and_a_tree_row_is_its_chain_row():
    pk, pv = pools(4)
    g = torch.Generator().manual_seed(5)
    scale = D**-0.5
    q = torch.randn(3, H, D, generator=g)
    # a tree of 3 rows at keys 40, 41, 42: rows 1 and 2 both follow row 0
    mask = torch.zeros(3, 43, dtype=torch.bool)
    mask[:, :40] = True
    mask[0, 40] = mask[1, 40] = mask[1, 41] = mask[2, 40] = mask[2, 42] = True
    tree = step_ops.attention(q, pk, pv, 1, 43, scale, start=0, mask=mask.view(1, 3, 43))
    # row 2 of the tree sees keys 0..40 and 42: as a chain row, the same keys at consecutive slots
    chain_slots = torch.cat([torch.arange(41), torch.tensor([42])]).view(1, 42)
    alone = step_ops.attention(q[2:3].clone(), pk, pv, 1, 42, scale, chain_slots)
    assert torch.equal(alone[0], tree[2])
    # row 0 alone over its 41 keys, contiguous
    assert torch.equal(step_ops.attention(q[0:1].clone(), pk, pv, 1, 41, scale, start=0)[0], tree[0])


def test_every_path_gives_bitwise_the_same_values():
    pk, pv = pools(6)
    g = torch.Generator().manual_seed(7)
    q = torch.randn(5, H, D, generator=g)
    mask = torch.ones(5, 90, dtype=torch.bool).tril_(diagonal=85).view(1, 5, 90)
    h, w, gu = torch.randn(5, 96, generator=g), torch.randn(96, generator=g), torch.randn(5, 160, generator=g)
    results = []
    for level in levels():
        kernels.set_isa(level)
        results.append((step_ops.attention(q, pk, pv, 1, 90, 0.2, start=3, mask=mask),
                        step_ops.rms_norm(h.clone(), w, 1e-6), step_ops.silu_mul(gu)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)


@pytest.mark.parametrize("heads,kv_heads", [(3, 3), (9, 3), (8, 2), (5, 1)])
def test_head_size_64_groups_and_row_blocks_are_exact_on_every_path_and_thread_count(heads, kv_heads):
    """D = 64 runs the SIMD values and scores (D = 32 above runs the generic ones on every
    path); groups of 1, 3, 4 and 5 heads (3 at a time in registers); 21 chain rows, more than
    one block of rows (attention runs blocks of rows a KV head at a time): every path, thread
    count and row alone gives bitwise the same values, within float tolerance of SDPA."""
    d, keys, rows = 64, 120, 21
    g = torch.Generator().manual_seed(11)
    pk, pv = torch.randn(kv_heads, S, d, generator=g), torch.randn(kv_heads, S, d, generator=g)
    q = torch.randn(rows, heads, d, generator=g)
    slots = torch.randperm(S, generator=g)[:keys]
    mask = torch.ones(rows, keys, dtype=torch.bool).tril_(diagonal=keys - rows)
    before = torch.get_num_threads()
    outs = []
    try:
        for level in levels():
            kernels.set_isa(level)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                outs.append(step_ops.attention(q, pk, pv, 1, keys, 0.125, slots.view(1, keys),
                                               mask=mask.view(1, rows, keys)))
    finally:
        torch.set_num_threads(before)
    for other in outs[1:]:
        assert torch.equal(outs[0], other)
    torch.testing.assert_close(outs[0], sdpa(q, pk, pv, slots, mask, 0.125), rtol=1e-5, atol=1e-5)
    for r in (0, 16, 20):  # each row alone: the keys it sees, at consecutive places
        n = keys - rows + r + 1
        alone = step_ops.attention(q[r:r + 1].clone(), pk, pv, 1, n, 0.125, slots[:n].reshape(1, n))
        assert torch.equal(alone[0], outs[-1][r])


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 2, 64), (5, 1, 64), (4, 2, 96), (6, 3, 48)])
def test_one_row_split_by_a_team_gives_the_values_of_one_thread(heads, kv_heads, d):
    """A one-row step by a team (attention_row_split: the keys split for the scores, the heads
    for the softmax, the head size for the values) gives bitwise what one thread gives, on every
    path and for 2 and 3 threads (key counts with 0-3 keys past a group of 4, each enough work
    for a team; layers() runs the same split with few keys: the test of its team below); and
    what the same row gives among other rows (the units route)."""
    g = torch.Generator().manual_seed(5)
    pool = 1100
    pk, pv = torch.randn(kv_heads, pool, d, generator=g), torch.randn(kv_heads, pool, d, generator=g)
    q = torch.randn(3, heads, d, generator=g)
    before = torch.get_num_threads()
    try:
        for keys in (144, 145, 203, 1002):
            assert heads * keys * d * 2 >= 1 << 16  # a team (step_ops.c's threads_for)
            slots = torch.randperm(pool, generator=g)[:keys].view(1, keys)
            outs = []
            for level in levels():
                kernels.set_isa(level)
                for threads in (1, 2, 3):
                    torch.set_num_threads(threads)
                    outs.append(step_ops.attention(q[:1].clone(), pk, pv, 1, keys, 0.125, slots))
            for other in outs[1:]:
                assert torch.equal(outs[0], other), keys
            torch.set_num_threads(1)
            three = step_ops.attention(q.clone(), pk, pv, 3, keys, 0.125, slots.expand(3, keys).contiguous())
            assert torch.equal(three[0], outs[0][0]), keys
            torch.testing.assert_close(outs[0], sdpa(q[:1], pk, pv, slots[0], None, 0.125), rtol=1e-5, atol=1e-5)
        hidden = torch.zeros(1, 1, 144, dtype=torch.bool)  # a row that sees no key: zeros, on every route
        slots = torch.randperm(pool, generator=g)[:144].view(1, 144)
        for level in levels():
            kernels.set_isa(level)
            for threads in (1, 2, 3):
                torch.set_num_threads(threads)
                assert not step_ops.attention(q[:1].clone(), pk, pv, 1, 144, 0.125, slots, mask=hidden).any()
    finally:
        torch.set_num_threads(before)


def test_bad_arguments_are_refused():
    pk, pv = pools()
    with pytest.raises(ValueError, match="contiguous"):
        step_ops.rms_norm(torch.randn(4, 8).t(), torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="rms_norm"):
        step_ops.rms_norm(torch.randn(4, 8), torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match="one sequence"):
        step_ops.attention(torch.randn(2, H, D), pk, pv, 2, 10, 1.0)
    with pytest.raises(ValueError, match="mask"):
        step_ops.attention(torch.randn(2, H, D), pk, pv, 1, 10, 1.0, mask=torch.ones(1, 2, 9, dtype=torch.bool))


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_the_model_route_equals_the_pytorch_route(kv_dtype):
    """A tiny random Llama: logits of a prefill (over MAX_ATTENTION_ROWS rows, SDPA inside),
    then a plain step and a tree step, through the C route and through PyTorch's; with a
    float32 and a float16 K/V pool (both routes round K/V as written)."""
    from promptlookup.runtime.kv_cache import KVPool
    from promptlookup.runtime.paged_llama import PagedLlama, build_layout

    hf = tiny_llama(0, 97, 64, 96, 2, 256)
    prompt = [int(t) for t in torch.randint(0, 97, (step_ops.MAX_ATTENTION_ROWS + 6,))]
    outs = []
    for c_route in (True, False):
        model = PagedLlama.from_hf(hf)
        assert model.uses_step_ops
        model.uses_step_ops = c_route
        pool = KVPool(2, 2, 16, 16, 16, dtype=kv_dtype, device="cpu")
        table = list(range(1, 12))
        n = len(prompt)
        steps = [model(build_layout([prompt], [n], [table], [1], 16, torch.device("cpu")), pool)]
        steps.append(model(build_layout([[5]], [n + 1], [table], [1], 16, torch.device("cpu")), pool))
        steps.append(model(build_layout([[7, 8, 9]], [n + 4], [table], [3], 16, torch.device("cpu"),
                                        parents=[[-1, 0, 0]]), pool))
        outs.append(steps)
    for c, t in zip(*outs):
        torch.testing.assert_close(c, t, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_one_call_for_all_layers_equals_the_calls_one_by_one_bitwise(kv_dtype):
    """``step_ops.layers`` (a decoding step's layers in one C call) against the same step run
    op by op from Python: chains, a tree, a padded batch of two; and every fp32/int8/int4
    projection; over a float32 and a float16 K/V pool."""
    from promptlookup.runtime.kv_cache import KVPool
    from promptlookup.runtime.paged_llama import PagedLlama, build_layout
    from promptlookup.runtime.quant_linear import QuantLinear

    hf = tiny_llama(1, 97, 64, 96, 3, 256, needs_layers=True)
    prompt = [int(t) for t in torch.randint(0, 97, (40,))]
    cpu = torch.device("cpu")

    def quantize(model: PagedLlama) -> None:  # layer 1 int8, layer 2 int4 (groups of 16)
        torch.manual_seed(2)
        for name in ("qkv", "o_proj", "gate_up", "down_proj"):
            w = getattr(model.layers[1], name).small_rows_weight
            w = w if w is not None else getattr(model.layers[1], name).plain
            scale = w.abs().amax(1) / 127
            setattr(model.layers[1], name, QuantLinear(torch.round(w / scale[:, None]).to(torch.int8), scale))
            w2 = getattr(model.layers[2], name).plain
            codes = torch.randint(0, 16, (w2.shape[0], w2.shape[1]), dtype=torch.uint8)
            groups = w2.shape[1] // 16
            setattr(model.layers[2], name, QuantLinear(codes[:, 0::2] | (codes[:, 1::2] << 4),
                                                       torch.rand(w2.shape[0], groups) / 50,
                                                       -torch.rand(w2.shape[0], groups) / 10, 16))
        model.layer_records = model._layer_records()

    outs = []
    for fused in (True, False):
        model = PagedLlama.from_hf(hf)
        quantize(model)
        assert model.layer_records is not None
        if not fused:
            model.layer_records = None
        pool = KVPool(3, 2, 16, 16, 16, dtype=kv_dtype, zeroed=True)
        table, n = [1, 2, 3, 5, 6, 7], len(prompt)
        steps = [model(build_layout([prompt], [n], [table], [1], 16, cpu), pool)]
        steps.append(model(build_layout([[5]], [n + 1], [table], [1], 16, cpu), pool))
        steps.append(model(build_layout([[7, 8, 9, 10]], [n + 5], [table], [4], 16, cpu, parents=[[-1, 0, 0, 2]]), pool))
        steps.append(model(build_layout([[7], [8, 9]], [n + 2, 20], [table, [9, 10]], [1, 2], 16, cpu), pool))
        outs.append(steps)
    for fused, one_by_one in zip(*outs):
        assert torch.equal(fused, one_by_one)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_one_call_runs_one_team_of_threads_and_gives_the_values_of_one_thread(kv_dtype):
    """Products big enough to be split: ``layers`` runs its whole step in one parallel region
    (threads meet at a barrier after each operation). Any team size, and the route op by op,
    give bitwise the logits of one thread (a float32 and a float16 K/V pool)."""
    from promptlookup.runtime.kv_cache import KVPool
    from promptlookup.runtime.paged_llama import PagedLlama, build_layout

    assert 256 * (4 + 2 * 2) * 64 >= 1 << 16  # one row's QKV product is split over threads (gemv.c)
    hf = tiny_llama(4, 61, 256, 384, 2, 128, needs_layers=True)
    prompt = [int(t) for t in torch.randint(0, 61, (20,))]
    cpu = torch.device("cpu")

    def run(threads: int, fused: bool) -> list[torch.Tensor]:
        torch.set_num_threads(threads)
        model = PagedLlama.from_hf(hf)
        if not fused:
            model.layer_records = None
        pool = KVPool(2, 2, 64, 16, 16, dtype=kv_dtype, zeroed=True)
        table, n = [1, 2, 3], len(prompt)
        steps = [model(build_layout([prompt], [n], [table], [n], 16, cpu), pool)]
        steps.append(model(build_layout([[5]], [n + 1], [table], [1], 16, cpu), pool))
        steps.append(model(build_layout([[7, 8, 9, 10]], [n + 5], [table], [4], 16, cpu, parents=[[-1, 0, 0, 2]]), pool))
        steps.append(model(build_layout([[7], [8, 9]], [n + 2, 9], [table, [9, 10]], [1, 2], 16, cpu), pool))
        for length in (1, 2, 3, 4, 5):  # one row over 1-5 keys: fewer keys than a team's threads' groups of 4
            steps.append(model(build_layout([[length + 2]], [length], [[12]], [1], 16, cpu), pool))
        return steps

    before = torch.get_num_threads()
    try:
        want = run(1, True)
        for threads, fused in ((2, True), (3, True), (2, False)):
            for got, expected in zip(run(threads, fused), want):
                assert torch.equal(got, expected), (threads, fused)
    finally:
        torch.set_num_threads(before)


def test_without_the_c_modules_the_model_runs_pytorch_operators(monkeypatch):
    """No ``_step_ops``: PyTorch's operators throughout; no products' capsule: the C operators
    one by one from Python. Both give the logits of the full route, within rounding."""
    from promptlookup.runtime.kv_cache import KVPool
    from promptlookup.runtime.paged_llama import PagedLlama, build_layout

    hf = tiny_llama(3, 50, 32, 64, 2, 64)

    def logits(model: PagedLlama) -> torch.Tensor:
        pool = KVPool(2, 2, 8, 16, 4, zeroed=True)
        return model(build_layout([[3, 4, 5, 6]], [4], [[1]], [4], 16, torch.device("cpu")), pool)

    full = PagedLlama.from_hf(hf)
    assert full.uses_step_ops and full.layer_records is not None
    monkeypatch.setattr(step_ops, "runs_layers", lambda: False)
    one_by_one = PagedLlama.from_hf(hf)
    assert one_by_one.uses_step_ops and one_by_one.layer_records is None
    monkeypatch.setattr(step_ops, "available", lambda: False)
    pytorch = PagedLlama.from_hf(hf)
    assert not pytorch.uses_step_ops
    want = logits(full)
    assert torch.equal(logits(one_by_one), want)
    torch.testing.assert_close(logits(pytorch), want, rtol=1e-4, atol=1e-5)


def test_threads_split_the_work_never_the_values():
    pk, pv = pools(8)
    g = torch.Generator().manual_seed(9)
    q = torch.randn(3, H, D, generator=g)
    read = torch.randperm(S, generator=g)[:200].view(1, 200)
    mask = torch.ones(1, 3, 200, dtype=torch.bool).tril_(diagonal=197)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(step_ops.attention(q, pk, pv, 1, 200, 0.3, read, mask=mask))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_indices_outside_the_tables_are_refused():
    pk, pv = pools()
    qkv = torch.randn(1, (H + 2 * KVH) * D)
    table = torch.randn(8, D)
    with pytest.raises(ValueError, match="positions"):
        step_ops.rotary_write(qkv, table, table, torch.tensor([8]), torch.tensor([0]), pk, pv, H)
    with pytest.raises(ValueError, match="slots"):
        step_ops.rotary_write(qkv, table, table, torch.tensor([0]), torch.tensor([S]), pk, pv, H)
    with pytest.raises(ValueError, match="read_slots"):
        step_ops.attention(torch.randn(1, H, D), pk, pv, 1, 2, 1.0, torch.tensor([[0, S + 5]]))


def test_a_padded_batch_names_its_real_rows_and_the_one_call_skips_the_padding():
    """``build_layout`` lists the rows that are not padding and the logit rows among them; the
    one-call route runs those rows only and gives bitwise the logits of the padded route."""
    from promptlookup.runtime.kv_cache import KVPool
    from promptlookup.runtime.paged_llama import PagedLlama, build_layout

    cpu = torch.device("cpu")
    lay = build_layout([[7], [8, 9, 10]], [5, 9], [[1], [2]], [1, 2], 16, cpu)
    assert lay.real_rows.tolist() == [0, 3, 4, 5] and lay.logit_rows.tolist() == [0, 4, 5]
    assert lay.real_logit_rows.tolist() == [0, 2, 3]
    full = build_layout([[7, 1], [8, 9]], [5, 9], [[1], [2]], [1, 2], 16, cpu)
    assert full.real_rows is None and full.real_logit_rows is None
    hf = tiny_llama(5, 53, 64, 96, 2, 64, needs_layers=True)
    outs = []
    for fused in (True, False):
        model = PagedLlama.from_hf(hf)
        if not fused:
            model.layer_records = None  # the operators one by one, over the padded rows
        pool = KVPool(2, 2, 16, 16, 8, zeroed=True)
        prompts = [[3, 4, 5, 6], [9, 8, 7, 6, 5, 4, 3, 2]]
        model(build_layout([prompts[0]], [4], [[1]], [1], 16, cpu), pool)
        model(build_layout([prompts[1]], [8], [[2]], [1], 16, cpu), pool)
        outs.append(model(build_layout([[7], [8, 9, 10]], [5, 11], [[1], [2]], [1, 3], 16, cpu), pool))
    assert outs[0].shape == (4, 53) and torch.equal(outs[0], outs[1])
