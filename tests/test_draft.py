"""Distilled drafts (paradec/draft.py): built from the target's own layers with a trimmed vocabulary, saved
small, loaded against their target only, and lossless in `sps` - greedy token for token, sampled in
distribution even for tokens the draft can never propose."""
import json

import pytest
import torch

from paradec import draft as D
from paradec.engine import ModelError
from paradec.sampling import SamplingParams, process
from paradec.strategies import Request, get, load_all
from paradec.testing import random_engine

load_all()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    return random_engine(0, layers=4)


def make_draft(target, kept, layers=(0, -1), inter=64):
    calib = [torch.tensor([target.encode(Request(prompt=p))]) for p in ("hello there", "def f(x):\n    return x")]
    return D.Draft.from_target(target, list(layers), inter, sorted(kept), calib)


def run(engine, name, prompt, **kw):
    req = Request(prompt=prompt, **{"max_new_tokens": 30, "ignore_eos": True, **kw})
    steps = list(get(name).stream(engine, req))
    return [t for s in steps for t in s.token_ids], steps


def use(engine, draft_engine):
    engine.extras.pop("draft_checks", None)
    engine.extras["draft"] = draft_engine
    return engine


def test_structure_pruning_and_full_vocabulary_logits(target):
    kept = set(range(0, 8192, 3)) | target.eos_ids
    d = make_draft(target, kept)
    cfg = d.config_dict()
    assert cfg["layers"] == 2 and cfg["source_layers"] == [0, 3] and cfg["intermediate_size"] == 64
    mlp = d.model.model.layers[0].mlp
    assert mlp.gate_proj.out_features == 64 and mlp.down_proj.in_features == 64
    assert d.model.model.embed_tokens is target.model.model.embed_tokens       # shared, not copied
    de = d.engine()
    lg = de.forward([5, 6, 7], de.new_cache(), logits_to_keep=1)[0, -1]
    assert lg.shape[-1] == target.vocab_size
    finite = torch.isfinite(lg).nonzero().flatten().tolist()
    assert set(finite) == set(d.kept_ids.tolist())
    q = process(lg, SamplingParams(1.0))
    assert abs(float(q.sum()) - 1.0) < 1e-5 and float(q[~torch.isfinite(lg)].sum()) == 0.0
    assert int(d.to_kept(torch.tensor([3]))) == sorted(kept).index(3)
    assert 4 not in kept and int(d.to_kept(torch.tensor([4]))) == -1


def test_save_is_small_and_load_checks_the_target(target, tmp_path):
    d = make_draft(target, set(range(500)) | target.eos_ids)
    d.save(tmp_path / "dr", {"steps": 0})
    files = {p.name for p in (tmp_path / "dr").iterdir()}
    assert files == {D.WEIGHTS, D.CONFIG}
    size = (tmp_path / "dr" / D.WEIGHTS).stat().st_size
    n_params = sum(p.numel() for p in d.trainable())
    assert size < 2 * n_params + 4 * len(d.kept_ids) + 20_000       # bf16 layers + ids: no embedding, no head
    again = D.load(tmp_path / "dr", target)
    ids = torch.tensor([[5, 9, 11, 40]])
    torch.testing.assert_close(again.hidden(ids), d.hidden(ids), rtol=0.05, atol=0.05)   # bf16 storage
    other = random_engine(1, layers=4, hidden=96)
    with pytest.raises(ValueError, match="made for random-0"):
        D.load(tmp_path / "dr", other)
    cfg = json.loads((tmp_path / "dr" / D.CONFIG).read_text())
    assert cfg["base_model"] == "random-0" and cfg["steps"] == 0
    from paradec.strategies.speculative import _load_draft
    other.name = "random-0"                       # same name, other shape: still refused, as a ModelError
    with pytest.raises(ModelError, match="hidden_size"):
        _load_draft(other, tmp_path / "dr")


@pytest.mark.parametrize("prompt", ["The quick brown fox", "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"])
def test_greedy_sps_with_a_trimmed_draft_equals_ar(target, prompt):
    ar, _ = run(target, "ar", prompt)
    kept = set(ar[::2]) | set(range(200)) | target.eos_ids     # some of ar's tokens can never be proposed
    assert set(ar) - kept
    use(target, make_draft(target, kept).engine())
    got, steps = run(target, "sps", prompt)
    assert got == ar
    assert sum(s.draft_passes for s in steps) > 0


def test_sampled_sps_with_a_trimmed_draft_keeps_the_target_distribution(target):
    """Over 300 seeds the first sps token follows the target's processed distribution (T 1, top-k 5), including
    the two support tokens the trimmed draft can never propose; a mis-normalised q would fail this."""
    sp = SamplingParams(1.0, top_k=5)
    prompt = "The quick brown fox"
    ids = target.encode(Request(prompt=prompt))
    p1 = process(target.forward(ids)[0, -1], sp)
    support = p1.nonzero().flatten().tolist()
    banned = set(sorted(support, key=lambda t: -float(p1[t]))[:2])     # the two likeliest: the draft lacks them
    kept = (set(range(8192)) - banned) | target.eos_ids
    use(target, make_draft(target, kept).engine())
    n = 300
    counts = torch.zeros(target.vocab_size)
    for seed in range(n):
        toks, _ = run(target, "sps", prompt, max_new_tokens=3, temperature=1.0, top_k=5, seed=seed)
        counts[toks[0]] += 1
    assert set(counts.nonzero().flatten().tolist()) <= set(support)
    assert all(counts[t] > 0 for t in banned)
    expected = p1[support].cpu() * n
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, (chi2, counts[support], expected)          # chi-square df 4, p = 0.001


def test_transformers_assisted_generation_accepts_the_same_trimmed_draft(target):
    prompt = "The quick brown fox"
    ar, _ = run(target, "ar", prompt)
    use(target, make_draft(target, set(range(3000)) | target.eos_ids).engine())
    got, _ = run(target, "hf-assisted", prompt)
    assert got == ar


def test_training_prompts_are_disjoint_from_the_benchmark_suites():
    from paradec.training import prompts as P
    tr = P.training_prompts(90, 0, "train")
    va = P.training_prompts(18, 0, "heldout")
    assert len(tr) == 90 and len(va) == 18
    assert {p["kind"] for p in tr} == set(P.KINDS)
    assert P.overlap_with_suites(tr + va) == []
    assert not {p["messages"][0]["content"] for p in tr} & {p["messages"][0]["content"] for p in va}
    # the check itself finds a benchmark prompt hidden inside a training prompt
    import json
    bench = json.loads(P.SUITES.joinpath("code.jsonl").read_text().splitlines()[0])["prompt"]
    assert P.overlap_with_suites([{"messages": [{"role": "user", "content": "Please: " + bench}]}])


def test_training_prompts_go_on_past_a_used_up_kind():
    """A kind whose word lists run out (conversation: about 60 prompts) drops out of the turn instead of ending
    the set, and a larger set still starts with a smaller one's prompts (cached answers stay valid)."""
    from paradec.training import prompts as P
    small = P.training_prompts(540, 0, "train")
    big = P.training_prompts(800, 0, "train")
    assert len(big) == 800 and big[:540] == small
    assert len({p["messages"][0]["content"] for p in big}) == 800
    counts = {k: sum(p["kind"] == k for p in big) for k in P.KINDS}
    assert counts["conversation"] < 70 and min(counts.values()) >= 50 and max(counts.values()) >= 90


@pytest.mark.slow
def test_train_draft_end_to_end_on_a_small_model_and_resume(model_dir, tmp_path):
    """`train draft --model M` on the random tiny model: teacher answers, vocabulary, steps, a loadable draft with
    a card; a second run with more steps resumes from the checkpoint instead of starting again."""
    from paradec.engine import Engine
    from paradec.training import draft_distill as DD
    argv = ["--model", str(model_dir), "--layers", "0,-1", "--intermediate", "64", "--vocab", "400", "--steps", "3",
            "--batch", "2", "--prompts", "9", "--eval-prompts", "9", "--gen-tokens", "8", "--gen-batch", "9",
            "--eval-every", "3", "--ckpt-every", "3", "--calib-rows", "2", "--fill-chars", "20000", "--out", str(tmp_path / "d"),
            "--work", str(tmp_path / "w")]
    assert DD.main(argv) == 0
    cfg = json.loads((tmp_path / "d" / D.CONFIG).read_text())
    assert cfg["steps"] == 3 and cfg["complete"] and [c["step"] for c in cfg["curve"]] == [0, 3]
    assert 0.0 <= cfg["curve"][-1]["greedy"] <= 1.0 and cfg["kept_tokens"] == 400   # filled from the corpus
    assert "Held-out per-token acceptance" in (tmp_path / "d" / "README.md").read_text()
    target = Engine.load(str(model_dir), dtype="float32")
    d = D.load(tmp_path / "d", target)
    assert len(d.kept_ids) == cfg["kept_tokens"]
    argv[argv.index("--steps") + 1] = "5"
    assert DD.main(argv) == 0
    cfg = json.loads((tmp_path / "d" / D.CONFIG).read_text())
    assert cfg["steps"] == 5 and [c["step"] for c in cfg["curve"]] == [0, 3, 5]


def test_soft_labels_are_the_targets_top_k_at_the_right_positions_and_cached(target, tmp_path):
    """Soft labels from right-padded batches equal each row's own pass: the top-K of the target's full-vocabulary
    softmax at positions first..len-2; a second call reads the cache instead of running the model."""
    from paradec.training import draft_distill as DD
    g = torch.Generator().manual_seed(3)
    seqs = [(torch.randint(0, target.vocab_size, (n,), generator=g).tolist(), f) for n, f in ((9, 0), (5, 2), (12, 7))]
    rows = DD.soft_labels(target, seqs, 4, tmp_path / "soft.pt", "test", batch=3)
    for (ids, first), r in zip(seqs, rows):
        with torch.no_grad():
            lp = torch.log_softmax(target.model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
        v, t = lp[first:len(ids) - 1].topk(4, -1)
        assert r["ids"] == ids and r["first"] == first and r["top_ids"].shape == (len(ids) - 1 - first, 4)
        assert torch.equal(r["top_ids"].long(), t)
        assert torch.allclose(r["top_p"].float(), v.exp(), atol=2e-3)
    calls = []
    hook = target.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        again = DD.soft_labels(target, seqs[:2], 4, tmp_path / "soft.pt", "test")
    finally:
        hook.remove()
    assert not calls and all(torch.equal(a["top_ids"], b["top_ids"]) for a, b in zip(again, rows))


def test_soft_loss_renormalises_over_the_kept_vocabulary_and_trains(target):
    """The soft loss is the cross-entropy against the target's top-K restricted to the draft's vocabulary and
    renormalised; with one-hot targets it is the hard cross-entropy; positions with nothing kept are skipped;
    a few optimiser steps lower it."""
    from paradec.training import draft_distill as DD
    kept = list(range(0, 300))
    d = make_draft(target, kept)
    ids = torch.tensor([[5, 17, 230, 44, 9, 301]])
    bi, bj = torch.zeros(3, dtype=torch.long), torch.tensor([1, 2, 3])
    top_ids = torch.tensor([[7, 400, 12], [50, 60, 70], [500, 501, 502]])     # row 3: nothing kept -> skipped
    top_p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0], [0.6, 0.3, 0.1]])
    with torch.no_grad():
        logq = torch.log_softmax(d.kept_logits(d.hidden(ids)[0, [1, 2]]).float(), -1)
        want = -(0.5 / 0.7 * logq[0, 7] + 0.2 / 0.7 * logq[0, 12] + logq[1, 50]) / 2
        got = DD.soft_loss(d, ids, bi, bj, top_ids, top_p)
        hard = DD.step_loss(d, ids[:, :3], torch.tensor([[-100, -100, 50]]))
        one = DD.soft_loss(d, ids, bi[:1], torch.tensor([2]), top_ids[1:2], top_p[1:2])
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(one, hard, atol=1e-5)
    opt = torch.optim.AdamW(d.trainable(), lr=1e-2)
    first = float(DD.soft_loss(d, ids, bi, bj, top_ids, top_p).detach())
    for _ in range(5):
        opt.zero_grad()
        DD.soft_loss(d, ids, bi, bj, top_ids, top_p).backward()
        opt.step()
    assert float(DD.soft_loss(d, ids, bi, bj, top_ids, top_p).detach()) < first - 0.1


@pytest.mark.slow
def test_train_draft_continues_from_init_with_its_vocabulary_on_answers_of_another_dtype(model_dir, tmp_path):
    """`--init D` starts from D's weights, shape and vocabulary (not a new one chosen from more answers);
    `--answer-dtype bfloat16 --sampled-prompts K` makes the target answer in bf16 (cached apart from float32
    answers) and gives the prompts after the first K a greedy answer only."""
    from safetensors.torch import load_file
    from paradec.training import draft_distill as DD
    base = ["--model", str(model_dir), "--batch", "2", "--eval-prompts", "9", "--gen-tokens", "8", "--gen-batch", "9",
            "--calib-rows", "2", "--fill-chars", "20000", "--work", str(tmp_path / "w")]
    assert DD.main(base + ["--intermediate", "64", "--vocab", "400", "--steps", "3", "--eval-every", "3",
                           "--prompts", "9", "--out", str(tmp_path / "d1")]) == 0
    first = load_file(str(tmp_path / "d1" / D.WEIGHTS))
    assert DD.main(base + ["--vocab", "300", "--steps", "2", "--eval-every", "2", "--lr", "0", "--prompts", "12",
                           "--sampled-prompts", "9", "--answer-dtype", "bfloat16", "--init", str(tmp_path / "d1"),
                           "--out", str(tmp_path / "d2"), "--work", str(tmp_path / "w2"),
                           "--teacher-cache", str(tmp_path / "w")]) == 0
    second = load_file(str(tmp_path / "d2" / D.WEIGHTS))
    assert second.keys() == first.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)          # lr 0: the init's weights, unchanged
    cfg = json.loads((tmp_path / "d2" / D.CONFIG).read_text())
    assert cfg["kept_tokens"] == 400 and cfg["intermediate_size"] == 64 and cfg["init"]["steps"] == 3
    assert "the first 9 with one sampled" in cfg["data"] and "the other 3 the greedy one only" in cfg["data"]
    assert "(bfloat16)" in cfg["data"]
    assert "continuing a draft of 3 steps" in (tmp_path / "d2" / "README.md").read_text()
    assert torch.load(tmp_path / "w" / "teacher_bfloat16.pt")["key"]["dtype"] == "bfloat16"
    assert "dtype" in torch.load(tmp_path / "w" / "teacher.pt")["key"]     # the float32 answers, kept apart


def test_train_draft_on_soft_targets_with_corpus_windows(model_dir, tmp_path):
    """`train draft --soft-top K --corpus-windows N`: the target labels its answers and N corpus windows with its
    top-K probabilities (cached in the work folder), the draft trains on them, and the card says so."""
    from paradec.training import draft_distill as DD
    argv = ["--model", str(model_dir), "--intermediate", "64", "--vocab", "400", "--steps", "2", "--batch", "2",
            "--prompts", "9", "--eval-prompts", "9", "--gen-tokens", "8", "--gen-batch", "9", "--eval-every", "2",
            "--calib-rows", "2", "--fill-chars", "20000", "--soft-top", "4", "--corpus-windows", "3",
            "--max-len", "64", "--teacher-dtype", "float32", "--out", str(tmp_path / "d"),
            "--work", str(tmp_path / "w")]
    assert DD.main(argv) == 0
    cfg = json.loads((tmp_path / "d" / D.CONFIG).read_text())
    assert cfg["steps"] == 2 and cfg["complete"] and "top-4 next-token probabilities" in cfg["data"]
    assert "3 windows of up to 64 tokens" in cfg["data"]
    corpus = torch.load(tmp_path / "w" / "soft_corpus_float32.pt")
    assert len(corpus["rows"]) == 3 and all(r["top_ids"].shape[1] == 4 for r in corpus["rows"].values())
