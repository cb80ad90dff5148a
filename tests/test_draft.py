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
