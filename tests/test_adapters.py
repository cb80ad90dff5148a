"""The gated-adapter base shared by PTP, LUD and FocusLLM (paradec/adapters.py): gate positions, hooks attached
once, files (the shipped ones load unchanged), finding an engine's adapter and the check against the model it was
trained for (fingerprint; older files without one load as they did)."""
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from paradec.adapters import AdapterError, Gate, base_record, fingerprint
from paradec.engine import Engine
from paradec.focus import FocusAdapter
from paradec.lud import LUDAdapter, LUDConfig
from paradec.ptp import PTPAdapter
from paradec.strategies import Request, get
from paradec.testing import random_engine

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "data" / "models" / "paradec-tiny"
SHIPPED_PTP = ROOT / "data" / "adapters" / "qwen2.5-coder-0.5b-instruct" / "ptp"
KINDS = (PTPAdapter, LUDAdapter, FocusAdapter)


def made_for(cls, engine, std=0.05, seed=0):
    """A new adapter of kind `cls` for `engine`'s model, with deltas that really change the gated positions."""
    torch.manual_seed(seed)
    m = engine.model
    if cls is PTPAdapter:
        ad = PTPAdapter.for_model(m, rank=4, block=4)
    elif cls is LUDAdapter:
        ad = LUDAdapter(m, LUDConfig(**base_record(m)))
    else:
        ad = FocusAdapter.for_model(m, 4)
    with torch.no_grad():
        for name, p in ad.named_parameters():
            if "lora_b" in name or "delta" in name:
                p.normal_(0, std)
    return ad.eval()


def tokens(engine, name, prompt, **params):
    req = Request(prompt=prompt, chat=False, max_new_tokens=12, ignore_eos=True, params=params)
    return [t for s in get(name).stream(engine, req) for t in s.token_ids]


# ---------------------------------------------------------------- which positions

@pytest.mark.parametrize("grad", [False, True])
def test_gate_forms_touch_exactly_their_positions(grad):
    x = torch.randn(2, 6, 3)

    def touched(spec):
        out = torch.zeros(2, 6, 3, requires_grad=grad) * 1.0
        with torch.set_grad_enabled(grad):
            res = Gate.of(spec, "cpu").add(out, x, lambda rows: torch.ones_like(rows))
        return None if res is None else (res != 0).all(-1)

    assert touched("all").all()
    assert touched(2).tolist() == [[False] * 4 + [True] * 2] * 2
    assert touched(0) is None
    assert touched(torch.tensor([1, 4])).tolist() == [[False, True, False, False, True, False]] * 2
    suffix = torch.tensor([0, 0, 0, 1, 1, 1], dtype=torch.bool)
    g = Gate.of(suffix, "cpu")
    assert g.tail == 3 and g.mask.shape == (1, 6)                  # a suffix mask becomes a tail gate
    assert touched(suffix).tolist() == [[False] * 3 + [True] * 3] * 2
    ragged = torch.tensor([[0, 1, 0, 1, 0, 0], [1, 0, 0, 0, 0, 1]], dtype=torch.bool)
    assert Gate.of(ragged, "cpu").tail is None
    assert torch.equal(touched(ragged), ragged)
    assert Gate.of(None, "cpu") is None
    v = torch.full((3,), 7.0)
    put = Gate.of(suffix, "cpu").put(torch.zeros(2, 6, 3), v)
    assert (put[:, 3:] == 7).all() and (put[:, :3] == 0).all()


# ---------------------------------------------------------------- hooks attached once

@pytest.mark.parametrize("cls", KINDS)
def test_hooks_are_attached_once_and_a_closed_gate_is_the_base(cls):
    """find() hands out the adapter without hooking it; its strategy hooks it once for a whole generation (the
    same hooks at every step: nothing registered or removed per forward) and removes the hooks when the generation
    ends, so other strategies run on a model without them; with the gate closed the model is the base model bit
    for bit, inside the gate the deltas act."""
    e = random_engine(0)
    ids = e.tokenizer("def f(x):\n    return x")["input_ids"]
    base = e.forward(ids)
    ad = e.extras[cls.KIND] = made_for(cls, e)
    assert cls.find(e) is ad and cls.find(e) is ad
    hooked = dict(e.model.named_modules())[ad.names[0]]
    assert not hooked._forward_hooks                              # found, not attached
    ad.attach(e.model)
    assert len(hooked._forward_hooks) == 1
    assert torch.equal(e.forward(ids), base)                      # attached, gate closed: the base model
    spec = {LUDAdapter: (torch.tensor([0] * (len(ids) - 2) + [1, 1], dtype=torch.bool),),
            PTPAdapter: (torch.arange(len(ids) - 2, len(ids)),), FocusAdapter: ()}[cls]   # focus: its own gate
    with ad.gated(*spec):
        gated = e.forward(ids)
    assert torch.equal(gated[0, :len(ids) - 2, :base.shape[-1]], base[0, :len(ids) - 2])
    assert not torch.allclose(gated[0, -1, :base.shape[-1]], base[0, -1], atol=1e-4)
    ad.detach()
    assert not hooked._forward_hooks
    # a whole generation with the adapter's strategy: one set of hooks for all its steps, none after
    prompt = "Snow lay on the hills. " * 3
    if cls is FocusAdapter:
        prompt = prompt * 80                                      # longer than the context: the candidates run
    req = Request(prompt=prompt, chat=False, max_new_tokens=12, ignore_eos=True)
    seen = [tuple(hooked._forward_hooks) for _ in get(cls.KIND).stream(e, req)]
    assert len(seen) > 1 and len(set(seen)) == 1 and len(seen[0]) == 1
    assert not hooked._forward_hooks
    assert torch.equal(e.forward(ids), base)
    # two generations interleaved (two race lanes sharing the adapter): hooked until the last one ends
    g1, g2 = get(cls.KIND).stream(e, req), get(cls.KIND).stream(e, req)
    next(g1), next(g2)
    list(g1)
    assert len(hooked._forward_hooks) == 1
    list(g2)
    assert not hooked._forward_hooks
    # a generation closed early (a cancelled client) removes them too
    g3 = get(cls.KIND).stream(e, req)
    next(g3)
    g3.close()
    assert not hooked._forward_hooks
    with pytest.raises(AdapterError, match="not attached"):
        with ad.gated(*spec):
            pass
    with ad.applied(e.model, *spec):                              # the one-off form attaches for the block
        assert torch.equal(e.forward(ids)[..., :base.shape[-1]], gated[..., :base.shape[-1]])
    assert not hooked._forward_hooks


@pytest.mark.parametrize("cls", KINDS)
def test_sibling_linears_share_their_first_lora_product_and_give_the_per_linear_deltas(cls):
    """In decoding the LoRA pairs of q/k/v (and gate/up) share one stacked first product (kernels.SIBLINGS); the
    gated positions get the deltas each linear's own pair gives (the training path), the others nothing."""
    e = random_engine(0)
    ids = e.tokenizer("def f(x):\n    return x + 1")["input_ids"]
    ad = made_for(cls, e)
    if cls is FocusAdapter and not ad.rank:
        pytest.skip("full-rank focus deltas have no pairs")
    groups = ad._sibling_groups()
    assert {len(m) for m, _ in groups.values()} >= {2, 3} and set(groups) == set(ad.names)
    n = len(ids)
    spec = torch.arange(n - 3, n) if cls is PTPAdapter else torch.tensor([0] * (n - 3) + [1] * 3, dtype=torch.bool)
    ad.attach(e.model)
    with ad.gated(spec):
        fast = e.forward(ids)                                     # inference mode: the stacked path
        assert {len(m) for m in ad._stacks} == {1, 2, 3}         # q/k/v and gate/up stacked, o and down alone
        with torch.enable_grad():                                 # the per-linear path, through the parameters
            slow = e.model(input_ids=torch.tensor([ids])).logits.float()
    ad.detach()
    base = e.forward(ids)
    v = base.shape[-1]
    torch.testing.assert_close(fast[..., :v], slow.detach()[..., :v], rtol=1e-4, atol=1e-4)
    assert torch.equal(fast[0, :n - 3, :v], base[0, :n - 3])
    assert not torch.allclose(fast[0, -1, :v], base[0, -1], atol=1e-3)


# ---------------------------------------------------------------- files, finding, fit

@pytest.mark.parametrize("cls", KINDS)
def test_find_save_load_and_the_fingerprint_check(cls, tmp_path):
    e0, e1, narrow = random_engine(0), random_engine(1), random_engine(0, hidden=32)
    assert cls.find(e0) is None                                   # none: None (available() says how to train)
    with pytest.raises(FileNotFoundError, match=f"python -m paradec train {cls.KIND}"):
        cls.require(e0)
    with pytest.raises(AdapterError, match="no "):
        cls.find(e0, tmp_path / "missing")
    ad = made_for(cls, e0)
    folder = ad.save(tmp_path / cls.KIND)
    cfg = json.loads((folder / cls.CONFIG).read_text())
    assert cfg["format"] == cls.FORMAT and cfg["base_fingerprint"] == fingerprint(e0.model)
    back = cls.find(random_engine(0), folder)                     # the same weights: accepted
    for k, v in ad.tensors().items():
        assert torch.equal(v, back.tensors()[k]), k
    with pytest.raises(AdapterError, match=f"trained for .* not for .*python -m paradec train {cls.KIND}"):
        cls.find(e1, folder)                                      # same shapes, other weights
    with pytest.raises(AdapterError, match="hidden_size"):
        cls.find(narrow, folder)
    # files written before the fingerprint existed load as they did: by their signature and shapes only
    del cfg["base_fingerprint"]
    (folder / cls.CONFIG).write_text(json.dumps(cfg))
    assert cls.find(random_engine(1), folder) is not None
    with pytest.raises(AdapterError, match="hidden_size"):
        cls.find(random_engine(0, hidden=32), folder)


def test_default_folders_profile_first_then_the_model_folder(tmp_path):
    e = random_engine(0)
    model = tmp_path / "m"
    e.model.save_pretrained(model)
    e.tokenizer.save_pretrained(model)
    user = Engine.load(str(model), device="cpu")
    assert LUDAdapter.folders(user) == [model / "lud"] and LUDAdapter.default_dir(user) == model / "lud"
    assert LUDAdapter.find(user) is None
    made_for(LUDAdapter, user, seed=1).save(model / "lud")
    found = LUDAdapter.find(user)
    assert found is not None and found is LUDAdapter.find(user)
    shipped = tmp_path / "shipped"
    user2 = Engine.load(str(model), device="cpu")
    user2.profile = replace(user2.profile, adapters=shipped)
    assert LUDAdapter.folders(user2) == [shipped / "lud", model / "lud"]
    assert LUDAdapter.default_dir(user2) == shipped / "lud"
    assert LUDAdapter.find(user2) is not None                     # the model folder's, while shipped/ has none
    other = made_for(LUDAdapter, user2, seed=2)
    other.save(shipped / "lud")
    user2.extras.clear()
    k = next(iter(other.lora_b))
    got = LUDAdapter.find(user2).lora_b[k]          # in the engine's dtype (bf16 where `auto` picks it)
    assert torch.equal(got, other.lora_b[k].to(got.dtype))                  # now the profile's folder wins
    assert not torch.equal(found.lora_b[k], other.lora_b[k])


def test_the_fingerprint_does_not_depend_on_the_load_dtype():
    e = random_engine(0)
    fp = fingerprint(e.model)
    assert fingerprint(e.model.to(torch.bfloat16)) == fp
    e1 = random_engine(1)
    assert fingerprint(e1.model) != fp


def test_shipped_parameter_files_load_unchanged():
    """paradec-tiny's PTP, LUD and FocusLLM parameters (saved before the shared base and before the fingerprint)
    are found beside the model, fit it, hold exactly the files' tensors, and their strategies run."""
    e = Engine.load("paradec-tiny", dtype="float32")
    for cls in KINDS:
        ad = cls.find(e)
        assert ad is not None and cls.default_dir(e) == TINY / cls.KIND
        assert get(cls.KIND).available(e) == (True, ""), cls.KIND
        file_cfg = json.loads((TINY / cls.KIND / cls.CONFIG).read_text())
        assert "base_fingerprint" not in file_cfg
        mine = ad.file_config()
        assert {k: mine[k] for k in file_cfg} == file_cfg, cls.KIND
        stored = load_file(str(TINY / cls.KIND / cls.WEIGHTS))
        held = ad.state_dict() if cls is PTPAdapter else ad.tensors()   # (PTP now stores its LoRA in bfloat16)
        assert sorted(held) == sorted(stored)
        for k, v in stored.items():
            assert torch.equal(held[k].float(), v.float()), (cls.KIND, k)
    prompt = "def add(a, b):\n"
    ar = tokens(e, "ar", prompt)
    assert tokens(e, "ptp", prompt) == ar
    assert tokens(e, "lud", prompt, threshold=1.0) == ar
    assert tokens(e, "focus", prompt) == ar                       # a prompt that fits: focus reads it as ar


def test_the_default_models_shipped_ptp_files_load_unchanged():
    ad = PTPAdapter.load(SHIPPED_PTP)
    cfg = json.loads((SHIPPED_PTP / PTPAdapter.CONFIG).read_text())
    assert ad.file_config() == cfg and ad.recorded_in(cfg)["fingerprint"] == "450bda05ae8aa0df"
    stored = load_file(str(SHIPPED_PTP / PTPAdapter.WEIGHTS))
    tensors = ad.tensors()
    assert sorted(tensors) == sorted(stored)
    assert all(tensors[k].dtype == v.dtype and torch.equal(tensors[k], v) for k, v in stored.items())


def test_a_copied_folder_is_cached_by_path(tmp_path):
    e = random_engine(0)
    made_for(FocusAdapter, e).save(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    a, b = FocusAdapter.find(e, tmp_path / "a"), FocusAdapter.find(e, tmp_path / "b")
    assert a is not b and FocusAdapter.find(e, str(tmp_path / "a")) is a


@pytest.mark.skipif(not __import__("paradec.kernels").kernels.packing_available(),
                    reason="torch without oneDNN's packed linears")
@pytest.mark.parametrize("use_native", [False, True])
@pytest.mark.parametrize("stack", [True, False])
@pytest.mark.parametrize("cls", KINDS)
def test_bf16_groups_take_one_packed_pair_and_add_once_into_the_stacked_product(cls, stack, use_native, monkeypatch):
    """bf16 on a CPU: a sibling group's deltas come from one packed first product and one block-diagonal second
    product; with the model's siblings stacked (kernels._Group) they are added once, into the stacked output.
    With paradec's native kernel (a few tail rows) a group's deltas are one call that adds them into the stacked
    output, or into a lone linear's output; a group whose siblings are not stacked takes the packed pair.
    Every way the gated rows get each linear's own delta (the per-linear training path, within bf16 rounding)
    and the others the base model's outputs bit for bit. (The hooks' ways: the lean pass adding the deltas itself
    is the next test.)"""
    from paradec import adapters, kernels, native
    if use_native and not native.available():
        pytest.skip(f"native kernel not available: {native.why()}")
    monkeypatch.setattr(adapters, "_NATIVE", use_native)
    monkeypatch.setattr(adapters, "_FUSE", False)
    e = random_engine(0)
    e.model.to(torch.bfloat16)
    kernels.pack_linears(e.model, stack=stack)
    ids = e.tokenizer("def f(x):\n    return x + 1")["input_ids"]
    ad = made_for(cls, e, std=0.2)
    if cls is FocusAdapter and not ad.rank:
        pytest.skip("full-rank focus deltas have no pairs")
    n = len(ids)
    whole_adds = []
    real = kernels.stacked_output
    monkeypatch.setattr(kernels, "stacked_output", lambda mods, x: whole_adds.append((len(mods), real(mods, x))) or whole_adds[-1][1])
    ad.attach(e.model)
    with ad.gated(torch.tensor([0] * (n - 3) + [1] * 3, dtype=torch.bool)):      # a suffix: a tail gate
        fast = e.forward(ids)
        if not use_native:
            assert {len(m) for m in ad._packs} == {1, 2, 3} and not ad._stacks and not ad._natives  # o, down alone
        elif stack:
            assert {len(m) for m in ad._natives} == {1, 2, 3} and not ad._packs and not ad._stacks
        else:
            assert {len(m) for m in ad._natives} == {1} and {len(m) for m in ad._packs} == {2, 3}
        with torch.enable_grad():                                 # the per-linear path (F.linear, float32 deltas)
            slow = e.model(input_ids=torch.tensor([ids])).logits.float()
    ad.detach()
    base = e.forward(ids)
    v = base.shape[-1]
    groups = [w for k, w in whole_adds if k > 1]          # q/k/v and gate/up (o and down are alone: never stacked)
    assert groups and all((w is not None) == stack for w in groups)
    assert all(w is None for k, w in whole_adds if k == 1)
    assert torch.equal(fast[0, :n - 3, :v], base[0, :n - 3])
    err = (fast[0, -3:, :v] - slow.detach()[0, -3:, :v]).abs().max()
    moved = (slow.detach()[0, -3:, :v] - base[0, -3:]).abs().max()
    assert moved > 0.05 and err < 0.1 * moved, (float(err), float(moved))


@pytest.mark.skipif(not __import__("paradec.kernels").kernels.packing_available(),
                    reason="torch without oneDNN's packed linears")
@pytest.mark.parametrize("cls", (PTPAdapter, LUDAdapter))
def test_the_lean_pass_adds_tail_deltas_itself_with_the_hooks_numbers(cls, monkeypatch):
    """bf16 on a CPU, batch 1, a tail gate, siblings stacked: paradec's lean pass runs each decoder linear's own
    forward and adds the gated rows' deltas itself (`adapters.fused`), one native call per sibling group. Logits
    and cache are the hooks' way's bit for bit. It steps aside - the hooks act - when a foreign hook sits on a
    linear (which then runs), when gradients are recorded, or when two adapters have open gates. With the gate shut
    (no gated row) it takes the lean way too and adds nothing."""
    from paradec import adapters, kernels, native
    if not native.available():
        pytest.skip(f"native kernel not available: {native.why()}")
    e = random_engine(0)
    e.model.to(torch.bfloat16)
    kernels.pack_linears(e.model)
    assert e.lean
    ids = e.tokenizer("def f(x):\n    return x + 1")["input_ids"]
    n = len(ids)
    ad = made_for(cls, e, std=0.2)
    fused_calls = []
    real = adapters._Fused.linear
    monkeypatch.setattr(adapters._Fused, "linear", lambda self, m, x: fused_calls.append(m) or real(self, m, x))
    gate = torch.tensor([0] * (n - 3) + [1] * 3, dtype=torch.bool)

    def run(fuse):
        monkeypatch.setattr(adapters, "_FUSE", fuse)
        fused_calls.clear()
        cache = e.new_cache()
        with torch.inference_mode(), ad.gated(gate):
            out = e.forward(ids, cache)
        return out, cache, len(fused_calls)

    base = e.forward(ids)
    ad.attach(e.model)
    try:
        (a, ca, na), (b, cb, nb) = run(True), run(False)
        layers = e.model.config.num_hidden_layers
        assert na == 7 * layers and nb == 0
        v = base.shape[-1]
        assert torch.equal(a, b)
        assert torch.equal(a[0, :n - 3, :v], base[0, :n - 3]) and (a[0, -3:, :v] - base[0, -3:]).abs().max() > 0.05
        for la, lb in zip(ca.layers, cb.layers):
            assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)

        seen = []
        h = e.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(1))
        try:
            c, _, nc = run(True)
        finally:
            h.remove()
        assert seen and nc == 0 and torch.equal(c, a)

        shut = torch.zeros(n, dtype=torch.bool)             # the gate shut: the lean way, the base's numbers
        monkeypatch.setattr(adapters, "_FUSE", True)
        fused_calls.clear()
        with torch.inference_mode(), ad.gated(shut):
            s = e.forward(ids, e.new_cache())
        assert len(fused_calls) == 7 * layers and torch.equal(s[0, :, :v], base[0])

        with torch.no_grad(), ad.gated(gate):
            x = e.model.model.embed_tokens(torch.tensor([ids]))
            assert adapters.fused(e.model, x) is not None
            with torch.enable_grad():
                assert adapters.fused(e.model, x.detach().requires_grad_()) is None
            other = made_for(PTPAdapter if cls is LUDAdapter else LUDAdapter, e).attach(e.model)
            try:
                assert adapters.fused(e.model, x) is not None          # the other's gate is closed
                with other.gated(1):
                    assert adapters.fused(e.model, x) is None
            finally:
                other.detach()
    finally:
        ad.detach()
    assert id(e.model) not in adapters._ON                 # (other tests' models may hold adapters)
