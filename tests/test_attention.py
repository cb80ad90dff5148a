"""Row-exact attention (paradec/attention.py): a row of a many-row pass has the numbers of a one-token pass bit
for bit, in bfloat16 too, where torch's fused attention does not; GQA, tree masks and the SDPA fallback."""
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from paradec import attention
from paradec.engine import Engine
from paradec.testing import tokenizer_dir


def gqa_engine(dtype=torch.bfloat16, exact=True):
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir()))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.3, tie_word_embeddings=True)
    torch.manual_seed(4)
    e = Engine(LlamaForCausalLM(cfg).eval().to(dtype), tok, name="gqa")
    if not exact:
        e.model.set_attn_implementation("sdpa")
    return e


def passes(e, prompt_len=150, n=10):
    """(logits of n tokens in one pass, the same n tokens fed one pass each) after a prompt."""
    ids = [(7 * i) % 500 + 5 for i in range(prompt_len)]
    new = [(13 * i) % 400 + 9 for i in range(n)]
    c = e.new_cache()
    e.forward(ids, c, logits_to_keep=1)
    multi = e.forward(new, c, logits_to_keep=n)[0]
    e.crop(c, prompt_len)
    one = torch.cat([e.forward([t], c, logits_to_keep=1)[0] for t in new])
    return multi, one


def test_the_engine_uses_it_and_every_row_of_a_pass_is_a_one_token_pass():
    e = gqa_engine()
    assert e.attention == attention.NAME == e.model.config._attn_implementation
    assert e.describe()["attention"] == attention.NAME
    multi, one = passes(e)
    assert torch.equal(multi, one)
    # a tree mask: the real rows (a causal prefix) stay exact while later rows attend elsewhere
    ids = [(5 * i) % 300 + 3 for i in range(120)]
    c = e.new_cache()
    e.forward(ids, c, logits_to_keep=1)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()
    allowed[3:, :3] = False                     # rows 3-5: a branch that sees the cache and itself only
    allowed[3:, 3:] = torch.ones(3, 3, dtype=torch.bool).tril()
    toks = [11, 12, 13, 21, 22, 23]
    pos = [120, 121, 122, 120, 121, 122]       # the branch stands where the real rows do
    tree = e.forward(toks, c, pos, mask=e.tree_mask(120, allowed), logits_to_keep=6)[0]
    e.crop(c, 120)
    alone = torch.cat([e.forward([t], c, logits_to_keep=1)[0] for t in toks[:3]])
    assert torch.equal(tree[:3], alone)
    e.crop(c, 120)
    branch = e.forward(toks[3:], c, logits_to_keep=3)[0]      # the branch's own tokens, causal after the cache
    assert torch.equal(tree[3:], branch)


def tree_rows_against_one_token_passes(e, ids, trials=8, W=7, current=True):
    """Rows of lookahead-shaped passes (the current token when `current`, a W-row window, then a 3-token candidate
    branch that skips the window) against the same tokens fed one pass each: how many of the branch's rows differ."""
    differ = 0
    for trial in range(trials):
        n0 = 100 + 37 * trial
        k = 1 if current else 0
        c = e.new_cache()
        e.forward(ids[:n0 - k], c, logits_to_keep=1)
        allowed = torch.ones(k + W + 3, k + W + 3, dtype=torch.bool).tril()
        allowed[k + W:, k:k + W] = False                                      # the branch skips the window
        cand = ids[n0:n0 + 3]
        toks = ids[n0 - k:n0] + [ids[(n0 * 7 + i) % len(ids)] for i in range(W)] + cand
        pos = list(range(n0 - k, n0 + W)) + [n0, n0 + 1, n0 + 2]
        tree = e.forward(toks, c, pos, mask=e.tree_mask(n0 - k, allowed), logits_to_keep=len(toks))[0]
        e.crop(c, n0 - k)
        alone = [e.forward([t], c, logits_to_keep=1)[0, -1] for t in ids[n0 - k:n0] + cand]
        differ += sum(not torch.equal(x, y) for x, y in zip(list(tree[:k]) + list(tree[k + W:]), alone))
    return differ


def test_tree_rows_that_skip_keys_are_one_token_passes():
    """Lookahead's candidate rows see the context, skip the window's rows, then see their own chain: their softmax
    sums the same terms with zeros between them. With a float32 softmax the branch after the 137-token cache below
    differed (by 0.125 in a logit, AMD EPYC, 2026-12-04); the float64 softmax makes every row bit-identical to `ar`'s."""
    e = gqa_engine()
    ids = [(5 * i) % 300 + 3 for i in range(500)]
    assert tree_rows_against_one_token_passes(e, ids) == 0
    W = 7
    for n0 in (100, 137, 174):                 # a window of tokens 11..17, the branch 21, 22, 23 after it
        c = e.new_cache()
        e.forward(ids[:n0], c, logits_to_keep=1)
        allowed = torch.ones(W + 3, W + 3, dtype=torch.bool).tril()
        allowed[W:, :W] = False
        toks = list(range(11, 11 + W)) + [21, 22, 23]
        pos = list(range(n0, n0 + W)) + [n0, n0 + 1, n0 + 2]
        tree = e.forward(toks, c, pos, mask=e.tree_mask(n0, allowed), logits_to_keep=W + 3)[0]
        e.crop(c, n0)
        alone = torch.cat([e.forward([t], c, logits_to_keep=1)[0] for t in [21, 22, 23]])
        assert torch.equal(tree[W:], alone), n0


def test_the_fused_kernel_is_what_it_replaces_and_is_not_row_exact():
    """The reason for the module (so this test would notice a torch whose SDPA became row-exact): the same model
    through SDPA differs between the pass shapes, and differs from the exact attention only by rounding."""
    sdpa = gqa_engine(exact=False)
    s_multi, s_one = passes(sdpa, prompt_len=300, n=16)
    x_multi, _ = passes(gqa_engine(), prompt_len=300, n=16)
    torch.testing.assert_close(x_multi.float(), s_multi.float(), rtol=0.05, atol=0.3)
    assert not torch.equal(s_multi, s_one)


def test_float32_and_a_padded_batch_match_sdpa():
    for dtype in (torch.float32,):
        x, s = gqa_engine(dtype), gqa_engine(dtype, exact=False)
        rows = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
        lx, _, mx, _ = x.prefill_batch(rows)
        ls, _, ms, _ = s.prefill_batch(rows)
        torch.testing.assert_close(lx, ls, rtol=1e-4, atol=1e-4)
        multi, one = passes(x)          # float32's streamed linears sum in another order for 2+ rows: close only
        torch.testing.assert_close(multi, one, rtol=1e-4, atol=1e-4)


def test_a_long_prefill_goes_to_sdpa(monkeypatch):
    calls = []
    from transformers.integrations import sdpa_attention
    real = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(attention, "EXACT_MAX_SCORES", 100 * 100)
    e = gqa_engine()
    e.forward(list(range(5, 70)), e.new_cache(), logits_to_keep=1)        # 65 rows x 65 keys < 10,000: exact
    assert not calls
    e.forward(list(range(5, 205)), e.new_cache(), logits_to_keep=1)       # 200 x 200: SDPA
    assert len(calls) == 2                                                # once per layer


def test_on_the_default_model_a_prompt_plus_drafts_pass_gives_the_drafts_one_token_numbers(default_engine):
    """What pld, sps, ptp and lookahead do in their first pass (prompt and proposals together, over 32 rows) must
    give the proposals' rows the logits `ar` computes for them one pass at a time: both the attention and the
    packed bf16 down projection (`kernels.row_plan`) are row-exact there. Without the row pieces 6 of these 11
    rows differ (Intel Xeon with AMX-BF16, 2026-12-03)."""
    e = default_engine
    ids = e.tokenizer(("The quick brown fox jumps over the lazy dog while the cat sleeps. " * 30))["input_ids"][:200]
    together = e.forward(ids, e.new_cache(), logits_to_keep=11)[0]
    c = e.new_cache()
    apart = [e.forward(ids[:190], c, logits_to_keep=1)[0, -1]]
    apart += [e.forward([t], c, logits_to_keep=1)[0, -1] for t in ids[190:]]
    assert all(torch.equal(together[i], apart[i]) for i in range(11))
    # lookahead's tree rows too (4 of 32 differed, by up to 0.25, with a float32 softmax: AMD EPYC, 2026-12-04)
    text = "The quick brown fox jumps over the lazy dog while the cat sleeps. Meanwhile the river flows. " * 40
    assert tree_rows_against_one_token_passes(e, e.tokenizer(text)["input_ids"], trials=4) == 0


def test_a_long_prefill_gets_sdpa_causal_flag_and_no_materialised_mask(monkeypatch):
    """A prompt too long for the exact products builds no L x L mask: SDPA gets None (its causal flag) and the
    logits equal the model's under transformers' own SDPA; a pass after a cache or a padded batch keeps a mask."""
    masks = []
    from transformers.integrations import sdpa_attention
    real = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda m, q, k, v, mask, *a, **kw: masks.append(mask) or real(m, q, k, v, mask, *a, **kw))
    x, s = gqa_engine(), gqa_engine(exact=False)
    ids = [(7 * i) % 500 + 5 for i in range(600)]                  # 600 rows x 600 keys: past EXACT_MAX_SCORES
    assert attention.goes_to_sdpa(600, 600) and not attention.goes_to_sdpa(64, 10_000)
    cx, cs = x.new_cache(), s.new_cache()
    assert torch.equal(x.forward(ids, cx, logits_to_keep=1), s.forward(ids, cs, logits_to_keep=1))
    assert masks and all(m is None for m in masks)
    masks.clear()
    more = [(3 * i) % 400 + 9 for i in range(520)]                 # 520 rows after 600 cached: a real mask
    assert torch.equal(x.forward(more, cx, logits_to_keep=1), s.forward(more, cs, logits_to_keep=1))
    assert masks and all(m is not None for m in masks[:2])
    masks.clear()
    rows = [ids, ids[:580]]                                        # left padding: a real mask
    lx, _, _, _ = x.prefill_batch(rows)
    ls, _, _, _ = s.prefill_batch(rows)
    assert masks and masks[0] is not None
    torch.testing.assert_close(lx.float(), ls.float(), rtol=0, atol=0.05)


def test_a_batch_of_equal_long_rows_prefills_with_the_causal_flag_and_each_row_as_alone(monkeypatch):
    """prefill_batch of rows of one length (pcw's and ape's chunks) passes no padding mask: SDPA gets its causal
    flag, and each row's last logits equal the row prefilled alone."""
    masks = []
    from transformers.integrations import sdpa_attention
    real = sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda m, q, k, v, mask, *a, **kw: masks.append(mask) or real(m, q, k, v, mask, *a, **kw))
    e = gqa_engine()
    rows = [[(7 * i + 3 * r) % 500 + 5 for i in range(600)] for r in range(3)]
    last, _, mask, nxt = e.prefill_batch(rows)
    assert masks and all(m is None for m in masks) and bool(mask.all()) and nxt.tolist() == [600] * 3
    for r, row in enumerate(rows):
        assert torch.equal(last[r], e.forward(row, e.new_cache(), logits_to_keep=1)[0, -1])
