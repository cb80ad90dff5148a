"""Engine loading errors, request validation, and the shared sampling mechanisms."""
import subprocess
import sys

import pytest
import torch

from paradec import sampling
from paradec.engine import Engine, ModelError, load_model
from paradec.strategies import Request, RequestError, get

from conftest import ROOT, random_engine


def test_missing_path_is_clear(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        load_model(str(tmp_path / "nope"))


def test_folder_that_is_not_a_model(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelError, match="not a model folder"):
        load_model(str(tmp_path))


def test_model_that_is_not_causal(tmp_path):
    from transformers import ViTConfig, ViTModel
    ViTModel(ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
                       image_size=8, patch_size=4)).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="not a causal language model"):
        load_model(str(tmp_path))


def test_model_without_tokenizer(tmp_path):
    e = random_engine(0)
    e.model.save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="tokenizer"):
        load_model(str(tmp_path))


def test_hub_id_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="offline"):
        load_model("some-org/some-model-that-is-not-cached")


def test_random_model_round_trip(tmp_path):
    """Any Llama-style folder with a tokenizer loads (in float32 here, as the random model was made: `auto` would be
    bf16 on a CPU with native bf16 matrix support, e.g. avx512_bf16) and decodes exactly as the original."""
    e = random_engine(1)
    e.model.save_pretrained(tmp_path)
    e.tokenizer.save_pretrained(tmp_path)
    e2 = Engine.load(str(tmp_path), device="cpu", dtype="float32")
    assert e2.dtype == torch.float32 and e2.device.type == "cpu"
    r = Request(prompt="import os", chat=False, max_new_tokens=5, ignore_eos=True)
    a = [t for s in get("ar").stream(e, r) for t in s.token_ids]
    b = [t for s in get("ar").stream(e2, r) for t in s.token_ids]
    assert a == b and len(a) == 5


def test_cli_errors_exit_nonzero(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "paradec", "generate", "--model", str(tmp_path / "missing"),
                        "--prompt", "hi"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 2 and "does not exist" in p.stderr
    p = subprocess.run([sys.executable, "-m", "paradec", "generate", "--model", "org/absent-model",
                        "--prompt", "hi"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert p.returncode == 2 and "offline" in p.stderr


@pytest.mark.parametrize("kw,msg", [
    (dict(prompt=""), "empty"),
    (dict(prompt="   "), "empty"),
    (dict(prompt="x" * 300_000), "limit"),
    (dict(prompt="hi", max_new_tokens=0), "max_new_tokens"),
    (dict(prompt="hi", max_new_tokens=-3), "max_new_tokens"),
    (dict(prompt="hi", temperature=-1.0), "temperature"),
    (dict(prompt="hi", top_p=0.0), "top_p"),
    (dict(prompt="hi", top_k=-1), "top_k"),
    (dict(prompt="hi", seed=-1), "seed"),
    (dict(prompt="hi", stop=[""]), "stop"),
])
def test_request_validation(kw, msg):
    with pytest.raises(RequestError, match=msg):
        Request(**kw).validate()


def test_prompt_over_context(tiny_engine):
    with pytest.raises(RequestError, match="context"):
        Request(prompt="word " * 600, max_new_tokens=10).validate(tiny_engine)


def test_unknown_strategy_and_param(tiny_engine):
    with pytest.raises(RequestError, match="unknown strategy"):
        get("nope")
    with pytest.raises(RequestError, match="unknown parameter"):
        list(get("hf-generate").stream(tiny_engine, Request(prompt="hi", params={"bogus": 1})))


def test_top_k_top_p_processing():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    p = sampling.process(logits, sampling.SamplingParams(1.0, top_k=2))
    assert (p[2:] == 0).all() and abs(p.sum().item() - 1) < 1e-6
    full = torch.softmax(logits, -1)
    p = sampling.process(logits, sampling.SamplingParams(1.0, top_p=0.7))
    # the smallest prefix of the sorted distribution reaching 0.7
    k = int((full.cumsum(-1) < 0.7).sum()) + 1
    assert (p[:k] > 0).all() and (p[k:] == 0).all()
    g = sampling.process(logits, sampling.SamplingParams(0.0))
    assert g.argmax() == 0 and g.sum() == 1


def test_inverse_cdf_pick():
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    assert [int(sampling.pick(probs, u)) for u in (0.0, 0.05, 0.1001, 0.29, 0.31, 0.61, 0.99)] == [0, 0, 1, 1, 2, 3, 3]
    lo, hi = sampling.cdf_bin(probs, 2)
    assert abs(lo - 0.3) < 1e-6 and abs(hi - 0.6) < 1e-6
    us = sampling.UStream(7)
    assert us[100] == sampling.UStream(7)[100] and us[0] != us[1]


def test_batched_prefill_matches_single(tiny_engine):
    e = tiny_engine
    rows = [e.tokenizer("def f(x):\n    return x + 1")["input_ids"], e.tokenizer("import os")["input_ids"]]
    last, cache, mask, pos = e.prefill_batch(rows)
    for i, r in enumerate(rows):
        single = e.forward(r, e.new_cache())[0, -1]
        assert torch.allclose(single, last[i], atol=1e-4)
    # one batched decode step equals the single-row continuation
    nxt = last.argmax(-1)
    step, _ = e.decode_batch(nxt, cache, mask, pos)
    for i, r in enumerate(rows):
        single = e.forward(r + [int(nxt[i])], e.new_cache())[0, -1]
        assert torch.allclose(single, step[i], atol=1e-4)


def test_cache_surgery_methods(tiny_engine):
    """The engine's public cache edits: reading keys/values, building from them, copying, batch expansion, rows
    laid end to end, and the batch mask - each against the computation it stands for."""
    e = tiny_engine
    g = torch.Generator().manual_seed(2)
    rows = [torch.randint(10, 8000, (n,), generator=g).tolist() for n in (9, 5, 7)]
    _, bcache, mask, _ = e.prefill_batch(rows)
    kv = e.cache_kv(bcache)
    assert len(kv) == e.model.config.num_hidden_layers and kv[0][0].shape[:3] == (3, kv[0][0].shape[1], 9)
    # concat_rows: row i from starts[i] on, end to end, batch 1
    starts = [9 - len(r) for r in rows]
    joined = e.concat_rows(bcache, starts)
    assert e.cache_len(joined) == sum(map(len, rows))
    for (k, v), (jk, jv) in zip(kv, e.cache_kv(joined)):
        assert jk.shape[0] == 1
        assert torch.equal(jk, torch.cat([k[i:i + 1, :, s:] for i, s in enumerate(starts)], -2))
        assert torch.equal(jv, torch.cat([v[i:i + 1, :, s:] for i, s in enumerate(starts)], -2))
    # ... or only the rows named, in the order named
    picked = e.concat_rows(bcache, [starts[2], starts[0]], [2, 0])
    for (k, v), (pk, pv) in zip(kv, e.cache_kv(picked)):
        assert torch.equal(pk, torch.cat([k[2:3, :, starts[2]:], k[0:1, :, starts[0]:]], -2))
        assert torch.equal(pv, torch.cat([v[2:3, :, starts[2]:], v[0:1, :, starts[0]:]], -2))
    # cache_from_kv rebuilds a cache that continues exactly like the original
    ids = e.tokenizer("one two three four")["input_ids"]
    cache = e.new_cache()
    e.forward(ids, cache)
    rebuilt = e.cache_from_kv([(k.clone(), v.clone()) for k, v in e.cache_kv(cache)])
    assert torch.equal(e.forward([5], rebuilt)[0, -1], e.forward([5], e.copy_cache(cache))[0, -1])
    # copy_cache: extending the copy leaves the original as it was
    twin = e.copy_cache(cache)
    e.forward([6, 7], twin)
    assert e.cache_len(twin) == len(ids) + 2 and e.cache_len(cache) == len(ids)
    # repeat_cache: copy-major batch expansion, the original untouched
    rep = e.repeat_cache(bcache, 2)
    for (k, v), (rk, rv) in zip(kv, e.cache_kv(rep)):
        assert rk.shape[0] == 6 and torch.equal(rk[3:], k) and torch.equal(rk[:3], k) and torch.equal(rv[4], v[1])
    assert e.cache_kv(bcache)[0][0].shape[0] == 3
    # batch_mask: causal + padding, a fully padded query row sees itself (no NaN)
    m = e.batch_mask(torch.tensor([[0, 1, 1], [1, 1, 1]]), 2)
    allowed = m == 0
    assert m.shape == (2, 1, 2, 3)
    assert allowed[0, 0].tolist() == [[False, True, False], [False, True, True]]
    assert allowed[1, 0].tolist() == [[True, True, False], [True, True, True]]
    assert e.batch_mask(torch.tensor([[0, 0, 1]]), 2)[0, 0, 0].eq(0).tolist() == [False, True, False]


def test_cache_crop_rolls_back(tiny_engine):
    e = tiny_engine
    ids = e.tokenizer("one two three four")["input_ids"]
    cache = e.new_cache()
    e.forward(ids, cache)
    ref = e.forward([5], cache)[0, -1]
    e.crop(cache, len(ids))
    assert e.cache_len(cache) == len(ids)
    again = e.forward([5], cache)[0, -1]
    assert torch.allclose(ref, again, atol=1e-5)
