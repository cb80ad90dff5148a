"""`eagle` (paradec/strategies/eagle.py) and its feature-level draft (paradec/feature_draft.py, trained by
paradec/training/eagle_train.py): lossless greedy token for token, sampled in distribution, a draft that learns
from the target's hidden states, saved small and loaded against its target only."""
import copy
import random
import threading

import pytest
import torch

from paradec import feature_draft as FD
from paradec.engine import ModelError
from paradec.sampling import SamplingParams, process
from paradec.strategies import Request, get, load_all
from paradec.strategies.eagle import feature_draft
from paradec.testing import random_engine
from paradec.training import eagle_train as ET

load_all()

PROMPTS = ["def f(x):", "hello there", "import os\n", "class A:", "for i in range(10):", "print(1)"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run(engine, name, prompt, **kw):
    params = kw.pop("params", {})
    req = Request(prompt=prompt, params=params, **{"max_new_tokens": 40, "ignore_eos": True, **kw})
    steps = list(get(name).stream(engine, req))
    return [t for s in steps for t in s.token_ids], steps


def rows_of(engine, prompts, n=60):
    """(prompt + the target's greedy answer, first) rows, as the trainer reads its teacher answers."""
    rows = []
    for p in prompts:
        toks, _ = run(engine, "ar", p, max_new_tokens=n)
        ids = engine.encode(Request(prompt=p))
        rows.append((ids + toks, len(ids) - 1))
    return rows


@pytest.fixture(scope="module")
def target():
    return random_engine(0, layers=4)


@pytest.fixture(scope="module")
def trained(target):
    """A feature draft trained briefly on the target's own greedy answers (features of those rows), and the
    held-out acceptance before and after."""
    torch.manual_seed(0)
    data = ET.features(target, rows_of(target, PROMPTS), None, "test")
    fd = FD.FeatureDraft.from_target(target, sorted(range(target.vocab_size)))
    before = ET.acceptance(fd, data)
    scale = torch.cat([r["feats"].float() for r in data]).std(0).clamp(min=1e-3)
    opt = torch.optim.AdamW(fd.trainable(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    batches = ET.batches([(data, 1.0)], 4, random.Random(0))
    for _ in range(150):
        loss, _parts = ET.losses(fd, *next(batches), scale, 0.2, 0.5, gen)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = ET.acceptance(fd, data)
    return fd.prepare(), before, after


def use(engine, fd):
    engine.extras["eagle"] = fd
    engine.extras.pop("eagle_cost", None)
    return engine


def test_structure_shared_embeddings_and_full_vocabulary_logits(target):
    kept = sorted(set(range(0, target.vocab_size, 3)) | target.eos_ids)
    fd = FD.FeatureDraft.from_target(target, kept)
    cfg = fd.config_dict()
    assert cfg["source_layer"] == 3 and cfg["kept_tokens"] == len(kept) and cfg["format"] == FD.FORMAT
    dec = fd.net.shell.model
    assert dec.embed_tokens is target.model.model.embed_tokens          # shared, not copied
    assert len(dec.layers) == 1
    with torch.no_grad():
        h = fd.hidden(torch.randn(1, 3, 64), torch.tensor([[5, 6, 7]]))
        lg = fd.logits(h[0, -1])
    assert h.shape == (1, 3, 64) and lg.shape[-1] == target.vocab_size
    assert set(torch.isfinite(lg).nonzero().flatten().tolist()) == set(kept)
    assert {p.data_ptr() for p in fd.trainable()}.isdisjoint({p.data_ptr() for p in target.model.parameters()})


def test_capture_keeps_final_hidden_states_of_this_thread_only(target):
    ids = target.encode(Request(prompt="hello there"))
    with FD.capture(target) as got:
        logits = target.forward(ids, target.new_cache())
        other = threading.Thread(target=lambda: target.forward(ids[:2], target.new_cache()))
        other.start()
        other.join()
    assert len(got) == 1 and got[0].shape[1] == len(ids)       # the other thread's pass was not kept
    head = target.model.get_output_embeddings()
    with torch.no_grad():
        assert torch.allclose(head(got[0]).float(), logits, atol=1e-4)   # what the head read
    target.forward(ids, target.new_cache())
    assert len(got) == 1                                           # the hook is gone after the block


def test_training_raises_acceptance(trained):
    _fd, before, after = trained
    assert before["a1"] < 0.1
    assert after["a1"] > 0.3 and after["a2"] > 0.2 and after["a1"] > before["a1"] + 0.25


@pytest.mark.parametrize("adaptive,k", [(False, 3), (False, 6), (True, 4)])
def test_greedy_equals_ar_token_for_token(target, trained, adaptive, k):
    use(target, trained[0])
    accepted = 0
    for p in PROMPTS[:3] + ["Something the draft never saw: 42 * 17 ="]:
        ref, _ = run(target, "ar", p)
        toks, steps = run(target, "eagle", p, params={"adaptive": adaptive, "k": k})
        assert toks == ref, p
        assert steps[0].drafted == 0 and steps[0].prefill          # the first step has no features to read
        for s in steps:
            assert s.forward_passes == 1 and s.draft_passes == s.drafted == s.info["k"]
            assert 0 <= s.accepted <= s.drafted
        if not adaptive:
            assert all(s.drafted in (k, min(k, 39 - sum(len(x.token_ids) for x in steps[:i])))
                       for i, s in enumerate(steps[1:], 1))
        accepted += sum(s.accepted for s in steps)
    if not adaptive:
        assert accepted > 20                 # the trained draft's proposals were kept, not only corrections


def test_an_untrained_draft_is_still_lossless(target):
    use(target, FD.FeatureDraft.from_target(target, sorted(range(0, target.vocab_size, 2))).prepare())
    for p in PROMPTS[:2]:
        ref, _ = run(target, "ar", p)
        toks, steps = run(target, "eagle", p, params={"adaptive": False, "k": 4})
        assert toks == ref
        assert sum(s.drafted for s in steps) > 40


def test_budget_and_eos(target, trained):
    use(target, trained[0])
    toks, steps = run(target, "eagle", PROMPTS[0], max_new_tokens=7, params={"adaptive": False, "k": 5})
    assert len(toks) == 7 and steps[-1].finished
    ref, _ = run(target, "ar", PROMPTS[0])
    cut = next(i for i in range(8, 30) if ref[i] not in ref[:i])
    eng = copy.copy(target)
    eng.eos_ids = {ref[cut]}
    got, st = run(eng, "eagle", PROMPTS[0], ignore_eos=False, params={"adaptive": False, "k": 5})
    assert got == ref[:cut] and st[-1].finish_reason == "eos"


def test_sampling_is_lossless_in_distribution(target, trained):
    """Over 400 seeds the first two tokens follow the target's exact joint distribution (T 1.0, top-k 5), with a
    draft made deliberately over-confident (its head rows x 6): accepting its proposals blindly would be far off."""
    fd = FD.FeatureDraft.from_target(target, sorted(range(target.vocab_size)))
    fd.net.load_state_dict(trained[0].net.state_dict())
    fd.net.shell.lm_head.weight.mul_(6.0)
    use(target, fd.prepare())
    sp = SamplingParams(1.0, top_k=5)
    prompt = "def f(x):"
    ids = target.encode(Request(prompt=prompt))
    with FD.capture(target) as got:
        p1 = process(target.forward(ids)[0, -1], sp)
    support = p1.nonzero().flatten().tolist()
    joint, blind = {}, {}
    for a in support:
        with FD.capture(target) as got:
            p2 = process(target.forward(ids + [a])[0, -1], sp)
        with torch.no_grad():
            q2 = process(fd.logits(fd.hidden(got[-1][:, :-1], torch.tensor([ids[1:] + [a]]))[0, -1]), sp)
        for b in set(p2.nonzero().flatten().tolist()) | set(q2.nonzero().flatten().tolist()):
            joint[(a, b)] = float(p1[a] * p2[b])
            blind[(a, b)] = float(p1[a] * q2[b])
    assert 0.5 * sum(abs(joint[c] - blind[c]) for c in joint) > 0.3       # the draft alone is far off
    n, counts, accepted, drafted = 400, {}, 0, 0
    for seed in range(n):
        toks, steps = run(target, "eagle", prompt, max_new_tokens=3, temperature=1.0, top_k=5, seed=seed,
                          params={"adaptive": False, "k": 2})
        counts[tuple(toks[:2])] = counts.get(tuple(toks[:2]), 0) + 1
        accepted += sum(s.accepted for s in steps)
        drafted += sum(s.drafted for s in steps)
    assert 0.1 < accepted / drafted < 0.95            # both acceptances and rejections happened
    assert set(counts) <= {c for c, pr in joint.items() if pr > 0}
    tv = 0.5 * sum(abs(counts.get(c, 0) / n - pr) for c, pr in joint.items())
    assert tv < 0.15, tv


def test_save_load_round_trip_and_wrong_target(target, trained, tmp_path):
    fd = trained[0]
    fd.save(tmp_path / "d", {"note": "test"})
    assert FD.is_feature_draft_dir(tmp_path / "d")
    loaded = FD.load(tmp_path / "d", target)
    x, t = torch.randn(1, 5, 64), torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        a = fd.kept_logits(fd.hidden(x, t))
        b = loaded.kept_logits(loaded.hidden(x, t))
    assert torch.allclose(a, b, atol=0.05 * float(a.abs().max()))      # saved in bfloat16
    assert loaded.meta["note"] == "test" and loaded.kept_ids.tolist() == fd.kept_ids.tolist()
    other = random_engine(3, hidden=32)
    with pytest.raises(ValueError, match="made for random-0"):
        FD.load(tmp_path / "d", other)
    assert not FD.is_feature_draft_dir(tmp_path)


def test_unavailable_without_a_draft_says_how_to_train_one():
    e = random_engine(5)
    ok, why = get("eagle").available(e)
    assert not ok and "python -m paradec train eagle" in why
    with pytest.raises(ModelError, match="train eagle"):
        feature_draft(e)


def test_trainer_refuses_impossible_arguments(capsys):
    for bad in (["--ttt-share", "1.5"], ["--corpus-share", "1"], ["--steps", "0"]):
        with pytest.raises(SystemExit):
            ET.main(bad)
        assert "must" in capsys.readouterr().err


def test_shipped_draft_on_the_default_model_is_lossless_and_accepted(default_engine):
    """The feature draft shipped for the default model loads against it, and greedy eagle is ar token for token
    with proposals really accepted (held-out first-proposal acceptance 0.58 on its card)."""
    e = default_engine
    ok, why = get("eagle").available(e)
    assert ok, why
    assert feature_draft(e).meta["base_model"] == e.name
    accepted = 0
    for p in ("Write a Python function that reverses a string.", "What is a hash map? Answer in two sentences."):
        ref, _ = run(e, "ar", p, max_new_tokens=32, chat=True)
        toks, steps = run(e, "eagle", p, max_new_tokens=32, chat=True, params={"adaptive": False, "k": 3})
        assert toks == ref, p
        accepted += sum(s.accepted for s in steps)
    assert accepted >= 8


@pytest.mark.slow
def test_train_eagle_end_to_end_on_a_small_model_and_resume(model_dir, tmp_path):
    """`train eagle --model M` on the random tiny model: teacher answers, features, steps, a loadable draft with a
    card; a second run with more steps resumes from the checkpoint (features read from the cache)."""
    import json

    from paradec.engine import Engine
    argv = ["--model", str(model_dir), "--vocab", "400", "--steps", "3", "--batch", "2", "--prompts", "9",
            "--eval-prompts", "9", "--gen-tokens", "8", "--gen-batch", "9", "--eval-every", "3", "--ckpt-every", "3",
            "--fill-chars", "20000", "--teacher-dtype", "float32", "--out", str(tmp_path / "d"),
            "--work", str(tmp_path / "w"), "--teacher-cache", str(tmp_path / "w")]
    assert ET.main(argv) == 0
    cfg = json.loads((tmp_path / "d" / "draft_config.json").read_text())
    assert cfg["steps"] == 3 and cfg["complete"] and [c["step"] for c in cfg["curve"]] == [0, 3]
    assert 0.0 <= cfg["curve"][-1]["a1"] <= 1.0 and cfg["kept_tokens"] == 400
    assert "a1 (first proposal" in (tmp_path / "d" / "README.md").read_text()
    assert (tmp_path / "w" / "features_answers_float32.pt").exists()
    fd = FD.load(tmp_path / "d", Engine.load(str(model_dir), dtype="float32"))
    assert len(fd.kept_ids) == 400
    argv[argv.index("--steps") + 1] = "5"
    assert ET.main(argv) == 0
    cfg = json.loads((tmp_path / "d" / "draft_config.json").read_text())
    assert cfg["steps"] == 5 and [c["step"] for c in cfg["curve"]] == [0, 3, 5]
