"""paradec's own row-exact linear (paradec/native.py, paradec/csrc/rowlinear.cpp): the numbers of a float64
product up to float32 rounding, each row's numbers independent of the rows beside it and of the thread count,
a bfloat16 copy only where it is exact, repacking after a weight changes, and the fallbacks."""
import copy

import pytest
import torch
from torch import nn

from paradec import kernels, native
from paradec.engine import Engine

needs_native = pytest.mark.skipif(not native.available(), reason=f"native kernel not available: {native.why()}")


@needs_native
@pytest.mark.parametrize("out_f,in_f,bias", [(896, 896, True), (4864, 896, False), (896, 4864, False),
                                             (1000, 96, True), (37, 13, True), (5, 1, False)])
@pytest.mark.parametrize("wdtype", [torch.float32, torch.bfloat16])
def test_every_row_gets_its_own_numbers_at_every_row_count_and_thread_count(out_f, in_f, bias, wdtype):
    g = torch.Generator().manual_seed(out_f + in_f)
    w = (torch.randn(out_f, in_f, generator=g) * 0.05).to(wdtype)
    b = torch.randn(out_f, generator=g) * 0.05 if bias else None
    packed = native.pack(w)
    assert packed.dtype == torch.bfloat16 if wdtype == torch.bfloat16 else packed.dtype == torch.float32
    x = torch.randn(75, in_f, generator=g)
    alone = torch.cat([native.linear(x[i:i + 1], packed, out_f, b) for i in range(x.shape[0])])
    for n in (2, 3, 5, 6, 7, 8, 11, 12, 13, 17, 40, 75):
        assert torch.equal(native.linear(x[:n], packed, out_f, b), alone[:n]), n
    assert torch.equal(native.linear(x, packed, out_f, b, threads=1), alone)
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    torch.testing.assert_close(alone.double(), ref, rtol=0, atol=1e-5 * max(1.0, in_f / 500))


@needs_native
def test_a_float32_weight_of_bfloat16_numbers_is_packed_in_bfloat16_with_the_same_products():
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(64, 40, generator=g)).to(torch.bfloat16).float()      # float32 holding bf16 numbers
    p16 = native.pack(w)
    assert p16.dtype == torch.bfloat16 and p16.shape == (4, 40, 16)
    p32 = native.pack(w + 1e-4)                                             # not bf16 numbers any more
    assert p32.dtype == torch.float32
    x = torch.randn(9, 40, generator=g)
    # the same numbers as a float32 copy in the same layout: the bf16 copy changes the bytes read, not the product
    assert torch.equal(native.linear(x, p16, 64), native.linear(x, p16.float(), 64))


@needs_native
def test_a_native_linear_repacks_after_its_weight_changes_and_a_copy_uses_its_own_weights():
    lin = nn.Linear(24, 20)
    kernels.native_linears(lin)
    x = torch.randn(3, 24)
    with torch.inference_mode():
        before = lin(x)
    torch.testing.assert_close(before, nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    twin = copy.deepcopy(lin)
    with torch.no_grad():
        lin.weight.mul_(2.0)                                  # in place: the version moves
        twin.weight.zero_()
        twin.bias.fill_(1.0)
    with torch.inference_mode():
        after = lin(x)
        assert torch.equal(twin(x), torch.ones(3, 20))
    torch.testing.assert_close(after, nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(after, before)
    xg = torch.randn(3, 24, requires_grad=True)               # training keeps F.linear
    lin(xg).sum().backward()
    assert xg.grad is not None and lin.weight.grad is not None
    kernels.unnative_linears(lin)
    assert "forward" not in vars(lin)


@needs_native
def test_a_cpu_float32_model_decodes_through_it_and_lossless_strategies_match_ar(model_dir):
    from paradec.strategies import Request, get
    e = Engine.load(str(model_dir), device="cpu", dtype="float32")
    assert all(isinstance(m.forward, kernels._Native) for m in e.model.modules() if type(m) is nn.Linear)

    def tokens(name):
        req = Request(prompt="a b c a b c a b c d e f a b c", max_new_tokens=32, ignore_eos=True)
        steps = list(get(name).stream(e, req))
        return [t for s in steps for t in s.token_ids], max(len(s.token_ids) for s in steps)

    ar, _ = tokens("ar")
    for name in ("pld", "lookahead"):
        got, _ = tokens(name)
        assert got == ar, name


def test_turned_off_it_says_why_and_a_float32_model_falls_back_to_the_streamed_linears(monkeypatch, model_dir):
    monkeypatch.setenv("PARADEC_NATIVE", "0")
    monkeypatch.setattr(native, "_STATE", {})
    assert not native.available() and "PARADEC_NATIVE=0" in native.why()
    with pytest.raises(RuntimeError, match="PARADEC_NATIVE=0"):
        native.linear(torch.ones(1, 4), torch.ones(1, 4, 16), 16)
    e = Engine.load(str(model_dir), device="cpu", dtype="float32")
    assert all(getattr(m, kernels._TAG, False) and not getattr(m, kernels._NATIVE_TAG, False)
               for m in e.model.modules() if type(m) is nn.Linear)


@needs_native
def test_a_packed_weight_that_does_not_fit_the_input_is_refused():
    p = native.pack(torch.randn(32, 10))
    with pytest.raises(ValueError, match="does not fit"):
        native.linear(torch.randn(2, 11), p, 32)
    with pytest.raises(ValueError, match="does not fit"):
        native.linear(torch.randn(2, 10), p, 48)


@needs_native
def test_concurrent_passes_through_one_linear_while_its_weight_changes_get_a_whole_packed_copy():
    """The race runs strategies in threads on one engine: a pass must never see a half-replaced packed copy."""
    import threading
    lin = nn.Linear(64, 48)
    kernels.native_linears(lin)
    x = torch.randn(5, 64)
    errors = []

    def work():
        try:
            for _ in range(40):
                with torch.inference_mode():
                    y = lin(x)
                assert y.shape == (5, 48) and torch.isfinite(y).all()
        except Exception as e:   # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(20):
        with torch.no_grad():
            lin.weight.add_(0.001)                 # a new version: the next pass repacks
    for t in threads:
        t.join()
    assert not errors, errors
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), nn.functional.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("rows", [1, 3, 8, 13])
@pytest.mark.parametrize("shape", [(40, (16, 16, 8), (48, 16, 16)), (21, (3, 5), (12, 7))])
def test_lora_add_adds_each_members_delta_to_its_columns_of_the_tail_rows_only(rows, shape):
    """native.lora_add: y += scale_s * (x A_s^T) B_s^T in member s's columns, for rows taken from the tail of a
    larger (strided) output; within one bf16 rounding of the float32 sum; the rows above are left alone; more
    rows than it takes, or operands that do not fit, are refused (False) with nothing written."""
    g = torch.Generator().manual_seed(rows)
    width, ranks, outs = shape
    pairs = [(torch.randn(r, width, generator=g) * 0.1, torch.randn(o, r, generator=g) * 0.1, 1.5)
             for r, o in zip(ranks, outs)]
    packed = native.LoraPack(pairs)
    x = torch.randn(1, rows + 2, width, generator=g).to(torch.bfloat16)
    y = torch.randn(1, rows + 2, sum(outs) + 5, generator=g).to(torch.bfloat16)     # 5 more columns: a wider stack
    before = y.clone()
    assert native.lora_add(x[0, -rows:], packed, y[0, -rows:, :sum(outs)])
    xr = x[0, -rows:].float()
    want = torch.cat([(xr @ a.to(torch.bfloat16).float().t()) @ (b.t() * s).to(torch.bfloat16).float()
                      for a, b, s in pairs], 1) + before[0, -rows:, :sum(outs)].float()
    got = y[0, -rows:, :sum(outs)].float()
    ulp = want.abs().clamp_min(1e-3) * 2 ** -8                    # one bf16 unit in the last place
    assert ((got - want).abs() <= ulp).all()
    assert not torch.equal(got, before[0, -rows:, :sum(outs)].float())
    assert torch.equal(y[0, :-rows], before[0, :-rows]) and torch.equal(y[..., sum(outs):], before[..., sum(outs):])
    many = native.LORA_ROWS + 1
    big = torch.zeros(many, sum(outs), dtype=torch.bfloat16)
    assert not native.lora_add(torch.ones(many, width, dtype=torch.bfloat16), packed, big)     # too many rows
    assert not big.any()
    assert not native.lora_add(x[0, -rows:, :-1], packed, y[0, -rows:, :sum(outs)])            # another width
    assert not native.lora_add(x[0, -rows:].float(), packed, y[0, -rows:, :sum(outs)])         # not bf16
    assert torch.equal(y[0, :-rows], before[0, :-rows])
