"""The weight-streaming linear (paradec/kernels.py): same numbers as F.linear, same decoding, hooks still run."""
import torch
from torch import nn

from paradec import kernels
from paradec.engine import Engine


def test_streamed_linear_matches_f_linear_for_every_row_count():
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(96, 200)
    for rows in (1, 2, 3, 7, 16, 64, 65):
        x = torch.randn(1, rows, 96, generator=g)
        want = nn.functional.linear(x, lin.weight, lin.bias)
        with torch.no_grad():
            got = kernels.streamed_linear(x, lin.weight, lin.bias)
        assert got.shape == want.shape and got.is_contiguous()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    x = torch.randn(4, 96, generator=g)          # no bias
    with torch.no_grad():
        torch.testing.assert_close(kernels.streamed_linear(x, lin.weight, None), x @ lin.weight.T)


def test_gradients_still_flow_through_the_standard_path():
    lin = nn.Linear(8, 5)
    kernels.stream_linears(lin)
    x = torch.randn(3, 8, requires_grad=True)
    lin(x).sum().backward()
    assert x.grad is not None and lin.weight.grad is not None


def test_a_loaded_cpu_float32_model_is_switched_and_decodes_the_same(model_dir):
    from paradec import native
    e = Engine.load(str(model_dir), device="cpu", dtype="float32")
    n_lin = sum(type(m) is nn.Linear for m in e.model.modules())
    tag = kernels._NATIVE_TAG if native.available() else kernels._TAG    # paradec's kernel where it runs
    assert n_lin > 0 and all(getattr(m, tag, False) for m in e.model.modules() if type(m) is nn.Linear)
    ids = list(range(5, 30))
    streamed = e.forward(ids, e.new_cache(), logits_to_keep=len(ids))
    kernels.unnative_linears(e.model)
    kernels.unstream_linears(e.model)
    plain = e.forward(ids, e.new_cache(), logits_to_keep=len(ids))
    torch.testing.assert_close(streamed, plain, rtol=1e-4, atol=1e-4)
    assert torch.equal(streamed.argmax(-1), plain.argmax(-1))


def test_forward_hooks_still_apply_to_a_streamed_linear():
    lin = nn.Linear(8, 5)
    kernels.stream_linears(lin)
    lin.register_forward_hook(lambda _m, _i, out: out + 100.0)
    with torch.no_grad():
        y = lin(torch.randn(4, 8))
    assert (y > 50).all()


def test_a_deep_copy_of_a_streamed_linear_uses_its_own_weights():
    import copy
    lin = nn.Linear(8, 5)
    kernels.stream_linears(lin)
    twin = copy.deepcopy(lin)
    with torch.no_grad():
        twin.weight.zero_()
        twin.bias.fill_(1.0)
        x = torch.randn(3, 8)
        assert torch.equal(twin(x), torch.ones(3, 5))
        torch.testing.assert_close(lin(x), x @ lin.weight.T + lin.bias)


# ---------------------------------------------------------------- bf16: weights in oneDNN's layout
needs_packing = __import__("pytest").mark.skipif(not kernels.packing_available(),
                                                  reason="this torch has no oneDNN prepacked linear")


@needs_packing
def test_a_packed_bf16_linear_matches_f_linear_and_is_row_independent():
    g = torch.Generator().manual_seed(1)
    lin = nn.Linear(96, 200).to(torch.bfloat16)
    assert kernels.pack_linears(lin) == 1 and kernels.pack_linears(lin) == 0       # idempotent
    x = torch.randn(1, 16, 96, generator=g).to(torch.bfloat16)
    with torch.no_grad():
        got = lin(x)
        want = nn.functional.linear(x, lin.weight, lin.bias)
        assert got.shape == want.shape and got.dtype == torch.bfloat16
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
        for rows in (1, 2, 5):               # a row's result does not depend on how many rows share the pass
            assert torch.equal(lin(x[:, :rows])[0], got[0, :rows])
        lin.weight.mul_(2.0)                 # an in-place update is packed again
        torch.testing.assert_close(lin(x).float(), nn.functional.linear(x, lin.weight, lin.bias).float(),
                                   rtol=2e-2, atol=2e-2)
    kernels.unpack_linears(lin)
    assert "forward" not in lin.__dict__


@needs_packing
def test_a_wide_input_projection_is_row_exact_at_any_row_count():
    """Qwen2.5-0.5B's down projection shape (4864 -> 896): oneDNN's plain product gives some rows other numbers
    than the same rows alone (on AMX from 33 rows on; on AVX512-BF16 without AMX the one-row kernel is the odd one
    out); `row_plan` probes for a plan that removes it. Through the packed module every row of a pass of 1 to 100
    rows equals the row computed alone, which a verifying pass relies on."""
    g = torch.Generator().manual_seed(2)
    lin = nn.Linear(4864, 896, bias=False).to(torch.bfloat16)
    kernels.pack_linears(lin)
    x = torch.randn(100, 4864, generator=g).to(torch.bfloat16)
    with torch.no_grad():
        alone = torch.cat([lin(x[i:i + 1]) for i in range(100)])
        for rows in (2, 3, 4, 32, 33, 40, 64, 100):
            assert torch.equal(lin(x[:rows]), alone[:rows]), rows
        packed = lin.forward.packed
        raw = [kernels.linear_packed(x[:m], packed, None) for m in (1, 2, 64)]
        raw_alone = torch.cat([kernels.linear_packed(x[i:i + 1], packed, None) for i in range(64)])
    plan = kernels.row_plan(896, 4864)
    assert plan in kernels.PLANS
    plain_exact = torch.equal(raw[2], raw_alone) and torch.equal(raw[1], raw_alone[:2])
    assert (plan == (1, None)) == plain_exact          # a plan exactly where the plain kernel is not exact
    assert torch.equal(kernels.packed_product(x[:1], packed, None, (2, None)), raw[1][:1])   # padding: row 0 of 2


@needs_packing
def test_a_packed_linear_keeps_gradients_hooks_and_its_own_copy():
    import copy
    lin = nn.Linear(8, 5).to(torch.bfloat16)
    kernels.pack_linears(lin)
    x = torch.randn(3, 8, dtype=torch.bfloat16, requires_grad=True)
    lin(x).float().sum().backward()                        # training goes through F.linear
    assert x.grad is not None and lin.weight.grad is not None
    twin = copy.deepcopy(lin)
    with torch.no_grad():
        y = lin(x)
        twin.weight.zero_()
        twin.bias.fill_(1.0)
        assert torch.equal(twin(x), torch.ones(3, 5, dtype=torch.bfloat16))
        assert torch.equal(lin(x), y)
    h = lin.register_forward_hook(lambda _m, _i, out: out + 100.0)
    with torch.no_grad():
        assert (lin(x).float() > 50).all()
    h.remove()


@needs_packing
def test_a_loaded_cpu_bf16_model_is_packed_and_decodes_the_same(model_dir):
    e = Engine.load(str(model_dir), device="cpu", dtype="bfloat16")
    assert all(getattr(m, kernels._PACK_TAG, False) for m in e.model.modules() if type(m) is nn.Linear)
    ids = list(range(5, 30))
    packed = e.forward(ids, e.new_cache(), logits_to_keep=len(ids))
    kernels.unpack_linears(e.model)
    plain = e.forward(ids, e.new_cache(), logits_to_keep=len(ids))
    torch.testing.assert_close(packed, plain, rtol=5e-2, atol=5e-2)


@needs_packing
def test_packing_is_skipped_when_the_copy_would_not_fit_in_memory():
    lin = nn.Linear(100, 50).to(torch.bfloat16)                 # 10,000 bytes of weight
    assert kernels.packed_copy_fits(lin, available=20_000) and not kernels.packed_copy_fits(lin, available=19_999)
    assert kernels.packed_copy_fits(lin, available=None)       # the system cannot say: pack
    assert kernels.available_memory() is None or kernels.available_memory() > 0


class _Attn(nn.Module):
    """Siblings as a Llama-style block has them: q/k/v read one input, o does not."""

    def __init__(self, bias=True):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(64, 64, bias), nn.Linear(64, 16, bias), nn.Linear(64, 16, bias)
        self.o_proj = nn.Linear(64, 64, bias)

    def forward(self, x):
        return self.o_proj(self.q_proj(x)) + self.k_proj(x).sum(-1, keepdim=True) * self.v_proj(x).mean(-1, keepdim=True)


@needs_packing
def test_sibling_linears_are_stacked_and_give_the_separate_products_bit_for_bit():
    import copy
    g = torch.Generator().manual_seed(2)
    block = _Attn().to(torch.bfloat16)
    plain = copy.deepcopy(block)
    kernels.pack_linears(plain, stack=False)
    assert [len(m) for m in kernels.sibling_groups(block)] == [3]
    assert kernels.pack_linears(block) == 4 and kernels.pack_linears(block) == 0
    assert isinstance(block.k_proj.forward, kernels._Sibling) and isinstance(block.o_proj.forward, kernels._Packed)
    x = torch.randn(1, 9, 64, generator=g).to(torch.bfloat16)
    with torch.no_grad():
        for rows in (1, 4, 9):
            assert torch.equal(block(x[:, :rows]), plain(x[:, :rows]))
            assert torch.equal(block(x[:, :rows])[0], block(x)[0, :rows])      # row-independent
        # a sibling called alone, or with another input, computes its own product
        assert torch.equal(block.v_proj(x), plain.v_proj(x))
        assert torch.equal(block.k_proj(x[:, :2]), plain.k_proj(x[:, :2]))
        block.q_proj(x)
        assert block.q_proj.forward.group.x is x                 # q's stash waits for k and v...
        block.k_proj(x), block.v_proj(x)
        assert block.q_proj.forward.group.x is None              # ...and is dropped once both took theirs
        block.v_proj.weight.mul_(2.0)                            # an in-place update is stacked again
        plain.v_proj.weight.mul_(2.0)
        assert torch.equal(block(x), plain(x))
    twin = copy.deepcopy(block)                                  # a copy stacks its own weights
    with torch.no_grad():
        twin.k_proj.weight.zero_()
        twin.k_proj.bias.zero_()
        assert torch.equal(twin.k_proj(x), torch.zeros(1, 9, 16, dtype=torch.bfloat16))
        assert torch.equal(block(x), plain(x))
    y = block(x.requires_grad_(True)).float().sum()              # training: F.linear, gradients flow
    y.backward()
    assert block.q_proj.weight.grad is not None and x.grad is not None
    kernels.unpack_linears(block)
    assert all("forward" not in m.__dict__ for m in block.modules())


def test_fixed_rows_gives_every_row_its_own_numbers_at_any_row_count_and_keeps_training_as_it_was(monkeypatch):
    """The CUDA plan, run here on the CPU: every nn.Linear and RMSNorm computes 64-row pieces (`fixed_rows`) and
    attention scores are float64 (as `attention.scores_dtype` gives on CUDA), so a row's numbers do not depend on
    how many rows share its pass; the pieces and padding change nothing else."""
    from paradec import attention
    from paradec.testing import random_engine
    monkeypatch.setattr(attention, "scores_dtype", lambda device, dtype=None: torch.float64)
    e = random_engine(7, hidden=96)
    model = e.model
    kernels.unfix_rows(model)                 # (an engine on CUDA has the plan already: start without it)
    norms = [m for m in model.modules() if type(m).__name__.endswith("RMSNorm")]
    lins = [m for m in model.modules() if type(m) is nn.Linear]
    assert norms and lins
    ids = torch.randint(5, 500, (1, 140), generator=torch.Generator().manual_seed(1)).to(e.device)
    with torch.no_grad():
        plain = model(ids).logits
    assert kernels.fixed_rows(model) == len(norms) + len(lins)
    assert kernels.fixed_rows(model) == 0                        # idempotent
    with torch.no_grad():
        whole = model(ids).logits                                 # 140 rows: pieces of 64, 64, 12 (+52 padding)
        torch.testing.assert_close(whole, plain, rtol=1e-4, atol=1e-4)
        for n in (1, 5, 64, 65):                                  # the same positions in passes of other sizes
            part = model(ids[:, :n]).logits
            assert torch.equal(part, whole[:, :n]), n
        batch = model(ids[:, :9].repeat(3, 1)).logits             # a batch: rows of every sequence in the pieces
        assert all(torch.equal(batch[b], whole[0, :9]) for b in range(3))
    x = torch.randn(3, 96, device=e.device, requires_grad=True)  # training: the plain forward, gradients flow
    lins[0](x).sum().backward()
    assert x.grad is not None and lins[0].weight.grad is not None
    kernels.unfix_rows(model)
    assert not any(getattr(m, "_paradec_fixed_rows", False) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, plain, rtol=0, atol=0)


def test_fixed_rows_is_the_cuda_plan_and_can_be_turned_off(monkeypatch):
    assert kernels.fixed_rows_wanted(torch.device("cuda"))
    assert not kernels.fixed_rows_wanted(torch.device("cpu"))
    monkeypatch.setenv("PARADEC_ROW_EXACT", "0")
    assert not kernels.fixed_rows_wanted(torch.device("cuda"))


def test_a_cpu_bf16_model_decodes_whether_or_not_this_cpu_packs(model_dir):
    """Packing needs oneDNN's bf16 path (AVX512 BW/VL/DQ or AVX-NE-CONVERT); on a CPU without it (an AVX2-only AMD
    EPYC) a bf16 model must load unpacked and decode, not raise when the first weight is laid out."""
    e = Engine.load(str(model_dir), device="cpu", dtype="bfloat16")
    packed = [getattr(m, kernels._PACK_TAG, False) for m in e.model.modules() if type(m) is nn.Linear]
    assert all(packed) if kernels.packing_available() else not any(packed)
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert not kernels.packing_available()
    ids = list(range(5, 30))
    got = e.forward(ids, e.new_cache(), logits_to_keep=len(ids))
    ref = Engine.load(str(model_dir), device="cpu", dtype="float32").forward(ids, None, logits_to_keep=len(ids))
    assert got.shape == ref.shape and got.dtype in (torch.float32, torch.bfloat16)
    assert torch.isfinite(got).all()
    agree = (got.float().argmax(-1) == ref.float().argmax(-1)).float().mean()
    assert agree >= 0.9                                  # bf16 rounding moves few argmaxes of fp32's


def test_a_streamed_linear_gives_each_row_its_own_numbers_whatever_the_rows_beside_it():
    """fp32 target linears (`stream_linears`) are row-exact at every row count, the one-row pass and passes past
    64 rows included: a prompt-plus-drafts pass must give the drafts the logits `ar` computes one at a time (on an
    AVX2-only AMD EPYC the plain streamed product gave 8 of 11 rows other numbers, 2026-12-06)."""
    g = torch.Generator().manual_seed(0)
    for out_f, in_f, bias in ((896, 896, True), (4864, 896, False), (896, 4864, False), (1000, 96, True)):
        lin = nn.Linear(in_f, out_f, bias=bias)
        kernels.stream_linears(lin)
        x = torch.randn(130, in_f, generator=g)
        with torch.inference_mode():
            alone = torch.cat([lin(x[i:i + 1]) for i in range(x.shape[0])])
            for n in (2, 3, 5, 11, 12, 17, 40, 64, 130):
                assert torch.equal(lin(x[:n]), alone[:n]), (out_f, in_f, n)
            torch.testing.assert_close(alone, x @ lin.weight.T + (lin.bias if bias else 0), rtol=1e-4, atol=1e-4)
        assert kernels.stream_plan(out_f, in_f, bias, torch.float32) in kernels.STREAM_PLANS


def test_a_prompts_rows_get_the_same_numbers_in_every_first_pass_and_skip_the_row_plan(model_dir, monkeypatch):
    """`kernels.prompt_rows`: a first pass computes the prompt's rows but its last as one F.linear over exactly those
    rows, whatever follows them (drafts) and whoever runs the pass (`Engine.forward`, or transformers' own forward
    under `prompt_passes`, as hf-generate does); the last prompt row and the drafts stay row-exact."""
    from transformers import DynamicCache
    e = Engine.load(str(model_dir), device="cpu", dtype="float32")
    kernels.unnative_linears(e.model)              # the streamed linears' split (paradec's kernel needs none)
    kernels.stream_linears(e.model)
    P = kernels.PROMPT_ROWS + 12
    ids, drafts = [(7 * i) % 200 + 3 for i in range(P)], [11, 12, 13]

    def kv(cache):
        return [(k.clone(), v.clone()) for k, v in Engine.cache_kv(cache)]

    ar_cache = e.new_cache(prompt=P)
    ar_logits = e.forward(ids, ar_cache, logits_to_keep=1)[0, -1]
    wide_cache = e.new_cache(prompt=P)
    wide = e.forward(ids + drafts, wide_cache, logits_to_keep=len(drafts) + 1)[0]
    assert torch.equal(wide[0], ar_logits)                           # the first token's logits: the same
    for (k1, v1), (k2, v2) in zip(kv(ar_cache), kv(wide_cache)):
        assert torch.equal(k1, k2[:, :, :P]) and torch.equal(v1, v2[:, :, :P])
    # the drafts' rows are the rows `ar` computes one at a time
    for j, t in enumerate(drafts):
        lone = e.forward([t], ar_cache, logits_to_keep=1)[0, -1]
        assert torch.equal(lone, wide[j + 1]), j
    hf_cache = DynamicCache(config=e.model.config)
    with torch.inference_mode(), kernels.prompt_passes(e.model, P):
        hf = e.model(input_ids=torch.tensor([ids + drafts]), past_key_values=hf_cache, use_cache=True).logits[0]
    assert torch.equal(hf[P - 1:], wide)
    # the prompt's rows but its last are F.linear's over those rows (not the row plan's): the unstreamed model's
    kernels.unstream_linears(e.model)
    plain = e.new_cache()
    e.forward(ids[:-1], plain, logits_to_keep=1)
    kernels.stream_linears(e.model)
    for (k1, v1), (k2, v2) in zip(kv(ar_cache), kv(plain)):
        assert torch.equal(k1[:, :, :P - 1], k2) and torch.equal(v1[:, :, :P - 1], v2)
    # a cache made without a prompt length, and short prompts, keep the row plan
    assert Engine.prompt_rows(e.new_cache(), P) == 0 and Engine.prompt_rows(wide_cache, 1) == 0
    assert kernels.prompt_rows(P, kernels.PROMPT_ROWS - 1).split is None
    monkeypatch.setenv("PARADEC_PROMPT_ROWS", "0")
    assert kernels.prompt_rows(P, P - 1).split is None
