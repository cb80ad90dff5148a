"""paradec/fastpath.py: the Engine's lean pass gives transformers' own forward's logits and cache bit for bit, for
every kind of pass the strategies make, with the hooks and packed weights paradec puts on the modules."""
import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from paradec import fastpath, kernels
from paradec.engine import Engine
from paradec.testing import tokenizer_dir


def engine(kind="qwen2", dtype=torch.bfloat16, seed=3):
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    common = dict(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.3)
    torch.manual_seed(seed)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=False))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=True))
    return Engine(model.eval().to(dtype), tok, name=f"fast-{kind}")


def hf(e, ids=None, cache=None, positions=None, mask=None, keep=0, embeds=None):
    """The same pass through transformers' own forward (what Engine.forward did before the fast path)."""
    with torch.inference_mode():
        if ids is not None:
            ids = torch.as_tensor(ids)
            ids = ids[None] if ids.dim() == 1 else ids
        if positions is not None:
            positions = torch.as_tensor(positions)
            positions = positions[None] if positions.dim() == 1 else positions
        return e.model(input_ids=ids, inputs_embeds=embeds, past_key_values=cache, position_ids=positions,
                       attention_mask=mask, use_cache=cache is not None, logits_to_keep=keep).logits.float()


def same_cache(a, b) -> bool:
    return all(torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values) for x, y in zip(a.layers, b.layers))


PROMPT = [(7 * i) % 500 + 5 for i in range(40)]


@pytest.mark.parametrize("kind,dtype", [("qwen2", torch.bfloat16), ("llama", torch.bfloat16),
                                        ("qwen2", torch.float32)])
def test_prefill_one_token_and_verifying_passes_equal_transformers(kind, dtype):
    e = engine(kind, dtype)
    assert e.fast and e.describe()["forward"] == "paradec.fastpath"
    ca, cb = e.new_cache(), e.new_cache()
    assert torch.equal(e.forward(PROMPT, ca), hf(e, PROMPT, cb))                 # prefill, every position
    tok = 11
    for _ in range(4):                                                          # one-token passes (ar)
        a, b = e.forward([tok], ca, logits_to_keep=1), hf(e, [tok], cb, keep=1)
        assert torch.equal(a, b)
        tok = int(a[0, -1].argmax())
    new = [31, 32, 33, 34, 35]                                                  # a verifying pass (causal)
    assert torch.equal(e.forward(new, ca, logits_to_keep=5), hf(e, new, cb, keep=5))
    assert same_cache(ca, cb)
    e.crop(ca, 44)
    e.crop(cb, 44)
    allowed = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    mask = e.tree_mask(44, allowed)                                             # a tree pass (lookahead, ptp)
    pos = [44, 45, 45, 46]
    assert torch.equal(e.forward([3, 4, 5, 6], ca, pos, mask, logits_to_keep=4),
                       hf(e, [3, 4, 5, 6], cb, pos, mask, keep=4))
    assert same_cache(ca, cb)


def test_no_cache_embedding_input_and_a_padded_batch_equal_transformers():
    e = engine()
    assert torch.equal(e.forward(PROMPT), hf(e, PROMPT))
    emb = e.model.get_input_embeddings()(torch.tensor([PROMPT[:9]])) * 0.5           # inputs_embeds (ptp's u slots)
    ca, cb = e.new_cache(), e.new_cache()
    assert torch.equal(e.forward(None, ca, embeds=emb), hf(e, None, cb, embeds=emb))
    assert same_cache(ca, cb)
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])                          # left-padded batch
    pad = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    pos = (pad.cumsum(-1) - 1).clamp_min(0)
    ca, cb = e.new_cache(), e.new_cache()
    assert torch.equal(e.forward(ids, ca, pos, pad), hf(e, ids, cb, pos, pad))
    assert same_cache(ca, cb)


def test_hooks_on_the_modules_still_act():
    """Adapters (ptp, lud) hang forward hooks on the linears, the embedding and the head: the lean pass calls the
    modules, so a hook changes its output exactly as under transformers' forward."""
    e = engine()
    before = e.forward(PROMPT)
    a = e.model.model.layers[1].self_attn
    handles = [a.v_proj.register_forward_hook(lambda m, i, o: o * 1.5),
               e.model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: o + 0.25),
               e.model.lm_head.register_forward_hook(lambda m, i, o: o - 1.0)]
    try:
        hooked = e.forward(PROMPT)
        assert not torch.equal(hooked, before)
        assert torch.equal(hooked, hf(e, PROMPT))
    finally:
        for h in handles:
            h.remove()
    assert torch.equal(e.forward(PROMPT), before)


def test_what_it_does_not_know_goes_through_transformers(monkeypatch):
    e = engine()
    assert fastpath.supports(e.model)
    monkeypatch.setenv("PARADEC_FASTPATH", "0")
    assert not fastpath.supports(e.model)
    monkeypatch.delenv("PARADEC_FASTPATH")
    e.model.model.layers[0].self_attn.q_norm = torch.nn.Identity()             # an extra norm (Qwen3-style)
    assert not fastpath.supports(e.model)
    del e.model.model.layers[0].self_attn.q_norm
    e.model.set_attn_implementation("sdpa")                                     # not paradec's exact attention
    assert not fastpath.supports(e.model)
    e.model.set_attn_implementation("paradec-exact")
    e.model.config.model_type = "gemma"                                         # an architecture it was not checked on
    assert not fastpath.supports(e.model)


@pytest.mark.skipif(not kernels.packing_available(), reason="torch without oneDNN's packed linears")
def test_packed_and_stacked_weights_equal_transformers():
    """The default model runs with packed bf16 weights, q/k/v and gate/up stacked (paradec/kernels.py): the lean pass
    calls the siblings in transformers' order, so the stacked product is shared the same way."""
    e = engine()
    assert kernels.pack_linears(e.model) > 0
    ca, cb = e.new_cache(), e.new_cache()
    assert torch.equal(e.forward(PROMPT, ca), hf(e, PROMPT, cb))
    for tok in (5, 6, 7):
        assert torch.equal(e.forward([tok], ca, logits_to_keep=1), hf(e, [tok], cb, keep=1))
    assert torch.equal(e.forward([8, 9, 10], ca, logits_to_keep=3), hf(e, [8, 9, 10], cb, keep=3))
    assert same_cache(ca, cb)


def test_a_hook_on_the_whole_model_still_fires():
    """The lean pass does not call the model or its decoder module, so while a hook sits on either the engine goes
    through transformers' forward (a pass counter on the model counts every pass)."""
    e = engine()
    calls = []
    assert e.lean
    h = e.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        assert not e.lean
        c = e.new_cache()
        e.forward(PROMPT, c)
        e.forward([5], c, logits_to_keep=1)
        assert len(calls) == 2
    finally:
        h.remove()
    assert e.lean
