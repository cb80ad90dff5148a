"""`pcw` (Parallel Context Windows): single chunk == ar, batched chunks == chunks alone, question positions,
prompt splitting and the limits. All on the random tiny engine (context 512)."""
from contextlib import nullcontext

import pytest
import torch

from paradec.strategies import Request, RequestError, get
from paradec.strategies.parallel_context import encode_chunks, question_start

SENTS = ["The ferry crossed the bay twice a day in good weather.", "An owl called from the woods at dusk.",
         "def parse(line):\n    return line.split(',')", "Fresh bread was served in the small cafe.",
         "The students copied the notes from the board.", "import os\nprint(os.getcwd())"]


def text_of(n_sents, seed=0):
    g = torch.Generator().manual_seed(seed)
    return " ".join(SENTS[int(i)] for i in torch.randint(len(SENTS), (n_sents,), generator=g))


def run(engine, name, req):
    steps = list(get(name).stream(engine, req))
    return [t for s in steps for t in s.token_ids], steps


@pytest.mark.parametrize("prompt,chat", [
    (text_of(12, 1), False),
    (text_of(20, 2) + "\n\nWhat is the pass key? The pass key is", False),
    (text_of(8, 3) + "\n\nQuestion: what did the owl do?", True),
    ("def add(a, b):\n    return a + b\n", False),
])
def test_single_chunk_equals_ar_greedy(tiny_engine, prompt, chat):
    req = Request(prompt=prompt, chat=chat, max_new_tokens=24, ignore_eos=True)
    ar_ids, _ = run(tiny_engine, "ar", req)
    pcw_ids, steps = run(tiny_engine, "pcw", req)
    assert steps[0].info["chunks"] == 1 and steps[0].token_ids == [] and steps[0].prefill
    assert pcw_ids == ar_ids
    assert len(pcw_ids) == 24


def test_single_chunk_equals_ar_sampled(tiny_engine):
    req = Request(prompt=text_of(15, 4), chat=False, max_new_tokens=20, temperature=0.9, top_p=0.95, seed=7,
                  ignore_eos=True)
    assert run(tiny_engine, "pcw", req)[0] == run(tiny_engine, "ar", req)[0]


def _alone(engine, chunk):
    cache = engine.new_cache()
    engine.forward(chunk, cache, logits_to_keep=1)
    return cache


@pytest.mark.parametrize("shared", [0, 1, 6])
def test_batched_chunks_equal_chunks_alone(tiny_engine, shared):
    """Chunks in one batch give each chunk's own key/values; a shared start (a BOS, APE's prefix) is encoded once
    and kept once, and the chunks encoded after it match chunks that hold it themselves."""
    g = torch.Generator().manual_seed(5)
    lens = [37, 50, 23, 50]
    chunks = [torch.randint(10, 8000, (n,), generator=g).tolist() for n in lens]
    if shared:                       # the same first tokens in every chunk, kept once
        chunks = [[3, 17, 29, 41, 53, 67][:shared] + c for c in chunks]
    cache = encode_chunks(tiny_engine, chunks, shared)
    assert tiny_engine.cache_len(cache) == sum(map(len, chunks)) - shared * (len(chunks) - 1)
    for li in range(len(cache.layers)):
        k, v = cache.layers[li].keys, cache.layers[li].values
        assert k.shape[0] == 1
        at = 0
        for i, c in enumerate(chunks):
            ref = _alone(tiny_engine, c).layers[li]
            skip = shared if i else 0
            n = len(c) - skip
            torch.testing.assert_close(k[:, :, at:at + n], ref.keys[:, :, skip:], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(v[:, :, at:at + n], ref.values[:, :, skip:], atol=1e-5, rtol=1e-4)
            at += n
        assert at == k.shape[2]


def test_question_positions_start_at_longest_chunk(tiny_engine, monkeypatch):
    prompt = text_of(40, 6) + "\n\nWhat is the pass key? The pass key is"
    req = Request(prompt=prompt, chat=False, max_new_tokens=6, ignore_eos=True, params={"window": 100})
    lay = get("pcw").layout(tiny_engine, req)
    chunks, question = lay["chunks"], lay["question"]
    assert len(chunks) >= 3 and max(map(len, chunks)) <= 100
    assert sum(map(len, chunks)) + len(question) == len(lay["ids"])
    assert tiny_engine.decode(question).endswith("What is the pass key? The pass key is")

    calls, real = [], tiny_engine.forward

    def recording(ids, cache=None, positions=None, mask=None, logits_to_keep=0, **kw):
        out = real(ids, cache, positions, mask, logits_to_keep, **kw)
        calls.append((positions, out))
        return out
    monkeypatch.setattr(tiny_engine, "forward", recording)
    ids, steps = run(tiny_engine, "pcw", req)
    monkeypatch.undo()

    longest = max(map(len, chunks))
    assert steps[0].info["chunk_lengths"] == [len(c) for c in chunks]
    assert steps[0].forward_passes == 1 and steps[0].token_ids == []     # ONE batched chunk pass
    assert sum(s.forward_passes for s in steps) == 1 + len(ids)
    # calls[0] is the batched chunk prefill (positions restart at 0 in every row)
    pos0 = torch.as_tensor(calls[0][0])
    assert pos0.shape[0] == len(chunks) and int(pos0[:, -1].max()) == longest - 1
    q_pos = list(calls[1][0])
    assert q_pos == list(range(longest, longest + len(question)))
    assert [list(c[0]) for c in calls[2:]] == [[longest + len(question) + i] for i in range(len(ids) - 1)]

    # the first answer logits equal a hand-built PCW: chunks alone, caches laid end to end, question after
    ref = tiny_engine.new_cache()
    alone = [_alone(tiny_engine, c) for c in chunks]
    for li in range(len(alone[0].layers)):
        ref.update(torch.cat([a.layers[li].keys for a in alone], -2),
                   torch.cat([a.layers[li].values for a in alone], -2), li)
    past = tiny_engine.cache_len(ref)
    mask = tiny_engine.tree_mask(past, torch.ones(len(question), len(question), dtype=torch.bool).tril())
    got = calls[1][1][0, -1]
    ref_logits = tiny_engine.forward(question, ref, list(range(longest, longest + len(question))), mask, 1)[0, -1]
    torch.testing.assert_close(got, ref_logits, atol=1e-4, rtol=1e-4)
    # ... and the check is sensitive to the positions: sequential positions give other logits
    ref2 = tiny_engine.new_cache()
    for li in range(len(alone[0].layers)):
        ref2.update(torch.cat([a.layers[li].keys for a in alone], -2),
                    torch.cat([a.layers[li].values for a in alone], -2), li)
    seq_logits = tiny_engine.forward(question, ref2, list(range(past, past + len(question))), mask, 1)[0, -1]
    assert (seq_logits - ref_logits).abs().max() > 1e-3


def test_question_split_rules(tiny_engine):
    e = tiny_engine
    body = text_of(30, 8)
    ids = e.tokenizer(body + "\n\nQuestion: where did the ferry go?\n\nAnswer briefly.")["input_ids"]
    q = question_start(e, ids, 64)
    assert e.decode(ids[q:]).lstrip(" .").startswith("\n\nQuestion:") and body[-20:] in e.decode(ids[:q + 1])
    ids = e.tokenizer(body + "\n\nWhat is the pass key? The pass key is")["input_ids"]
    q = question_start(e, ids, 64)
    assert e.decode(ids[q:]).lstrip(" .").startswith("\n\nWhat is") and len(ids) - q < 20
    ids = e.tokenizer(body)["input_ids"]                     # no marker, no paragraph: last question_tokens
    assert question_start(e, ids, 64) == len(ids) - 64
    assert question_start(e, ids[:10], 64) == 1                # always keep one context token


def test_long_prompt_accepted_beyond_context_and_limits(tiny_engine):
    long = text_of(260, 9) + "\n\nWhat is the pass key? The pass key is"
    n = len(tiny_engine.tokenizer(long)["input_ids"])
    assert n > 1200 > tiny_engine.context_length
    req = Request(prompt=long, chat=False, max_new_tokens=4, ignore_eos=True)
    with pytest.raises(RequestError):
        run(tiny_engine, "ar", req)
    ids, steps = run(tiny_engine, "pcw", req)
    assert len(ids) == 4 and steps[0].info["chunks"] >= 3
    assert max(steps[0].info["chunk_lengths"]) <= tiny_engine.context_length - 4
    small = Request(prompt=long, chat=False, max_new_tokens=4, params={"window": 100, "max_chunks": 5})
    with pytest.raises(RequestError, match=r"max_chunks=5"):
        run(tiny_engine, "pcw", small)
    wide = Request(prompt=long, chat=False, max_new_tokens=100, params={"window": 480})
    with pytest.raises(RequestError, match="exceed the model's context"):
        run(tiny_engine, "pcw", wide)
    with pytest.raises(RequestError, match="unknown parameter"):
        run(tiny_engine, "pcw", Request(prompt="hi", params={"windw": 3}))


def test_eval_script_pieces(tiny_engine):
    """The evaluation's truncated baseline (in the request's window), ar-full (the model's own context) and its
    prefill timing rows."""
    from evals import longcontext_eval as lc
    item = next(it for it in lc.load_items(["passkey"]) if it["approx_tokens"] == 2048)
    req = Request(prompt=item["prompt"], max_new_tokens=3, ignore_eos=True)
    text, n, kept = lc.ar_truncated(tiny_engine, req)
    assert n > tiny_engine.context_length and kept == tiny_engine.context_length - 3 and isinstance(text, str)
    small = Request(prompt=item["prompt"], max_new_tokens=3, ignore_eos=True, max_context=100)
    assert lc.ar_truncated(tiny_engine, small)[2] == 97
    req = Request(prompt=text_of(25, 2), chat=False, max_new_tokens=4, ignore_eos=True)
    assert 64 < len(tiny_engine.encode(req)) < tiny_engine.context_length - 4
    full = lc.run_strategy(tiny_engine, "ar-full", req, window=64)       # the window does not apply to ar-full
    assert full.name == "ar-full" and not full.error and len(full.token_ids) == 4
    assert lc.run_strategy(tiny_engine, "ar", req, window=64).error        # ar itself runs in the window
    rows = lc.prefill_cost(tiny_engine, 64, [2, 4], 1)
    assert [r["chunks"] for r in rows] == [2, 4] and [r["tokens"] for r in rows] == [128, 256]
    assert all(r["full_s"] > 0 and r["pcw_s"] > 0 and r["focus_s"] > 0 and r["kernel_full_s"] > 0 for r in rows)
    assert rows[0]["model"] == tiny_engine.name          # lengths within the model's context: the model itself
    assert all(r["select_s"] > 0 and r["select_ratio"] == r["full_s"] / r["select_s"] for r in rows)
    table = lc.timing_table(rows, tiny_engine)
    body = [ln for ln in table if ln.startswith("| 1") or ln.startswith("| 2")]
    assert "select=2 (s)" in table[2] and len(body) == 2 and all(ln.count("|") == 13 for ln in body)
    said = lc.reading([], [], 64, rows)
    assert any("`pcw+select=2`" in ln and f"{rows[-1]['select_s']:.1f} s" in ln for ln in said)


def test_long_prompts_reach_the_strategies_that_read_them(tiny_engine, tmp_path, capsys):
    """The CLI, the Arena and the server check a prompt's length against the context only when no strategy in
    the run reads longer prompts; `ar` then fails in its own lane, `pcw` answers."""
    import json

    from paradec.cli import main
    from paradec.strategies import length_check_engine
    assert length_check_engine(tiny_engine, ["ar", "pld"]) is tiny_engine
    assert length_check_engine(tiny_engine, ["ar", "pcw"]) is None
    assert length_check_engine(tiny_engine, "focus") is None
    folder = tmp_path / "tiny"
    tiny_engine.model.save_pretrained(folder)
    tiny_engine.tokenizer.save_pretrained(folder)
    prompt = text_of(150, 6) + "\n\nWhat is the pass key? The pass key is"
    assert len(tiny_engine.encode(Request(prompt=prompt, chat=False))) > 2 * tiny_engine.context_length
    assert main(["generate", "--model", str(folder), "--strategy", "pcw", "--raw", "--prompt", prompt,
                 "--max-new-tokens", "5", "--json"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(res["token_ids"]) == 5
    assert main(["generate", "--model", str(folder), "--strategy", "ar", "--raw", "--prompt", prompt,
                 "--max-new-tokens", "5"]) == 2
    assert "exceed the model's context" in capsys.readouterr().err
    # the server checks the same way before it queues a request
    from paradec.server import ApiError, prepare
    req = Request(prompt=prompt, chat=False, max_new_tokens=4)
    assert prepare("pcw", req, tiny_engine)[1] > 2 * tiny_engine.context_length
    with pytest.raises(ApiError, match="exceed the model's context"):
        prepare("ar", req, tiny_engine)


def test_max_context_window_limits_every_strategy(tiny_engine, tmp_path, capsys):
    """A window smaller than the model's context (Request.max_context, --max-context): ar refuses a prompt that
    does not fit it, pcw reads the prompt in chunks that fit it; impossible windows are refused with a reason."""
    prompt = text_of(30, 4) + "\n\nWhat is the pass key? The pass key is"
    n = len(tiny_engine.encode(Request(prompt=prompt, chat=False)))
    assert 160 < n < tiny_engine.context_length - 16
    full = Request(prompt=prompt, chat=False, max_new_tokens=6, ignore_eos=True)
    ids_full, steps_full = run(tiny_engine, "pcw", full)
    assert steps_full[0].info["chunks"] == 1 and run(tiny_engine, "ar", full)[0] == ids_full  # fits: pcw == ar
    win = Request(prompt=prompt, chat=False, max_new_tokens=6, ignore_eos=True, max_context=96)
    with pytest.raises(RequestError, match=r"window of 96 tokens \(max_context\)"):
        run(tiny_engine, "ar", win)
    ids, steps = run(tiny_engine, "pcw", win)
    info = steps[0].info
    assert len(ids) == 6 and info["chunks"] >= 2
    assert max(info["chunk_lengths"]) + info["question_tokens"] + 6 <= 96    # every position stays in the window
    for bad, msg in ((-1, "max_context must be between"), (tiny_engine.context_length + 1, "the model's context is"),
                     (6, "larger than max_new_tokens")):
        with pytest.raises(RequestError, match=msg):
            Request(prompt=prompt, chat=False, max_new_tokens=6, max_context=bad).validate(tiny_engine)
    # the CLI passes --max-context to the request
    from paradec.cli import main
    folder = tmp_path / "tiny"
    tiny_engine.model.save_pretrained(folder)
    tiny_engine.tokenizer.save_pretrained(folder)
    assert main(["generate", "--model", str(folder), "--strategy", "ar", "--raw", "--prompt", prompt,
                 "--max-new-tokens", "6", "--max-context", "96"]) == 2
    assert "window of 96 tokens (max_context)" in capsys.readouterr().err
    # so does the server's paradec extension
    from paradec.server import ApiError, prepare
    with pytest.raises(ApiError, match="max_context"):
        prepare("ar", win, tiny_engine)


def test_bench_precheck_reads_the_window(tiny_engine):
    from paradec.bench import BenchItem, too_long
    items = [BenchItem("a", "qa", [text_of(30, 4) + "\n\nWhat is the pass key?"])]
    assert too_long(tiny_engine, items, 6, ["ar"]) == []
    msg = too_long(tiny_engine, items, 6, ["ar"], max_context=96)
    assert len(msg) == 1 and "the window of 96 tokens (max_context)" in msg[0]
    assert too_long(tiny_engine, items, 6, ["ar", "pcw"], max_context=96) == []     # pcw reads it in chunks


# ------------------------------------------------------------------------------------------- APE's options
APE_PROMPT = ("Read the notes below and answer the question at the end.\n\n" + text_of(40, 9)
              + "\n\nWhat is the pass key? The pass key is")


def test_ape_prefix_starts_every_chunk_and_is_kept_once(tiny_engine):
    req = Request(prompt=APE_PROMPT, chat=False, max_new_tokens=4, params={"window": 90})
    lay = get("ape").layout(tiny_engine, req)
    head = lay["shared"]
    assert head > 0 and tiny_engine.decode(lay["ids"][:head]).endswith("\n\n")
    assert "\n\n" not in tiny_engine.decode(lay["ids"][:head - 1])        # the fewest tokens holding the break
    assert len(lay["chunks"]) >= 3 and all(c[:head] == lay["ids"][:head] for c in lay["chunks"])
    cache = encode_chunks(tiny_engine, lay["chunks"], head)
    assert tiny_engine.cache_len(cache) == sum(map(len, lay["chunks"])) - head * (len(lay["chunks"]) - 1)
    # pcw shares nothing by default; a prefix limit shorter than the opening shares nothing either
    assert get("pcw").layout(tiny_engine, req)["shared"] == 0
    short = Request(prompt=APE_PROMPT, chat=False, max_new_tokens=4, params={"window": 90, "prefix": 3})
    assert get("ape").layout(tiny_engine, short)["shared"] == 0


def test_ape_with_its_options_off_is_pcw(tiny_engine):
    req = Request(prompt=APE_PROMPT, chat=False, max_new_tokens=12, ignore_eos=True,
                  params={"window": 90, "prefix": 0, "temperature": 1.0, "scale": 1.0})
    assert run(tiny_engine, "ape", req)[0] == run(tiny_engine, "pcw", Request(**{**req.__dict__,
                                                                                 "params": {"window": 90}}))[0]


def test_ape_weights_follow_the_papers_rule():
    """Inside the context the weights follow softmax(s/T); the context's total mass is S * exp(T * LSE(s/T))
    against exp(LSE(s)) for the prefix and the rest; T = S = 1 is the plain softmax."""
    from paradec.strategies.parallel_context import ape_weights
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 3, 5, 40, generator=g) * 3
    s[..., 35:] = torch.finfo(torch.float32).min               # masked columns stay at zero weight
    lo, hi, T, S = 4, 30, 0.6, 0.3
    w = ape_weights(s, lo, hi, T, S)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 5))
    assert (w[..., 35:] == 0).all()
    ctx = w[..., lo:hi]
    torch.testing.assert_close(ctx / ctx.sum(-1, keepdim=True), torch.softmax(s[..., lo:hi] / T, -1))
    rest = torch.cat([s[..., :lo], s[..., hi:]], -1)
    ratio = ctx.sum(-1) / (w[..., :lo].sum(-1) + w[..., hi:].sum(-1))
    want = S * torch.exp(T * torch.logsumexp(s[..., lo:hi] / T, -1) - torch.logsumexp(rest, -1))
    torch.testing.assert_close(ratio, want, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(ape_weights(s, lo, hi, 1.0, 1.0), torch.softmax(s, -1))


@pytest.mark.parametrize("temperature", [0.0, 1.2])
def test_ape_reads_the_context_under_its_rule_at_every_step(tiny_engine, temperature):
    """The strategy's question pass and every later pass go through APE's attention (greedy and coupled
    sampling): its tokens equal a loop written here from the engine and `context_blocks`, and differ from the
    same layout with T = S = 1 (so the check can fail); the model's attention setting is restored after."""
    from paradec.sampling import UStream, next_tokens
    from paradec.strategies.parallel_context import context_blocks
    params = {"window": 90, "temperature": 0.6, "scale": 0.3}
    req = Request(prompt=APE_PROMPT, chat=False, max_new_tokens=12, ignore_eos=True, temperature=temperature,
                  seed=3, params=params)
    ids, steps = run(tiny_engine, "ape", req)
    assert steps[0].info["chunks"] >= 3 and steps[0].info["shared_prefix"] > 0
    assert tiny_engine.model.config._attn_implementation == "paradec-exact"
    lay = get("ape").layout(tiny_engine, req)
    cache = encode_chunks(tiny_engine, lay["chunks"], lay["shared"])
    past, pos = tiny_engine.cache_len(cache), max(map(len, lay["chunks"]))
    us = UStream(req.seed) if temperature else None
    toks, feed = [], lay["question"]
    while len(toks) < req.max_new_tokens:
        n = len(feed)
        m = tiny_engine.tree_mask(tiny_engine.cache_len(cache), torch.ones(n, n, dtype=torch.bool).tril())
        with context_blocks(tiny_engine, lay["shared"], past, 0.6, 0.3):
            logits = tiny_engine.forward(feed, cache, list(range(pos, pos + n)), m, logits_to_keep=1)[0, -1]
        pos += n
        toks.append(int(next_tokens(logits, req.sampling, us[len(toks)] if us is not None else None)))
        feed = toks[-1:]
    assert ids == toks
    plain = Request(**{**req.__dict__, "params": {"window": 90, "temperature": 1.0, "scale": 1.0}})
    assert ids != run(tiny_engine, "ape", plain)[0]


def test_ape_options_are_validated(tiny_engine):
    for bad in ({"temperature": 0.0}, {"scale": -1.0}, {"prefix": -2}):
        with pytest.raises(RequestError, match=next(iter(bad))):
            run(tiny_engine, "ape", Request(prompt=APE_PROMPT, chat=False, max_new_tokens=2, params=bad))


@pytest.mark.parametrize("shared", [0, 6])
def test_probe_pass_is_the_question_after_each_chunk_alone(tiny_engine, shared):
    """One batched pass gives, for every chunk, the log-probabilities of the question's tokens and the best next
    token's log-probability that the model gives after that chunk alone; the batch cache is rolled back after."""
    from paradec.strategies.parallel_context import encode_batch, lay_end_to_end, probe_pass
    g = torch.Generator().manual_seed(11)
    chunks = [torch.randint(10, 8000, (n,), generator=g).tolist() for n in (31, 44, 44, 12)]
    if shared:
        chunks = [[3, 17, 29, 41, 53, 67] + c for c in chunks]
    question = torch.randint(10, 8000, (9,), generator=g).tolist()
    bcache, mask, nxt = encode_batch(tiny_engine, chunks, shared)
    T = tiny_engine.cache_len(bcache)
    lp, answer = probe_pass(tiny_engine, bcache, mask, nxt, question, 7)
    assert lp.shape == (len(chunks), 6) and answer.shape == (len(chunks),) and tiny_engine.cache_len(bcache) == T
    for i, c in enumerate(chunks):
        logits = torch.log_softmax(tiny_engine.forward(c + question)[0], -1)
        want = logits[len(c):len(c) + 6].gather(-1, torch.tensor(question[1:7]).view(-1, 1)).view(-1)
        torch.testing.assert_close(lp[i], want, atol=2e-3, rtol=1e-3)
        torch.testing.assert_close(answer[i], logits[-1].max(), atol=2e-3, rtol=1e-3)
    # the batch cache still holds the chunks alone: laying it out gives encode_chunks' cache
    a, b = lay_end_to_end(tiny_engine, bcache, chunks, shared), encode_chunks(tiny_engine, chunks, shared)
    for (ka, va), (kb, vb) in zip(tiny_engine.cache_kv(a), tiny_engine.cache_kv(b)):
        torch.testing.assert_close(ka, kb, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(va, vb, atol=1e-5, rtol=1e-4)
    # a subset laid out: the kept rows' own key/values, in order, each after the first without its shared start
    keep = [1, 3]
    sub, ref = lay_end_to_end(tiny_engine, bcache, chunks, shared, keep), encode_chunks(tiny_engine,
                                                                                          [chunks[i] for i in keep],
                                                                                          shared)
    for (ka, va), (kb, vb) in zip(tiny_engine.cache_kv(sub), tiny_engine.cache_kv(ref)):
        torch.testing.assert_close(ka, kb, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(va, vb, atol=1e-5, rtol=1e-4)


def test_chunk_order_rules_and_pick():
    from paradec.strategies.parallel_context import chunk_order, pick_chunks
    lp = torch.tensor([[-1.0, -5.0], [-1.0, -0.5], [-3.0, -5.0], [-1.2, -4.0]])     # means -3, -0.75, -4, -2.6
    answer = torch.tensor([-0.1, -2.0, -0.05, -1.0])
    assert chunk_order(lp, answer, "question") == [1, 3, 0, 2]
    assert chunk_order(lp, answer, "answer") == [2, 0, 3, 1]
    assert chunk_order(lp, answer, "both") == [2, 1, 0, 3]       # answer's best, question's best, answer's 2nd, ...
    with pytest.raises(ValueError):
        chunk_order(lp, answer, "nope")
    assert pick_chunks([2, 1, 0, 3], 2) == [1, 2]                  # the first two, in the prompt's order
    assert pick_chunks([2, 1, 0, 3], 0) == [0, 1, 2, 3] and pick_chunks([2, 1, 0, 3], 9) == [0, 1, 2, 3]


@pytest.mark.parametrize("name,rank", [("pcw", "both"), ("ape", "question"), ("pcw", "answer")])
def test_select_reads_only_the_best_chunks(tiny_engine, name, rank):
    """`select` k: the step's info names the first k chunks of the rule's order (and the order); the answer equals
    a PCW built by hand from those chunks alone (question positions after the longest kept chunk); one more
    forward pass is counted; select >= the number of chunks is plain pcw."""
    from paradec.strategies.parallel_context import (chunk_order, context_blocks, encode_batch, pick_chunks,
                                                     probe_pass, probe_tokens)
    params = {"window": 90, "select": 2, "rank": rank}
    req = Request(prompt=APE_PROMPT, chat=False, max_new_tokens=10, ignore_eos=True, params=params)
    ids, steps = run(tiny_engine, name, req)
    lay = get(name).layout(tiny_engine, req)
    chunks, shared, question = lay["chunks"], lay["shared"], lay["question"]
    assert len(chunks) >= 4 and (shared > 0) == (name == "ape")
    bcache, mask, nxt = encode_batch(tiny_engine, chunks, shared)
    order = chunk_order(*probe_pass(tiny_engine, bcache, mask, nxt, question, len(probe_tokens(tiny_engine, question))),
                        rank)
    keep = pick_chunks(order, 2)
    assert steps[0].info["selected"] == keep and steps[0].info["chunk_order"] == order
    assert steps[0].forward_passes == (2 if shared > 1 else 1) + 1
    # by hand: the kept chunks encoded as their own PCW, greedy answer after them
    kept = [chunks[i] for i in keep]
    cache = encode_chunks(tiny_engine, kept, shared)
    past, pos = tiny_engine.cache_len(cache), max(map(len, kept))
    p = get(name).resolve_params(req, tiny_engine)
    ape = p["temperature"] != 1.0 or p["scale"] != 1.0
    toks, feed = [], question
    while len(toks) < req.max_new_tokens:
        n = len(feed)
        m = tiny_engine.tree_mask(tiny_engine.cache_len(cache), torch.ones(n, n, dtype=torch.bool).tril())
        with (context_blocks(tiny_engine, shared, past, p["temperature"], p["scale"]) if ape else nullcontext()):
            logits = tiny_engine.forward(feed, cache, list(range(pos, pos + n)), m, logits_to_keep=1)[0, -1]
        pos += n
        toks.append(int(logits.argmax()))
        feed = toks[-1:]
    assert ids == toks
    everything = Request(**{**req.__dict__, "params": {"window": 90, "select": len(chunks)}})
    all_ids, all_steps = run(tiny_engine, name, everything)
    assert "selected" not in all_steps[0].info
    assert all_ids == run(tiny_engine, name, Request(**{**req.__dict__, "params": {"window": 90}}))[0]


def test_select_is_validated(tiny_engine):
    for bad in ({"select": -1}, {"rank": "loudest"}):
        with pytest.raises(RequestError, match=next(iter(bad))):
            run(tiny_engine, "pcw", Request(prompt=APE_PROMPT, chat=False, max_new_tokens=2, params=bad))
