"""FocusLLM (`focus`): key re-rotation, the batched candidate pass against one chunk at a time, the gate
touching only the candidate position, the strategy on prompts longer than the context, training (loss falls,
parameters load, resume) and the `train focus` command. All on random tiny Llamas (context 512)."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paradec import focus as F
from paradec.adapters import AdapterError, fingerprint
from paradec.strategies import Request, RequestError, get
from paradec.testing import random_engine
from paradec.training import focus_train as T

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["The ferry crossed the bay.", "An owl called at dusk.", "def parse(line):\n    return line",
         "Fresh bread in the cafe.", "import os\nprint(os.getcwd())", "Snow lay on the hills."]


@pytest.fixture(scope="module")
def eng():
    torch.set_num_threads(1)
    return random_engine(4)


def _perturbed(engine, dynamic=6, std=0.05, seed=1):
    torch.manual_seed(seed)
    ad = F.FocusAdapter.for_model(engine.model, dynamic)
    with torch.no_grad():
        for p in ad.parameters():
            p.normal_(0, std)
    return ad.eval().requires_grad_(False)


def _long_prompt(n_sents, seed=0, question="\n\nWhat is the pass key? The pass key is"):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_sents)) + question


def test_rerotate_is_exact(eng):
    ids = torch.randint(10, 8000, (2, 12))
    plain, shifted = eng.new_cache(), eng.new_cache()
    eng.forward(ids, plain)
    eng.forward(ids, shifted, positions=torch.arange(30, 42).expand(2, -1))
    for layer_a, layer_b in zip(plain.layers, shifted.layers):
        moved = F.rerotate(eng.model, layer_a.keys, torch.full((2, 12), 30))
        assert torch.allclose(moved, layer_b.keys, atol=1e-4)
        assert not torch.allclose(layer_a.keys, layer_b.keys, atol=1e-2)


def test_last_layer_q_and_o_are_left_out(eng):
    ad = F.FocusAdapter.for_model(eng.model)
    last = eng.model.config.num_hidden_layers - 1
    assert f"model.layers.{last}.self_attn.k_proj" in ad.names
    assert f"model.layers.{last}.self_attn.q_proj" not in ad.names
    assert f"model.layers.{last}.self_attn.o_proj" not in ad.names
    assert f"model.layers.0.self_attn.q_proj" in ad.names and len(ad.names) == 4 * (last + 1) - 2


def test_batched_candidates_equal_one_chunk_at_a_time(eng):
    ad = _perturbed(eng)
    g = torch.Generator().manual_seed(3)
    chunks = [torch.randint(10, 8000, (n,), generator=g).tolist() for n in (40, 17, 33, 40)]
    dyn = torch.randint(10, 8000, (6,), generator=g)
    with torch.inference_mode():
        _, cache, mask, nxt = eng.prefill_batch(chunks)
        before = [layer.keys.clone() for layer in cache.layers]
        batched = F.candidate_pass(eng, ad, cache, mask, nxt, dyn.expand(len(chunks), -1))
        # the chunk cache is left as it was
        assert eng.cache_len(cache) == 40
        assert all(torch.equal(b, layer.keys) for b, layer in zip(before, cache.layers))
        for i, ch in enumerate(chunks):
            _, c1, m1, n1 = eng.prefill_batch([ch])
            alone = F.candidate_pass(eng, ad, c1, m1, n1, dyn.expand(1, -1))
            for (kb, vb), (ka, va) in zip(batched, alone):
                assert kb.shape[2] == len(chunks) and ka.shape[2] == 1
                # alone, the candidate sits at position 0; in the batch at position i
                ka_i = F.rerotate(eng.model, ka, torch.full((1, 1), i))
                assert torch.allclose(kb[:, :, i:i + 1], ka_i, atol=1e-4)
                assert torch.allclose(vb[:, :, i:i + 1], va, atol=1e-4)


def test_deltas_act_only_at_the_candidate_position(eng):
    """With the adapter applied, every position but the last computes exactly what the base computes; the
    last one differs (and is the base again when the deltas are zero)."""
    ids = torch.randint(10, 8000, (1, 9))
    base = eng.forward(ids)
    with _perturbed(eng).applied(eng.model):
        got = eng.forward(ids)
    assert torch.equal(got[:, :-1], base[:, :-1])
    assert not torch.allclose(got[:, -1], base[:, -1], atol=1e-3)
    with F.FocusAdapter.for_model(eng.model).applied(eng.model):
        assert torch.allclose(eng.forward(ids), base, atol=1e-5)


def test_unavailable_without_parameters(eng):
    eng.extras.pop("focus", None)
    s = get("focus")
    ok, why = s.available(eng)
    assert not ok and "python -m paradec train focus" in why
    with pytest.raises(FileNotFoundError, match="train focus"):
        list(s.stream(eng, Request(prompt="x", max_new_tokens=2)))


def _run(engine, prompt, **params):
    req = Request(prompt=prompt, chat=False, max_new_tokens=10, ignore_eos=True, params=params)
    steps = list(get("focus").stream(engine, req))
    return [t for s in steps for t in s.token_ids], steps


def test_reads_a_prompt_four_times_the_context(eng):
    eng.extras["focus"] = _perturbed(eng)
    prompt = _long_prompt(400)
    ids = eng.encode(Request(prompt=prompt, chat=False))
    assert len(ids) > 4 * eng.context_length
    with pytest.raises(RequestError, match="context"):
        list(get("ar").stream(eng, Request(prompt=prompt, chat=False, max_new_tokens=4)))
    toks, steps = _run(eng, prompt)
    info = steps[0].info
    assert steps[0].token_ids == [] and steps[0].prefill and steps[0].forward_passes == 1
    assert info["chunks"] >= 5 and max(info["chunk_lengths"]) <= eng.context_length - 6
    assert sum(info["chunk_lengths"]) + info["question_tokens"] == len(ids)
    assert info["dynamic_prompt"] == 6
    assert len(toks) == 10 and steps[1].forward_passes == 2 and all(s.forward_passes == 1 for s in steps[2:])
    # refresh=1 recomputes the candidates after every token: two passes per token, same first token
    toks_r, steps_r = _run(eng, prompt, refresh=1)
    assert toks_r[0] == toks[0] and all(s.forward_passes == 2 for s in steps_r[1:])
    # the memory matters: another memory with the same question gives other candidates
    other, _ = _run(eng, _long_prompt(400, seed=9))
    assert other != toks


@pytest.mark.parametrize("prompt,chat", [("What does `json.dumps` do?", True), ("def add(a, b):\n", False),
                                         (_long_prompt(40, seed=3), False)])
def test_a_prompt_that_fits_is_decoded_exactly_like_ar(eng, prompt, chat):
    eng.extras["focus"] = _perturbed(eng)
    req = Request(prompt=prompt, chat=chat, max_new_tokens=16, ignore_eos=True)
    assert len(eng.encode(req)) + 16 <= eng.context_length
    steps = list(get("focus").stream(eng, req))
    ar = [t for s in get("ar").stream(eng, req) for t in s.token_ids]
    assert [t for s in steps for t in s.token_ids] == ar
    assert steps[0].info["chunks"] == 0 and sum(s.forward_passes for s in steps) == 16


def _candidates_by_hand(eng, ad, memory, lens, question, offset=0):
    """Each chunk alone, its dynamic prompt after it, the candidate's keys re-rotated to position offset + i:
    per chunk, [(k, v)] per layer."""
    cands, start = [], 0
    for i, n in enumerate(lens):
        cache = eng.new_cache()
        eng.forward(memory[start:start + n], cache)
        start += n
        with ad.applied(eng.model):
            eng.forward(question[-ad.dynamic:], cache, positions=list(range(n, n + ad.dynamic)))
        cands.append([(F.rerotate(eng.model, layer.keys[:, :, -1:], torch.full((1, 1), offset + i - (n + ad.dynamic - 1))),
                       layer.values[:, :, -1:]) for layer in cache.layers])
    return cands


def test_first_token_from_candidates_by_hand(eng):
    """The first token equals a hand-built computation: chunks alone, candidates alone, re-rotated to
    0..n-1, then the question on top of them."""
    ad = eng.extras["focus"] = _perturbed(eng, seed=2)
    prompt = _long_prompt(150, seed=4)
    toks, steps = _run(eng, prompt)
    ids = eng.encode(Request(prompt=prompt, chat=False))
    q = steps[0].info["question_tokens"]
    lens = steps[0].info["chunk_lengths"]
    memory, question = ids[:-q], ids[-q:]
    with torch.inference_mode():
        cands = _candidates_by_hand(eng, ad, memory, lens, question)
        kv = [(torch.cat([c[li][0] for c in cands], 2), torch.cat([c[li][1] for c in cands], 2))
              for li in range(len(cands[0]))]
        logits = eng.forward(question, F.local_cache(eng, kv), positions=list(range(len(lens), len(lens) + q)))
    assert int(logits[0, -1].argmax()) == toks[0]


def test_first_token_with_a_sink_by_hand(eng):
    """Parameters trained with a sink: the prompt's opening (here its first token: this tokenizer has no chat
    template and the prompt no blank line) is encoded alone at position 0, the candidates follow at 1..n, the
    question after them; the memory is the rest. The first token equals that computation built by hand, and
    differs from the same parameters without a sink."""
    from paradec.strategies.focus_llm import sink_length
    ad = _perturbed(eng, seed=2)
    ad.meta["sink"] = "chat-head"
    eng.extras["focus"] = ad
    prompt = _long_prompt(150, seed=4)
    toks, steps = _run(eng, prompt)
    info = steps[0].info
    ids = eng.encode(Request(prompt=prompt, chat=False))
    q, lens, s = info["question_tokens"], info["chunk_lengths"], info["sink_tokens"]
    assert s == sink_length(eng, ids[:-q]) == 1 and steps[0].forward_passes == 2
    assert s + sum(lens) + q == len(ids)
    sink, memory, question = ids[:s], ids[s:-q], ids[-q:]
    with torch.inference_mode():
        cands = _candidates_by_hand(eng, ad, memory, lens, question, offset=s)
        scache = eng.new_cache()
        eng.forward(sink, scache)
        kv = [(torch.cat([sl.keys] + [c[li][0] for c in cands], 2), torch.cat([sl.values] + [c[li][1] for c in cands], 2))
              for li, sl in enumerate(scache.layers)]
        logits = eng.forward(question, eng.cache_from_kv(kv), positions=list(range(s + len(lens), s + len(lens) + q)))
    assert int(logits[0, -1].argmax()) == toks[0]
    del ad.meta["sink"]
    plain, psteps = _run(eng, prompt)
    assert psteps[0].info["sink_tokens"] == 0 and psteps[0].forward_passes == 1 and plain != toks
    eng.extras.pop("focus", None)


def test_dynamic_prompt_leaves_out_the_chat_tail():
    tail = [7, 8, 9]
    assert F.dynamic_prompt([1, 2, 3, 4, 5, 7, 8, 9], 3, tail) == [3, 4, 5]     # the template's close is skipped
    assert F.dynamic_prompt([1, 2, 3, 4, 5, 7, 8, 9], 3, []) == [7, 8, 9]
    assert F.dynamic_prompt([1, 2, 3, 4, 5, 6], 3, tail) == [4, 5, 6]           # no tail at the end: plain last 3
    assert F.dynamic_prompt([7, 8, 9], 3, tail) == [7, 8, 9]                     # nothing but the tail: kept


def test_limits_are_checked(eng):
    eng.extras["focus"] = _perturbed(eng)
    prompt = _long_prompt(400)
    with pytest.raises(RequestError, match="max_chunks"):
        _run(eng, prompt, max_chunks=2)
    with pytest.raises(RequestError, match="window"):
        _run(eng, prompt, window=600)
    with pytest.raises(RequestError, match="unknown parameter"):
        _run(eng, prompt, nope=1)


# ------------------------------------------------------------------ training

def _streams(n=21_000, seed=0):
    """A stream the candidates can help with on a random model: a 7-token pattern over and over (a random
    Llama cannot predict it from the local context; candidates that carry the pattern's tokens can)."""
    pattern = [random.Random(seed).randrange(10, 8000) for _ in range(7)]
    out = pattern * (n // 7)
    return {"train": out, "val": out[: n // 3]}


CFG = dict(rank=0, dynamic=6, queries=4, local=12, targets=4, memory=256, max_chunks=4, chunk_sizes="32,64", lr=1e-2,
           warmup=2, eval_batches=2, ckpt_every=5)


@pytest.fixture(scope="module")
def trained(eng, tmp_path_factory):
    out = tmp_path_factory.mktemp("focus") / "focus"
    summary = T.train_focus(eng, T.FocusTrainConfig(steps=20, **CFG), out, log=lambda m: None, progress=False,
                            streams=_streams())
    return summary, out


def test_training_loss_falls_and_parameters_load(eng, trained):
    summary, out = trained
    hist = summary["history"]
    assert [h["step"] for h in hist] == [5, 10, 15, 20]
    assert hist[-1]["loss"] < hist[0]["loss"] * 0.5, hist
    first, last = summary["eval"][0], summary["eval"][-1]
    assert last["cont_focus_loss"] < first["cont_focus_loss"] * 0.5, (first, last)
    assert first["cont_local_only_loss"] == last["cont_local_only_loss"]      # the base model is untouched
    assert summary["eval"][0]["step"] == 0 and summary["eval"][-1]["step"] == 20
    assert (out / "adapter.safetensors").exists() and (out / "README.md").exists()
    assert not (out / ".checkpoint").exists()
    cfg = json.loads((out / "focus_config.json").read_text())
    assert cfg["dynamic"] == 6 and cfg["base"]["hidden_size"] == 64 and cfg["training"]["steps_done"] == 20
    ad = F.FocusAdapter.load(out)
    assert ad.fits(eng.model) and not ad.fits(random_engine(0, hidden=32).model)
    assert any(torch.count_nonzero(p) > 0 for p in ad.parameters())
    eng.extras.pop("focus", None)
    a = _run(eng, _long_prompt(200), adapter=str(out))[0]
    eng.extras["focus"] = F.FocusAdapter.load(out)
    assert _run(eng, _long_prompt(200))[0] == a


def test_low_rank_deltas_train_save_and_load(eng, tmp_path):
    """--rank r: every delta is a rank-r product B A (B zero at the start: the candidates start as the base
    projections); it trains like the full-rank one, its files hold the pairs (a 0.5B model's full-rank deltas would
    be 176 MB, over the repository's 50 MB a file), and a loaded copy decodes exactly as the trained one."""
    ad = F.FocusAdapter.for_model(eng.model, 6, rank=4)
    assert all(torch.count_nonzero(p) == 0 for n, p in ad.named_parameters() if n.startswith("lora_b"))
    ids = torch.randint(10, 8000, (1, 9))
    base = eng.forward(ids)
    with ad.applied(eng.model):                  # zero B: the base model
        assert torch.allclose(eng.forward(ids), base, atol=1e-5)
    full = sum(p.numel() for p in F.FocusAdapter.for_model(eng.model, 6).parameters())
    assert sum(p.numel() for p in ad.parameters()) < full
    out = tmp_path / "focus"
    summary = T.train_focus(eng, T.FocusTrainConfig(steps=20, **{**CFG, "rank": 4}), out, log=lambda m: None,
                            progress=False, streams=_streams())
    first, last = summary["eval"][0], summary["eval"][-1]
    assert last["cont_focus_loss"] < first["cont_focus_loss"] * 0.5, (first, last)
    cfg = json.loads((out / "focus_config.json").read_text())
    assert cfg["rank"] == 4
    loaded = F.FocusAdapter.load(out)
    assert loaded.rank == 4 and loaded.fits(eng.model)
    assert loaded.shapes() == F.FocusAdapter.for_model(eng.model, 6).shapes()
    assert "rank-4 delta" in (out / "README.md").read_text()
    eng.extras.pop("focus", None)
    a = _run(eng, _long_prompt(200), adapter=str(out))[0]
    eng.extras["focus"] = loaded
    try:
        assert _run(eng, _long_prompt(200))[0] == a
    finally:
        eng.extras.pop("focus", None)


def test_trained_parameters_record_the_base_model(eng, trained):
    """The trainer saves through the shared adapter files (paradec/adapters.py): the format tag and the base
    model's fingerprint, so parameters for other weights of the same shape are refused."""
    cfg = json.loads((trained[1] / "focus_config.json").read_text())
    assert cfg["format"] == "paradec-focus" and cfg["base_fingerprint"] == fingerprint(eng.model)
    with pytest.raises(AdapterError, match="trained for .* not for .*train focus"):
        F.adapter_for(random_engine(5), trained[1])


def test_resume_from_checkpoint(eng, tmp_path):
    work = tmp_path / "work"
    streams = _streams(seed=1)
    T.train_focus(eng, T.FocusTrainConfig(steps=2, **{**CFG, "ckpt_every": 1}), tmp_path / "out", work_dir=work,
                  log=lambda m: None, progress=False, streams=streams)
    assert (work / "focus_checkpoint.pt").exists()
    logs = []
    s = T.train_focus(eng, T.FocusTrainConfig(steps=3, **{**CFG, "ckpt_every": 1}), tmp_path / "out", work_dir=work,
                      log=logs.append, progress=False, streams=streams)
    assert any("resumed at step 2" in m for m in logs)
    assert s["steps_done"] == 3 and [h["step"] for h in s["history"]] == [1, 2, 3]


def test_training_sink_opens_the_local_context(eng):
    """The trainer's sink (the chat head on a model with a template): without memory, the targets' logits equal
    the base model reading sink + local context in one sequence; with memory, the loss has a gradient on the
    deltas and the sink changes it."""
    cfg = T.FocusTrainConfig(**CFG)
    rng = random.Random(3)
    b = T.sample_batch([rng.randrange(10, 8000) for _ in range(5000)], cfg, rng)
    sink_ids = [11, 12, 13]
    sink = (sink_ids, F.sink_kv(eng, sink_ids))
    ad = F.FocusAdapter.for_model(eng.model, cfg.dynamic, rank=4).attach(eng.model)
    try:
        with torch.no_grad():
            got = T.batch_logits(eng, ad, b, memory=False, sink=sink)
            m = b["target"].shape[1]
            for q in range(len(b["kinds"])):
                seq = torch.tensor(sink_ids + b["local"][q].tolist() + b["target"][q][:-1].tolist())
                want = eng.model(input_ids=seq[None], logits_to_keep=m).logits[0].float()
                assert torch.allclose(got[q], want, atol=1e-4)
        ad.lora_b[next(iter(ad.lora_b.keys()))].data.normal_(0, 0.05)
        loss, _ = T.batch_loss(eng, ad, b, sink=sink)
        loss.backward()
        assert all(p.grad is not None for p in ad.parameters())
        assert abs(loss.item() - T.batch_loss(eng, ad, b)[0].item()) > 1e-4
    finally:
        ad.detach()


def test_sample_batch_repetition_targets_come_from_the_memory():
    cfg = T.FocusTrainConfig(**{**CFG, "repetition": 1.0})
    stream = list(range(100, 20_000))           # every token unique: positions can be read off the ids
    b = T.sample_batch(stream, cfg, random.Random(0))
    assert set(b["kinds"]) == {"rep"}
    mem = b["chunks"].flatten().tolist()
    for local, target in zip(b["local"].tolist(), b["target"].tolist()):
        i = mem.index(target[0])
        assert mem[i:i + len(target)] == target and mem[i - 2:i] == local[-2:]


@pytest.mark.slow
def test_train_command(tmp_path):
    e = random_engine(5, hidden=32)
    folder = tmp_path / "tiny"
    e.model.save_pretrained(folder)
    e.tokenizer.save_pretrained(folder)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "paradec", "train", "focus", "--model", str(folder), "--steps", "2",
                        "--dynamic", "4", "--queries", "2", "--local", "8", "--targets", "3", "--memory", "128",
                        "--chunk-sizes", "32,64", "--max-docs", "2", "--eval-batches", "1", "--threads", "1",
                        "--no-progress"], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["steps"] == 2 and Path(res["out"]) == folder / "focus"
    assert "python -m paradec train focus" in (folder / "focus" / "README.md").read_text()
    assert T.train_focus_main(["--model", str(folder), "--steps", "0"]) == 2
    assert T.train_focus_main(["--model", str(folder), "--chunk-sizes", "600", "--steps", "1"]) == 2
    assert T.train_focus_main(["--model", str(tmp_path / "missing")]) == 2


def test_candidate_loss_trains_the_source_candidate(eng, tmp_path):
    """With the auxiliary candidate loss, the last layer's q/o deltas are included (they shape the candidate's
    own prediction), the source chunk's candidate learns to predict the first target, and the parameters run."""
    cfg = T.FocusTrainConfig(steps=12, **{**CFG, "repetition": 1.0, "candidate_loss": 1.0, "ckpt_every": 4})
    s = T.train_focus(eng, cfg, tmp_path / "out", log=lambda m: None, progress=False, streams=_streams(seed=2))
    assert all("candidate_loss" in h for h in s["history"])
    assert s["history"][-1]["candidate_loss"] < s["history"][0]["candidate_loss"], s["history"]
    ad = F.FocusAdapter.load(tmp_path / "out")
    assert len(ad.names) == 4 * eng.model.config.num_hidden_layers
    toks, _ = _run(eng, _long_prompt(200), adapter=str(tmp_path / "out"))
    assert len(toks) == 10
    # the auxiliary target is the first target token of each repetition query, read at its source chunk
    b = T.sample_batch(list(range(100, 20_000)), cfg, random.Random(1))
    for q, i in enumerate(b["src"]):
        assert b["target"][q, 0] in b["chunks"][i]


# ------------------------------------------------------------------ retrieval queries (--needle)

def _frame(engine):
    return T.qa_frame(engine)


def test_needle_facts_lie_in_their_source_chunk(eng):
    """Every retrieval question's answer is written in the chunk it names (and, for a listing, next to the key the
    question gives); the chunks keep their length."""
    from paradec.training import needles as N
    tok = eng.tokenizer
    stream = [random.Random(0).randrange(10, 8000) for _ in range(30_000)]
    rng = random.Random(4)
    for kind in ("code", "owned", "listing"):
        for _ in range(3):
            k, chunks, qa = N.needle_memory(tok, stream, 4, 96, 3, rng, kind=kind)
            assert k == kind and len(chunks) == 4 and all(len(c) == 96 for c in chunks) and len(qa) == 3
            for question, answer, i in qa:
                text = tok.decode(chunks[i])
                assert answer in text, (kind, answer, text)
                if kind == "listing":
                    key = question.split('"')[1] if '"' in question else question.split("key ")[1].split(".")[0]
                    assert key in text and text.index(key) < text.index(answer)
                if kind == "owned":
                    owner = next(o for o in (f"the {a} {b}" for a in N.ADJ for b in N.NOUN) if o in question)
                    assert owner in text or N._cap(owner) in text


def test_needle_templates_avoid_the_long_context_suite():
    """The retrieval training data is written here, apart from the benchmark: neither the suite's key name nor its
    question wording occurs in it."""
    from paradec.training import needles as N
    items = [json.loads(x) for x in (ROOT / "evals" / "suites" / "longcontext.jsonl").read_text().splitlines() if x]
    suite = " ".join(it["prompt"] for it in items)
    questions = {it["prompt"].rsplit("\n\n", 1)[1] for it in items}
    for group in (N.NAMES, N.FACT, N.OWNED, N.ASK, N.ASK_OWNED, N.ONLY, N.INTRO, N.LIST_INTRO, N.ASK_KEY):
        for t in group:
            assert "pass key" not in t.lower()
            assert not any(q in t or t.strip() and t.strip() in q for q in questions), t
            for fixed in t.replace("{", "}").split("}")[::2]:        # the template's own words, 4 or more at a time
                assert len(fixed.split()) < 4 or fixed.strip() not in suite, (t, fixed)


def test_needle_batch_layout(eng):
    """Right-padded rows: the input at each prediction position is the token before its target, the dynamic prompt
    is the end of the question (shortest row's length), padded targets are -100; without memory the gathered logits
    equal the base model reading sink + question + answer in one sequence."""
    cfg = T.FocusTrainConfig(**{**CFG, "needle": 1.0, "queries": 3, "dynamic": 6})
    stream = [random.Random(1).randrange(10, 8000) for _ in range(30_000)]
    frame = _frame(eng)
    b = T.draw_batch(stream, cfg, random.Random(2), frame)
    assert set(b["kinds"]) == {"needle"} and b["dyn"].shape == (3, 6)
    for r in range(3):
        tg = [t for t in b["target"][r].tolist() if t != -100]
        at = b["at"][r, :len(tg)].tolist()
        assert tg[-1] == frame["end"] and at == list(range(at[0], at[0] + len(tg)))
        seq = b["inputs"][r].tolist()
        assert seq[at[0] + 1:at[-1] + 1] == tg[:-1]
        q_end = at[0] + 1 - len(frame["tail"])                       # the question, without the chat closing
        assert seq[q_end:at[0] + 1] == list(frame["tail"]) and seq[q_end - 6:q_end] == b["dyn"][r].tolist()
    sink_ids = [11, 12]
    sink = (sink_ids, F.sink_kv(eng, sink_ids))
    ad = F.FocusAdapter.for_model(eng.model, cfg.dynamic, rank=4).attach(eng.model)
    try:
        with torch.no_grad():
            got = T.batch_logits(eng, ad, b, memory=False, sink=sink)
            for r in range(3):
                n = int((b["target"][r] != -100).sum())
                last = int(b["at"][r, n - 1])
                seq = torch.tensor(sink_ids + b["inputs"][r, :last + 1].tolist())
                want = eng.model(input_ids=seq[None], logits_to_keep=n).logits[0].float()
                assert torch.allclose(got[r, :n], want, atol=1e-4)
    finally:
        ad.detach()


def test_needle_training_fits_a_retrieval_batch_and_records_it(eng, tmp_path):
    """The deltas can learn to carry a hidden fact to the question (the loss of one retrieval batch falls when it is
    trained on), and a run with --needle reports retrieval figures in its history, evaluation and card; --init
    starts from saved parameters of the same shape and refuses others."""
    cfg = T.FocusTrainConfig(**{**CFG, "needle": 1.0, "queries": 3})
    stream = [random.Random(3).randrange(10, 8000) for _ in range(30_000)]
    b = T.draw_batch(stream, cfg, random.Random(5), _frame(eng))
    ad = F.FocusAdapter.for_model(eng.model, cfg.dynamic).attach(eng.model)
    try:
        opt = torch.optim.AdamW(ad.parameters(), lr=1e-2)
        losses = []
        for _ in range(12):
            loss, st = T.batch_loss(eng, ad, b)
            losses.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad()
        assert "needle" in st and losses[-1] < losses[0] * 0.7, losses
    finally:
        ad.detach()
    out = tmp_path / "out"
    s = T.train_focus(eng, T.FocusTrainConfig(steps=4, **{**CFG, "needle": 0.5, "ckpt_every": 2, "eval_batches": 3}), out,
                      log=lambda m: None, progress=False, streams=_streams(seed=3))
    assert "needle_focus_exact" in s["eval"][0] and "needle_local_only_acc" in s["eval"][-1]
    card = (out / "README.md").read_text()
    assert "retrieval: focus loss" in card and "50% of the steps retrieval" in card
    iw = s["in_window"]
    assert iw["needle_rows"] == 4 and 0 <= iw["needle_in_window_first"] <= 1 and "fact's source chunk" in card
    assert "needle_focus_first" in s["eval"][-1]
    logs = []
    s2 = T.train_focus(eng, T.FocusTrainConfig(steps=1, **{**CFG, "init": str(out)}), tmp_path / "again",
                       log=logs.append, progress=False, streams=_streams(seed=3))
    assert any("started from" in m for m in logs)
    assert s2["eval"][0]["cont_focus_loss"] != s["eval"][0]["cont_focus_loss"]     # not the zero deltas
    with pytest.raises(ValueError, match="do not fit"):
        T.train_focus(eng, T.FocusTrainConfig(steps=1, **{**CFG, "rank": 2, "init": str(out)}), tmp_path / "bad",
                      log=lambda m: None, progress=False, streams=_streams(seed=3))
