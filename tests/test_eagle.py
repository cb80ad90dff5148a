"""`eagle` (paradec/strategies/eagle.py) and its feature-level draft (paradec/feature_draft.py, trained by
paradec/training/eagle_train.py): lossless greedy token for token, sampled in distribution, a draft that learns
from the target's hidden states, saved small and loaded against its target only."""
import copy
import random
import threading

import pytest
import torch

from paradec import feature_draft as FD
from paradec.engine import Engine, ModelError
from paradec.sampling import SamplingParams, process
from paradec.strategies import Request, get, load_all
from paradec.strategies import eagle as E
from paradec.strategies.eagle import feature_draft
from paradec.testing import random_engine
from paradec.training import eagle_train as ET

load_all()

CHAIN5 = {"tree": False, "adaptive": False, "k": 5}
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


def test_deeper_levels_read_predictions_of_predictions(target, trained):
    """levels 3 with every input swapped: the third run reads what the second predicted one position back, which
    read what the first predicted: its cross-entropy is the one computed by hand on that chain, and the loss is the
    mean of the three runs'."""
    fd = trained[0]
    data = ET.features(target, rows_of(target, PROMPTS[:2]), None, "test")
    fin, toks, ftgt, mask = ET.make_batch(data)
    scale = torch.ones(fin.shape[-1])
    with torch.no_grad():
        loss, parts = ET.losses(fd, fin, toks, ftgt, mask, scale, 0.0, 1.0, torch.Generator().manual_seed(0), 3)
        p = torch.softmax(fd.kept_logits(ftgt[mask]).float(), -1)
        inp, ces = fin, []
        for _ in range(3):
            h = fd.hidden(inp, toks)
            ces.append(float(-(p * torch.log_softmax(fd.kept_logits(h[mask]).float(), -1)).sum(-1).mean()))
            inp = ET.shifted(fin, h)
    assert [parts[f"ce{i}"] for i in (1, 2, 3)] == pytest.approx(ces, rel=1e-4)
    assert float(loss) == pytest.approx(sum(ces) / 3, rel=1e-4)
    assert ces[2] != pytest.approx(ces[1], rel=1e-3)       # the third run did read something new
    _l, two = ET.losses(fd, fin, toks, ftgt, mask, scale, 0.0, 1.0, None, 2)
    assert set(two) == {"ce1", "ce2"}
    acc = ET.acceptance(fd, data)
    assert 0 <= acc["a3"] <= 1 and acc["positions"] > 0


def use(engine, fd):
    engine.extras["eagle"] = fd
    engine.extras.pop("eagle_cost", None)
    return engine


def test_a_prepared_drafts_head_runs_the_few_row_kernel_of_its_other_linears(target):
    """The trimmed head is a frozen nn.Linear, so `prepare` gives it the kernel `kernels.apply` picks for the
    target's dtype (native or streamed for float32 on a CPU), with F.linear's numbers; it is not in the saved state."""
    from paradec import kernels, native
    kept = sorted(set(range(0, target.vocab_size, 2)) | target.eos_ids)
    fd = FD.FeatureDraft.from_target(target, kept)
    head = fd.net.shell.lm_head
    assert not head.proj.weight.requires_grad and head.weight is head.proj.weight
    h = torch.randn(3, target.model.config.hidden_size)
    ref = torch.nn.functional.linear(h, head.weight)
    fd.prepare()
    tag = kernels._NATIVE_TAG if native.available() else kernels._TAG
    if target.device.type == "cpu" and target.dtype == torch.float32:
        assert getattr(head.proj, tag, False)
    with torch.inference_mode():
        got = fd.kept_logits(h)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert not any("lm_head" in k for k in fd.state())


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


def test_acceptance_counts_the_targets_full_vocabulary(target, trained):
    """A draft that keeps one token, never the target's argmax on these rows, proposes it everywhere: every
    proposal is a miss (a measure over the kept vocabulary alone would call each one a hit), and with the full
    vocabulary back the same layers score what they did."""
    fd = trained[0]
    data = ET.features(target, rows_of(target, PROMPTS[:3]), None, "test")
    head = target.model.get_output_embeddings()
    with torch.no_grad():
        seen = set(torch.cat([head(r["feats"].float()).argmax(-1) for r in data]).tolist())
    never = next(t for t in range(target.vocab_size) if t not in seen)
    one = FD.FeatureDraft.from_state(target, fd.config_dict(), fd.state(), [never])
    acc = ET.acceptance(one, data)
    assert acc["positions"] > 0 and acc["a1"] == acc["a2"] == acc["a3"] == 0.0
    full = FD.FeatureDraft.from_state(target, fd.config_dict(), fd.state(), fd.kept_ids.tolist())
    assert ET.acceptance(full, data) == ET.acceptance(fd, data)


@pytest.mark.parametrize("adaptive,k", [(False, 3), (False, 6), (True, 4)])
def test_greedy_equals_ar_token_for_token(target, trained, adaptive, k):
    use(target, trained[0])
    accepted = 0
    for p in PROMPTS[:3] + ["Something the draft never saw: 42 * 17 ="]:
        ref, _ = run(target, "ar", p)
        toks, steps = run(target, "eagle", p, params={"tree": False, "adaptive": adaptive, "k": k})
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
        toks, steps = run(target, "eagle", p, params={"tree": False, "adaptive": False, "k": 4})
        assert toks == ref
        assert sum(s.drafted for s in steps) > 40


def test_budget_and_eos(target, trained):
    use(target, trained[0])
    toks, steps = run(target, "eagle", PROMPTS[0], max_new_tokens=7, params=CHAIN5)
    assert len(toks) == 7 and steps[-1].finished
    ref, _ = run(target, "ar", PROMPTS[0])
    cut = next(i for i in range(8, 30) if ref[i] not in ref[:i])
    eng = copy.copy(target)
    eng.eos_ids = {ref[cut]}
    got, st = run(eng, "eagle", PROMPTS[0], ignore_eos=False, params=CHAIN5)
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
                          params={"tree": False, "adaptive": False, "k": 2})
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
    for bad in (["--ttt-share", "1.5"], ["--corpus-share", "1"], ["--steps", "0"], ["--levels", "0"]):
        with pytest.raises(SystemExit):
            ET.main(bad)
        assert "must" in capsys.readouterr().err


@pytest.mark.parametrize("params", [{"tree": False, "adaptive": False, "k": 3}, {"adaptive": False}])
def test_shipped_draft_on_the_default_model_is_lossless_and_accepted(default_engine, params):
    """The feature draft shipped for the default model loads against it, and greedy eagle (a chain of 3, and the
    tree with its measured-cost choice of nodes, drafting at every step: whether the adaptive rule pauses drafting
    depends on this CPU's pass costs) is ar token for token with proposals really accepted (held-out
    first-proposal acceptance 0.64 on its card)."""
    e = default_engine
    ok, why = get("eagle").available(e)
    assert ok, why
    assert feature_draft(e).meta["base_model"] == e.name
    accepted = 0
    for p in ("Write a Python function that reverses a string.", "What is a hash map? Answer in two sentences."):
        ref, _ = run(e, "ar", p, max_new_tokens=32, chat=True)
        toks, steps = run(e, "eagle", p, max_new_tokens=32, chat=True, params=params)
        assert toks == ref, p
        accepted += sum(s.accepted for s in steps)
    assert accepted >= 8


# ---------------------------------------------------------------- trees (EAGLE-2)

def first_two(engine, ids, sp) -> dict:
    """The target's exact joint distribution of the first two tokens after `ids` under `sp`: {(a, b): p}."""
    p1 = process(engine.forward(ids)[0, -1], sp)
    joint = {}
    for a in p1.nonzero().flatten().tolist():
        p2 = process(engine.forward(ids + [a])[0, -1], sp)
        for b in p2.nonzero().flatten().tolist():
            joint[(a, b)] = float(p1[a] * p2[b])
    return joint


def flat_costs(engine):
    """Every pass width costs the same: the tree's cost cut then keeps every node up to `nodes` (the tiny model's
    own measured costs grow with the width and would keep only a few)."""
    engine.extras.setdefault("pass_costs", {})["plain"] = {w: 0.05 for w in E.TREE_WIDTHS}
    return engine


def test_grow_and_choose_make_a_tree_the_target_can_verify(target, trained):
    fd = trained[0]
    use(target, fd)
    ids = target.encode(Request(prompt=PROMPTS[0]))
    with FD.capture(target) as got, torch.inference_mode():
        target.forward(ids, target.new_cache())
        cache = fd.new_cache()
        h = fd.hidden(got[-1][:, :-1], torch.tensor([ids[1:]]), cache)[0, -1]
        dlen = len(ids) - 1
        tree = E.grow(fd, target, h, cache, dlen, depth=4, branch=3, width=2, stop=0.0)
    assert tree.passes == 4 and len(tree.tokens) == 3 + 3 * 6          # 3 children, then 2 x 3 per level
    assert Engine.cache_len(cache) == dlen + 2 * 3                       # the expanded nodes' pairs
    for i, par in enumerate(tree.parents):
        assert par < i and tree.depths[i] == (1 if par < 0 else tree.depths[par] + 1)
        assert par < 0 or tree.probs[i] <= tree.probs[par] + 1e-9        # a path is no likelier than its prefix
    # the root's children are the draft's three likeliest first tokens, in order
    with torch.inference_mode():
        first = fd.kept_ids[fd.kept_logits(h).float().topk(3).indices].tolist()
    assert tree.tokens[:3] == first
    # each expanded node's children are what a plain causal draft pass over its path would give
    node = next(i for i in range(3, len(tree.tokens)) if tree.depths[i] == 3)
    path, a = [], tree.parents[node]
    while a >= 0:
        path.insert(0, a)
        a = tree.parents[a]
    with torch.inference_mode():
        c2 = fd.new_cache()
        hh = fd.hidden(got[-1][:, :-1], torch.tensor([ids[1:]]), c2)[:, -1:]
        for i in path:
            hh = fd.hidden(hh, torch.tensor([[tree.tokens[i]]]), c2)
        best = fd.kept_ids[fd.kept_logits(hh[0, -1]).float().topk(3).indices].tolist()
    siblings = [i for i in range(len(tree.tokens)) if tree.parents[i] == tree.parents[node]]
    assert [tree.tokens[i] for i in siblings] == best
    # choose: flat costs keep the likeliest `nodes`, closed under parents, in creation order
    small = E.choose(tree, 1, lambda w: 1.0, 7)
    assert len(small.tokens) == 7 and all(-1 <= q < i for i, q in enumerate(small.parents))
    assert sorted(small.probs, reverse=True) == sorted(tree.probs, reverse=True)[:7]
    # costs that grow fast with the width keep none
    assert E.choose(tree, 1, lambda w: float(w) ** 3, 7).tokens == []
    mask = E.tree_mask(2, [-1, 0, -1])
    assert mask.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 1]]


def test_keep_moves_the_accepted_path_as_a_causal_pass_would_cache_it(target):
    """A tree pass's cache, cut to its accepted path by `Engine.keep`, equals the cache of a plain causal pass over
    the same tokens; the next pass's logits agree."""
    ids = target.encode(Request(prompt="def f(x):"))
    tokens, parents = [5, 9, 7, 11, 3], [-1, -1, 1, 2, 1]            # path 1 -> 2 -> 3: tokens 9, 7, 11
    depths = [1, 1, 2, 3, 2]
    base = len(ids)
    tree_cache, plain = target.new_cache(), target.new_cache()
    target.forward(ids[:-1], tree_cache)
    positions = torch.tensor([[base - 1] + [base - 1 + d for d in depths]])
    target.forward([ids[-1]] + tokens, tree_cache, positions, target.tree_mask(base - 1, E.tree_mask(1, parents)))
    Engine.keep(tree_cache, base, [1, 2, 3])
    target.forward(ids + [9, 7, 11], plain)
    assert Engine.cache_len(tree_cache) == Engine.cache_len(plain) == base + 3
    for (k1, v1), (k2, v2) in zip(Engine.cache_kv(tree_cache), Engine.cache_kv(plain)):
        assert torch.allclose(k1, k2, atol=1e-5) and torch.allclose(v1, v2, atol=1e-5)
    a, b = target.forward([4], tree_cache), target.forward([4], plain)
    assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("params", [{"adaptive": False},
                                    {"adaptive": False, "depth": 5, "branch": 3, "width": 3, "nodes": 40, "stop": 0.0}])
def test_tree_greedy_equals_ar_token_for_token(target, trained, params):
    use(flat_costs(target), trained[0])
    accepted = drafted = 0
    try:
        for p in PROMPTS[:3] + ["Something the draft never saw: 42 * 17 ="]:
            ref, _ = run(target, "ar", p)
            toks, steps = run(target, "eagle", p, params=params)
            assert toks == ref, p
            assert steps[0].drafted == 0 and steps[0].prefill
            for s in steps[1:]:
                assert s.forward_passes == 1 and s.draft_passes <= params.get("depth", 6)
                assert s.draft_passes >= 1 or s is steps[-1]          # the last token needs no draft
                assert s.drafted <= params.get("nodes", 12) + 8 and 0 <= s.accepted <= s.info["depth"]
            accepted += sum(s.accepted for s in steps)
            drafted += sum(s.drafted for s in steps)
    finally:
        target.extras.pop("pass_costs", None)
    assert drafted > 100 and accepted > 25       # wide trees were verified, and their paths kept


def test_tree_budget_and_eos(target, trained):
    use(flat_costs(target), trained[0])
    try:
        toks, steps = run(target, "eagle", PROMPTS[0], max_new_tokens=7, params={"adaptive": False})
        assert len(toks) == 7 and steps[-1].finished
        assert all(s.info["depth"] <= 6 - sum(len(x.token_ids) for x in steps[:i])
                   for i, s in enumerate(steps) if i)                   # never drafted past the budget
        ref, _ = run(target, "ar", PROMPTS[0])
        cut = next(i for i in range(8, 30) if ref[i] not in ref[:i])
        eng = copy.copy(target)
        eng.eos_ids = {ref[cut]}
        got, st = run(eng, "eagle", PROMPTS[0], ignore_eos=False, params={"adaptive": False})
        assert got == ref[:cut] and st[-1].finish_reason == "eos"
    finally:
        target.extras.pop("pass_costs", None)


def test_tree_sampling_is_lossless_in_distribution(target, trained):
    """As the chain's test: over 400 seeds the first two tokens follow the target's joint distribution (T 1.0,
    top-k 5) with an over-confident draft whose likeliest tokens form the tree."""
    fd = FD.FeatureDraft.from_target(target, sorted(range(target.vocab_size)))
    fd.net.load_state_dict(trained[0].net.state_dict())
    fd.net.shell.lm_head.weight.mul_(6.0)
    use(flat_costs(target), fd.prepare())
    sp = SamplingParams(1.0, top_k=5)
    prompt = "def f(x):"
    ids = target.encode(Request(prompt=prompt))
    joint = first_two(target, ids, sp)
    n, counts, accepted = 400, {}, 0
    try:
        for seed in range(n):
            toks, steps = run(target, "eagle", prompt, max_new_tokens=3, temperature=1.0, top_k=5, seed=seed,
                              params={"depth": 2, "branch": 2, "width": 2, "stop": 0.0, "adaptive": False})
            counts[tuple(toks[:2])] = counts.get(tuple(toks[:2]), 0) + 1
            accepted += sum(s.accepted for s in steps)
    finally:
        target.extras.pop("pass_costs", None)
    assert accepted > 40                                 # the tree's nodes were kept, not only corrections
    assert set(counts) <= {c for c, pr in joint.items() if pr > 0}
    tv = 0.5 * sum(abs(counts.get(c, 0) / n - pr) for c, pr in joint.items())
    assert tv < 0.15, tv


# ---------------------------------------------------------------- copies from the context (`lookup`)

def test_graft_hangs_the_copy_under_the_root_sharing_the_drafts_nodes():
    tree = E.Tree([5, 6, 7], [-1, -1, 0], [1, 1, 2], [0.6, 0.3, 0.4], 2)
    g = E.graft(tree, [5, 7, 9], [0.5, 0.25, 0.125])
    assert g.tokens == [5, 6, 7, 9] and g.parents == [-1, -1, 0, 2] and g.depths == [1, 1, 2, 3]
    assert g.probs == [0.6, 0.3, 0.4, 0.125] and g.origin == ["b", "d", "b", "c"] and g.passes == 2
    g2 = E.graft(g, [6, 8], [0.5, 0.25])                  # a likelier copy raises the draft's node
    assert g2.tokens[-1] == 8 and g2.parents[-1] == 1 and g2.probs[1] == 0.5 and g2.origin[1] == "b"
    only = E.graft(E.Tree([], [], [], [], 0), [3, 3, 4], [0.5, 0.25, 0.125])
    assert only.parents == [-1, 0, 1] and only.origin == ["c"] * 3 and only.passes == 0
    for t in (g, g2, only):                               # siblings distinct, a path no likelier than its prefix
        assert len({(p, x) for p, x in zip(t.parents, t.tokens)}) == len(t.tokens)
        assert all(p < 0 or t.probs[i] <= t.probs[p] for i, p in enumerate(t.parents))
    cut = E.choose(g2, 1, lambda w: 1.0, 3)               # the cut keeps each kept node's origin
    assert cut.tokens == [5, 6, 7] and cut.origin == ["b", "b", "b"]
    rates = E.CopyRate()
    assert rates.probs(2, 3) == [0.5, 0.25, 0.125]        # one hit in two tries before any step
    E.copy_record(rates, 2, g, [0, 2])                    # tries: 5 (root), 7 (under 5), 9 (under 7); hits 5, 7
    assert rates.rate(2) == pytest.approx((0.8 * 1 + 2) / (0.8 * 2 + 3))
    assert rates.rate(1) == 0.5                           # per n-gram length


@pytest.fixture(scope="module")
def looping():
    """A random model with small weights: after a few tokens it repeats itself (a copyable context)."""
    return random_engine(0, init=0.1)


@pytest.mark.parametrize("adaptive", [False, True])
def test_lookup_greedy_equals_ar_and_its_copies_are_accepted(looping, adaptive):
    """With an untrained draft that is almost never right, the copied tokens carry the steps: greedy output is
    `ar`'s token for token, and many more tokens are accepted per pass than without the copy."""
    fd = FD.FeatureDraft.from_target(looping, sorted(range(looping.vocab_size))).prepare()
    use(flat_costs(looping), fd)
    plain = copied = 0
    try:
        for p in PROMPTS[:4]:
            ref, _ = run(looping, "ar", p)
            base, bsteps = run(looping, "eagle", p, params={"adaptive": adaptive, "lookup": 0})
            toks, steps = run(looping, "eagle", p, params={"adaptive": adaptive, "lookup": 8})
            assert base == ref and toks == ref, p
            assert all(s.drafted <= 12 + 8 for s in steps)
            assert sum(s.info.get("copied", 0) for s in steps) > 0
            plain += sum(s.accepted for s in bsteps)
            copied += sum(s.accepted for s in steps)
    finally:
        looping.extras.pop("pass_costs", None)
    assert copied >= 80 and copied >= 4 * max(plain, 1), (copied, plain)


def test_lookup_sampling_is_lossless_in_distribution(looping):
    """Sampling (T 1.0, top-k 5) with copies offered from a repetitive prompt: over 400 seeds the first two tokens
    follow the target's exact joint distribution, and the copies were verified and often accepted."""
    fd = FD.FeatureDraft.from_target(looping, sorted(range(looping.vocab_size))).prepare()
    use(flat_costs(looping), fd)
    sp = SamplingParams(1.0, top_k=5)
    ids0, _ = run(looping, "ar", PROMPTS[1], max_new_tokens=12)
    prompt = PROMPTS[1] + looping.decode(ids0) * 2
    ids = looping.encode(Request(prompt=prompt, chat=False))
    joint = first_two(looping, ids, sp)
    n, counts, copied, accepted = 400, {}, 0, 0
    try:
        for seed in range(n):
            toks, steps = run(looping, "eagle", prompt, max_new_tokens=3, temperature=1.0, top_k=5, seed=seed,
                              chat=False, params={"depth": 2, "branch": 2, "width": 2, "adaptive": False,
                                                  "lookup": 4})
            counts[tuple(toks[:2])] = counts.get(tuple(toks[:2]), 0) + 1
            copied += sum(s.info.get("copied", 0) for s in steps)
            accepted += sum(s.accepted for s in steps)
    finally:
        looping.extras.pop("pass_costs", None)
    assert copied > 50 and accepted > 40                  # (92 and 130 when written)
    assert set(counts) <= {c for c, pr in joint.items() if pr > 0}
    tv = 0.5 * sum(abs(counts.get(c, 0) / n - pr) for c, pr in joint.items())
    assert tv < 0.15, tv
    # where the first token repeats the loop the copy proposes it again: the second token still follows the
    # target's conditional distribution (accepting the copy blindly would put all of these on one pair)
    a = ids[-1]
    after = {b: c for (x, b), c in counts.items() if x == a}
    m = sum(after.values())
    assert m > 30, counts
    cond = {b: pr / sum(q for (x, _), q in joint.items() if x == a) for (x, b), pr in joint.items() if x == a}
    assert 0.5 * sum(abs(after.get(b, 0) / m - q) for b, q in cond.items()) < 0.3, (after, cond)


@pytest.mark.slow
def test_train_eagle_end_to_end_on_a_small_model_and_resume(model_dir, tmp_path):
    """`train eagle --model M` on the random tiny model: teacher answers, features, steps, a loadable draft with a
    card; a second run with more steps resumes from the checkpoint (features read from the cache)."""
    import json

    from paradec.engine import Engine
    from paradec.training import prompts as P
    argv = ["--model", str(model_dir), "--vocab", "400", "--steps", "3", "--batch", "2", "--prompts", "9",
            "--eval-prompts", "9", "--gen-tokens", "8", "--gen-batch", "9", "--eval-every", "3", "--ckpt-every", "3",
            "--fill-chars", "20000", "--teacher-dtype", "float32", "--out", str(tmp_path / "d"),
            "--work", str(tmp_path / "w"), "--teacher-cache", str(tmp_path / "w")]
    assert ET.main(argv) == 0
    cfg = json.loads((tmp_path / "d" / "draft_config.json").read_text())
    assert cfg["steps"] == 3 and cfg["complete"] and [c["step"] for c in cfg["curve"]] == [0, 3]
    assert 0.0 <= cfg["curve"][-1]["a1"] <= 1.0 and cfg["kept_tokens"] == 400
    assert "a1 (first proposal" in (tmp_path / "d" / "README.md").read_text()
    kinds = cfg["heldout_by_kind"]                 # the card's per-kind table covers every held-out position
    assert set(kinds) <= set(P.KINDS) and len(kinds) >= 3
    assert sum(v["positions"] for v in kinds.values()) == cfg["curve"][-1]["positions"]
    assert cfg["train_fit"]["positions"] > 0 and "Acceptance per kind" in (tmp_path / "d" / "README.md").read_text()
    assert (tmp_path / "w" / "features_answers_float32.pt").exists()
    fd = FD.load(tmp_path / "d", Engine.load(str(model_dir), dtype="float32"))
    assert len(fd.kept_ids) == 400
    argv[argv.index("--steps") + 1] = "5"
    assert ET.main(argv) == 0
    cfg = json.loads((tmp_path / "d" / "draft_config.json").read_text())
    assert cfg["steps"] == 5 and [c["step"] for c in cfg["curve"]] == [0, 3, 5]
    # --card-only measures the saved draft and rewrites its card, training nothing
    del cfg["heldout_by_kind"]
    (tmp_path / "d" / "draft_config.json").write_text(json.dumps(cfg))
    (tmp_path / "d" / "README.md").unlink()
    weights = (tmp_path / "d" / "draft.safetensors").read_bytes()
    assert ET.main(argv + ["--card-only"]) == 0
    again = json.loads((tmp_path / "d" / "draft_config.json").read_text())
    assert {k: v["positions"] for k, v in again["heldout_by_kind"].items()} == \
        {k: v["positions"] for k, v in kinds.items()} and again["steps"] == 5
    assert (tmp_path / "d" / "draft.safetensors").read_bytes() == weights
    assert "Acceptance per kind" in (tmp_path / "d" / "README.md").read_text()
    # --init continues from a saved draft (its weights and vocabulary) with a fresh optimiser, into another folder
    start = FD.read(tmp_path / "d", Engine.load(str(model_dir), dtype="float32"))
    cont = argv[:argv.index("--out")] + ["--out", str(tmp_path / "d2"), "--work", str(tmp_path / "w2"),
                                         "--teacher-cache", str(tmp_path / "w"), "--init", str(tmp_path / "d"),
                                         "--vocab", "300", "--sampled-prompts", "3"]
    cont[cont.index("--steps") + 1] = "2"
    assert ET.main(cont) == 0
    cfg2 = json.loads((tmp_path / "d2" / "draft_config.json").read_text())
    assert cfg2["steps"] == 2 and cfg2["init"]["steps"] == 5 and cfg2["kept_tokens"] == 400   # its vocabulary
    assert "continuing a draft of 5 steps" in (tmp_path / "d2" / "README.md").read_text()
    assert "the first 3 with one sampled" in cfg2["data"] and "the other 6 the greedy one only" in cfg2["data"]
    cont2 = FD.load(tmp_path / "d2", Engine.load(str(model_dir), dtype="float32"))
    assert not torch.equal(cont2.state()["fc.weight"], start.state()["fc.weight"])    # it trained on
    with pytest.raises(SystemExit, match="--init"):
        ET.main(cont[:-4] + ["--init", str(tmp_path / "nowhere")])


def test_tree_rule_pauses_drafting_that_does_not_pay():
    from paradec.strategies.speculative import PROBE_EVERY
    rule = E.TreeRule(plain_seconds=0.1)
    assert rule.draft_now()
    for i in range(10):                     # half a token accepted a step
        rule.update(i % 2, 0.3)
    # 1-2 tokens per 0.3 s of drafting against 10 tokens/s plain: pause, probing every PROBE_EVERY + 1 steps
    pattern = [rule.draft_now() for _ in range(2 * (PROBE_EVERY + 1))]
    assert pattern.count(True) == 2 and pattern[PROBE_EVERY] and pattern[-1]
    for _ in range(10):                     # the text turns predictable: 4 tokens per 0.2 s, drafting pays again
        rule.update(3, 0.2)
    assert all(rule.draft_now() for _ in range(20))


def test_a_useless_draft_gets_plain_steps_and_the_output_stays_ar(target):
    """An untrained draft (its proposals almost never kept): the adaptive tree soon stops drafting and probes now
    and then; greedy output is still ar's."""
    use(target, FD.FeatureDraft.from_target(target, sorted(range(0, target.vocab_size, 2))).prepare())
    ref, _ = run(target, "ar", PROMPTS[1], max_new_tokens=60)
    toks, steps = run(target, "eagle", PROMPTS[1], max_new_tokens=60)
    assert toks == ref
    plain = [s for s in steps[1:] if s.draft_passes == 0]
    assert len(plain) > len(steps) // 2 and any(s.draft_passes for s in steps[1:])


# ------------------------------------------------------------ aux layers (EAGLE-3's fused features)

def test_aux_capture_at_decoding_equals_the_trainers_aux_features(target):
    """The parts `capture` appends for aux layers are what those layers' input norms read (the residual stream
    after that many layers, normalised), and the trainer's early-stopped passes (`aux_features`) give the same
    numbers for the same row: the draft is trained on what it reads when decoding."""
    ids = target.encode(Request(prompt="def f(x):"))
    with FD.capture(target, [1, 3]) as got, torch.no_grad():
        target.forward(ids, target.new_cache())
        out = target.model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    g = got[0][0]
    assert g.shape == (len(ids), 3 * 64)
    dec = target.model.model
    assert torch.allclose(g[:, :64], dec.norm(out.hidden_states[-1][0]), atol=1e-4)
    for j, a in enumerate([1, 3]):
        assert torch.allclose(g[:, 64 * (j + 1):64 * (j + 2)], dec.layers[a].input_layernorm(out.hidden_states[a][0]),
                              atol=1e-4)
    rows = ET.aux_features(target, [(ids, 0)], [1, 3], None, "test")
    assert torch.allclose(rows[0]["aux"].float(), g[:, 64:], atol=0.02 * float(g[:, 64:].abs().max()))  # bfloat16


def test_widened_draft_decodes_as_before_until_trained(target, trained):
    """`widen` adds zero weights for the aux inputs: whatever the aux parts hold, the draft's outputs are the
    unwidened draft's; predictions (hidden wide) read zeros there."""
    fd = trained[0]
    wide = FD.FeatureDraft.from_state(target, fd.config_dict(), fd.state(), fd.kept_ids.tolist()).widen([1, 2])
    assert wide.config_dict()["aux_layers"] == [1, 2] and wide.net.fc.in_features == 4 * 64
    x, t = torch.randn(1, 5, 64), torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        a = fd.kept_logits(fd.hidden(x, t))
        b = wide.kept_logits(wide.hidden(torch.cat([x, 5 * torch.randn(1, 5, 128)], -1), t))
        c = wide.kept_logits(wide.hidden(x, t))
    assert torch.allclose(a, b, atol=1e-3) and torch.allclose(a, c, atol=1e-3)
    with pytest.raises(ValueError, match="already"):
        wide.widen([3])
    for bad in ([0], [4], [2, 2]):
        with pytest.raises(ValueError, match="aux layers"):
            FD.FeatureDraft.from_target(target, fd.kept_ids.tolist()).widen(bad)


@pytest.fixture(scope="module")
def trained_aux(target, trained):
    """The trained draft widened to read layers 1 and 2 and trained on briefly, so the aux weights are not zero."""
    torch.manual_seed(1)
    fd0 = trained[0]
    fd = FD.FeatureDraft.from_state(target, fd0.config_dict(), fd0.state(), fd0.kept_ids.tolist()).widen([1, 2])
    seqs = rows_of(target, PROMPTS)
    data = ET.with_aux(ET.features(target, seqs, None, "test"), ET.aux_features(target, seqs, [1, 2], None, "test"))
    scale = torch.cat([r["feats"].float() for r in data]).std(0).clamp(min=1e-3)
    opt = torch.optim.AdamW(fd.trainable(), lr=1e-3)
    batches = ET.batches([(data, 1.0)], 4, random.Random(1))
    for _ in range(30):
        loss, _parts = ET.losses(fd, *next(batches), scale, 0.2, 0.5, torch.Generator().manual_seed(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(fd.net.fc.weight[:, 64:192].detach().abs().max()) > 1e-3      # the aux inputs are read now
    return fd.prepare(), ET.acceptance(fd, data)


@pytest.mark.parametrize("params", [CHAIN5, {"adaptive": False}])
def test_aux_draft_greedy_equals_ar_token_for_token(target, trained_aux, params):
    """Lossless with a draft that reads aux layers, and its first proposals of a step read the target's true aux
    parts (features 3 x hidden wide), its later ones its own predictions (hidden wide)."""
    fd = trained_aux[0]
    use(flat_costs(target), fd)
    widths = []
    full = fd.full
    fd.full = lambda feats: widths.append(feats.shape[-1]) or full(feats)
    accepted = 0
    try:
        for p in PROMPTS[:3] + ["Something the draft never saw: 42 * 17 ="]:
            ref, _ = run(target, "ar", p)
            toks, steps = run(target, "eagle", p, params=params)
            assert toks == ref, p
            accepted += sum(s.accepted for s in steps)
    finally:
        del fd.full
        target.extras.pop("pass_costs", None)
        target.extras.pop("eagle", None)
    assert accepted > 20 and trained_aux[1]["a1"] > 0.3
    assert set(widths) == {64, 3 * 64}


def test_aux_draft_save_load_round_trip(target, trained_aux, tmp_path):
    fd = trained_aux[0]
    fd.save(tmp_path / "d")
    loaded = FD.load(tmp_path / "d", target)
    assert loaded.aux == [1, 2] and loaded.meta["aux_layers"] == [1, 2]
    x, t = torch.randn(1, 5, 3 * 64), torch.tensor([[3, 4, 5, 6, 7]])
    with torch.no_grad():
        a = fd.kept_logits(fd.hidden(x, t))
        b = loaded.kept_logits(loaded.hidden(x, t))
    assert torch.allclose(a, b, atol=0.05 * float(a.abs().max()))      # saved in bfloat16


def test_trainer_refuses_bad_aux_layers(capsys):
    with pytest.raises(SystemExit):
        ET.main(["--aux-layers", "6,x"])
    assert "must" in capsys.readouterr().err
