"""Skeleton-of-Thought: parsing, batched expansion exactness, honest pass counts, fallback, router, history."""
import dataclasses
import json
from pathlib import Path

import pytest

from paradec import router as R
from paradec.sampling import UStream, next_tokens
from paradec.strategies import Request, get
from paradec.strategies.base import Output
from paradec.strategies.skeleton import (template_for, expand_points, parse_skeleton, point_budgets, point_prefix,
                                         point_seed, render_skeleton, skeleton_complete, shared_prefix_len, sot_history)

QUESTION = "Outline the module `json`."
# points of clearly different token lengths, so the suffixes differ and left padding really happens
POINTS = ["dumps: Serialize obj", "loads: Deserialize a JSON document to a Python object instance",
          "x", "JSONDecoder: Simple JSON decoder"]


def run(engine, name, request):
    return list(get(name).stream(engine, request))


def expansion_prompts(engine, points, template="auto", question=QUESTION):
    tpl = template_for({"template": template}, engine)
    sk = render_skeleton(points)
    return [engine.encode_messages(tpl.expansion_messages([], question, sk, b), tpl.header(b, p))
            for b, p in enumerate(points, 1)]


def alone(engine, prompt, budget, request, stream=None):
    """The reference: one prompt, batch of 1, no padding, plain KV-cache decoding."""
    cache = engine.new_cache()
    logits = engine.forward(prompt, cache, logits_to_keep=1)[0, -1]
    out = []
    while True:
        tok = int(next_tokens(logits, request.sampling, stream[len(out)] if stream else None))
        if tok in engine.eos_ids:
            return out
        out.append(tok)
        if len(out) >= budget:
            return out
        logits = engine.forward([tok], cache, logits_to_keep=1)[0, -1]


def point_ids(steps, n):
    ids = {b: [] for b in range(1, n + 1)}
    for s in steps:
        if s.stage == "expand":
            ids[s.segment] += s.token_ids
    return ids


class PassCounter:
    """Counts real calls of the model's forward (a hook, not a mock)."""

    def __init__(self, engine):
        self.n = 0
        self.h = engine.model.register_forward_hook(lambda *a: self.bump())

    def bump(self):
        self.n += 1

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.h.remove()


# ------------------------------------------------------------------------------------------- parser
def test_parse_skeleton_duplicates_gaps_junk_and_cap():
    text = ("1. Serialize to JSON\nSure, here is the skeleton:\n2. Parse JSON text.\n2. Parse again (duplicate)\n"
            "5) **Custom encoders**\n   - a bullet that is not numbered\n1. the list restarts\n7.\n9. Errors;")
    assert parse_skeleton(text) == ["Serialize to JSON", "Parse JSON text", "Custom encoders", "Errors"]
    many = "\n".join(f"{i}. point {i}" for i in range(1, 15))
    assert parse_skeleton(many) == [f"point {i}" for i in range(1, 11)]
    assert parse_skeleton(many, max_points=3) == ["point 1", "point 2", "point 3"]
    assert parse_skeleton("no numbers at all\njust prose") == []
    assert parse_skeleton("1. " + " ".join(["w"] * 40)) == [" ".join(["w"] * 16)]
    assert render_skeleton(["a", "b"]) == "1. a\n2. b"


def test_parse_skeleton_drops_near_duplicate_points():
    text = ("1. Improved mood\n2. Better sleep\n3. Improves mood\n4. Weight loss\n5. Better sleep quality\n"
            "6. Stronger bones and muscles\n7. Stronger muscles and bones\n8. Mental health\n9. Physical health")
    assert parse_skeleton(text) == ["Improved mood", "Better sleep", "Weight loss", "Stronger bones and muscles",
                                    "Mental health", "Physical health"]


def test_skeleton_is_complete_when_prose_follows_two_points():
    assert not skeleton_complete("1. a\n2. b\n")                  # may go on with 3.
    assert not skeleton_complete("1. a\n2. b\nSo")                # the line is not finished
    assert skeleton_complete("1. a\n2. b\nSo, to sum up\n")
    assert not skeleton_complete("1. a\nnot yet a list\n2. b\n")  # prose before the second point
    assert not skeleton_complete("1. a\n\n2. b\n\n3. c")          # blank lines between points are fine
    assert skeleton_complete("1. a\n2. b\n3. c\n", max_points=3)


def test_point_budgets_keep_total_within_max_new_tokens():
    assert point_budgets(4, 128, 48) == [32] * 4
    assert point_budgets(3, 1000, 48) == [48] * 3
    assert sum(point_budgets(7, 20, 48)) <= 20
    assert point_budgets(5, 3, 48) == [1, 1, 1]


# ------------------------------------------------------------------------------------------- exactness
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_batched_expansion_equals_each_point_alone(tiny_engine, temperature):
    e = tiny_engine
    # 24 tokens per point: long enough that attending to a padding slot would change a greedy token here
    req = Request(prompt=QUESTION, max_new_tokens=4 * 24, temperature=temperature, top_k=50, seed=3,
                  skeleton=POINTS, params={"point_max_tokens": 24})
    prompts = expansion_prompts(e, POINTS)
    L = shared_prefix_len(prompts)
    suffixes = {len(p) - L for p in prompts}
    assert L > 10 and len(suffixes) >= 3, "the suffixes must differ in length so left padding happens"
    steps = run(e, "sot", req)
    got = point_ids(steps, len(POINTS))
    for b, prompt in enumerate(prompts, 1):
        stream = None if temperature == 0 else UStream(point_seed(req.seed, b))
        want = alone(e, prompt, 24, req, stream)
        assert got[b] == want, f"point {b} differs from its expansion alone"
        assert len(want) > 3
    # the headers come from the skeleton and every point is in the answer, in order
    answer = steps[-1].answer
    assert answer.split("\n")[0].startswith("1. dumps: Serialize obj")
    pos = [answer.index(f"{b}. {p}") for b, p in enumerate(POINTS, 1)]
    assert pos == sorted(pos)


def test_pass_counting_is_honest_and_batching_saves_passes(tiny_engine):
    e = tiny_engine
    req = Request(prompt=QUESTION, max_new_tokens=200, skeleton=POINTS, params={"point_max_tokens": 16})
    with PassCounter(e) as pc:
        steps = run(e, "sot", req)
    assert sum(s.forward_passes for s in steps) == pc.n
    # one Step per point per pass: within a pass only the first Step carries the forward pass
    for s in steps:
        if s.forward_passes == 0:
            assert s.stage == "expand" and s.segment > 1
    got = point_ids(steps, len(POINTS))
    serial = 0
    for b, prompt in enumerate(expansion_prompts(e, POINTS), 1):
        with PassCounter(e) as pc1:
            want = alone(e, prompt, 16, req)
        assert got[b] == want
        serial += pc1.n
    batched = pc.n
    assert batched <= 16 + 1          # shared prefix + suffix prefill + 15 decode steps
    assert serial >= 3 * batched, (serial, batched)
    assert all(s.info.get("batch") == len(POINTS) for s in steps if s.stage == "expand")


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_sequential_expansion_gives_the_batched_text_with_more_passes(tiny_engine, temperature):
    """expansion=sequential (the plain-decoder baseline) writes exactly the batched answer, point after
    point in segment order, and spends about one pass per token instead of one per batched step."""
    e = tiny_engine
    base = dict(prompt=QUESTION, max_new_tokens=4 * 20, temperature=temperature, top_k=50, seed=5, skeleton=POINTS)
    params = {"point_max_tokens": 20}
    with PassCounter(e) as pb:
        batched = run(e, "sot", Request(**base, params=params))
    with PassCounter(e) as ps:
        seq = run(e, "sot", Request(**base, params={**params, "expansion": "sequential"}))
    assert point_ids(seq, len(POINTS)) == point_ids(batched, len(POINTS))
    assert seq[-1].answer == batched[-1].answer
    segs = [s.segment for s in seq if s.token_ids]
    assert segs == sorted(segs) and set(segs) == set(range(1, len(POINTS) + 1))
    assert sum(s.forward_passes for s in seq) == ps.n and sum(s.forward_passes for s in batched) == pb.n
    tokens = sum(len(s.token_ids) for s in seq)
    assert ps.n >= tokens and pb.n * 2 < ps.n, (pb.n, ps.n, tokens)
    with pytest.raises(Exception, match="expansion"):
        run(e, "sot", Request(**base, params={**params, "expansion": "both"}))


def test_budgets_and_independent_finishing(tiny_engine):
    e = tiny_engine
    req = Request(prompt=QUESTION, max_new_tokens=30, skeleton=POINTS, params={"point_max_tokens": 48})
    steps = run(e, "sot", req)
    info = steps[-1].info
    assert info["point_tokens"] == [7, 7, 7, 7]          # 30 // 4
    assert sum(len(s.token_ids) for s in steps) == 28 <= req.max_new_tokens
    finished = [s.segment for s in steps if s.finished]
    assert sorted(finished) == [1, 2, 3, 4]               # each point finishes exactly once


def test_finished_point_stops_emitting_while_others_continue(tiny_engine):
    """A stop string ends one point early; the others go on in the same batch and still match alone."""
    e = tiny_engine
    base = Request(prompt=QUESTION, max_new_tokens=64, skeleton=POINTS, params={"point_max_tokens": 16})
    free = point_ids(run(e, "sot", base), 4)
    text1 = e.decode(free[1])
    cut = e.decode(free[1][:3])
    assert cut.strip() and cut.strip() in text1
    req = dataclasses.replace(base, stop=[cut.strip()[:4]])
    steps = run(e, "sot", req)
    got = point_ids(steps, 4)
    assert len(got[1]) < len(free[1])
    longest = max(len(v) for v in got.values())
    assert longest > len(got[1])
    last_pass_of_1 = max(i for i, s in enumerate(steps) if s.segment == 1)
    assert any(s.segment != 1 for s in steps[last_pass_of_1 + 1:])
    for b in range(2, 5):
        if not any(cut.strip()[:4] in e.decode(free[b][:k]) for k in range(1, len(free[b]) + 1)):
            assert got[b] == free[b]


def test_shared_prefix_reuses_a_prefix_cache_exactly(tiny_engine):
    e = tiny_engine
    req = Request(prompt=QUESTION, max_new_tokens=40)
    prompts = expansion_prompts(e, POINTS[:3])
    L = shared_prefix_len(prompts)

    def expand(prefix):
        outs = [Output(e, req, budget=10) for _ in prompts]
        passes = [sum(s.forward_passes for s in st) for st in expand_points(e, req, prompts, outs, [None] * 3,
                                                                             prefix)]
        return [o.ids for o in outs], sum(passes)

    fresh, passes_fresh = expand(None)
    # a cache holding the first L-5 shared tokens followed by tokens that are not in the prompts
    held = prompts[0][:L - 5] + [11, 12, 13]
    cache = e.new_cache()
    e.forward(held, cache)
    reused, passes_reused = expand((cache, held))
    assert reused == fresh and passes_reused == passes_fresh
    # a cache that already holds the whole shared prefix saves the prefix pass
    held = prompts[0][:L] + [5, 6]
    cache = e.new_cache()
    e.forward(held, cache)
    reused, passes_full = expand((cache, held))
    assert reused == fresh and passes_full == passes_fresh - 1


def test_generic_template_shares_question_and_skeleton(tiny_engine):
    e = tiny_engine
    q = "What are the main benefits of regular exercise?"
    pts = ["Better heart health", "Improved mood and sleep", "Stronger muscles"]
    prompts = expansion_prompts(e, pts, "generic", q)
    L = shared_prefix_len(prompts)
    assert q in e.decode(prompts[0][:L]) and "3. Stronger muscles" in e.decode(prompts[0][:L])
    req = Request(prompt=q, max_new_tokens=24, skeleton=pts, params={"template": "generic",
                                                                     "point_max_tokens": 8})
    got = point_ids(run(e, "sot", req), 3)
    for b, p in enumerate(prompts, 1):
        assert got[b] == alone(e, p, 8, req)


# ------------------------------------------------------------------------------------------- fallback
def test_one_point_skeleton_falls_back_to_ar_with_reason(tiny_engine):
    e = tiny_engine
    req = Request(prompt=QUESTION, max_new_tokens=12, skeleton=["only one point"])
    steps = run(e, "sot", req)
    assert "1 point" in steps[0].info["fallback"]
    ar = run(e, "ar", Request(prompt=QUESTION, max_new_tokens=12))
    assert [t for s in steps for t in s.token_ids] == [t for s in ar for t in s.token_ids]
    assert all(s.segment == 1 for s in steps)
    assert steps[-1].answer == "".join(s.text for s in ar)


def test_model_skeleton_stage_and_fallback_counts_passes(tiny_engine):
    """The random model writes no list: the skeleton stage runs, then SoT falls back and says why."""
    e = tiny_engine
    req = Request(prompt=QUESTION, max_new_tokens=10, params={"skeleton_max_tokens": 12})
    with PassCounter(e) as pc:
        steps = run(e, "sot", req)
    sk = [s for s in steps if s.stage == "skeleton"]
    assert len(sk) == 12 and all(s.segment == 0 and s.forward_passes == 1 for s in sk)
    assert sk[0].prefill and sk[0].text.startswith("1.")
    assert "points" in sk[-1].info and len(sk[-1].info["points"]) < 2
    fb = [s for s in steps if "fallback" in s.info]
    assert len(fb) == 1 and "SoT needs at least 2" in fb[0].info["fallback"]
    assert sum(s.forward_passes for s in steps) == pc.n == 12 + 10


# ------------------------------------------------------------------------------------------- router
def test_router_trains_and_beats_chance_on_held_out(tmp_path):
    rows = R.read_labels(R.LABELS)
    assert len(rows) >= 60 and {y for _, y in rows} == {0, 1}
    out = tmp_path / "router.json"
    meta = R.train_router(R.LABELS, out)
    assert meta["held_out"] >= 15 and meta["held_out_accuracy"] >= 0.85
    r = R.load_router(out)
    assert r.source == "model" and r.meta["held_out_accuracy"] == meta["held_out_accuracy"]
    _, held = R.split(rows)
    assert round(R.accuracy(r, held), 4) == meta["held_out_accuracy"]
    assert r.is_list("List ways to make a website load faster.")
    assert not r.is_list("What does `os.getcwd` do?")
    # the shipped weights are exactly what the command produces
    shipped = json.loads(R.ROUTER.read_text())
    assert shipped["meta"]["held_out_accuracy"] == meta["held_out_accuracy"]
    assert shipped["weights"] == json.loads(out.read_text())["weights"]


def test_router_labels_are_not_benchmark_prompts():
    """The router is trained and judged on its own questions: none of them is (nearly) a suite's prompt, so
    sot-r's routing on the suites is measured on questions it never saw."""
    import re
    words = lambda t: set(re.findall(r"[a-z]+", t.lower()))  # noqa: E731
    suite = []
    for f in (Path(__file__).resolve().parents[1] / "evals" / "suites").glob("*.jsonl"):
        for line in f.read_text().splitlines():
            d = json.loads(line)
            suite += [t for t in [d.get("prompt")] + list(d.get("turns") or []) if isinstance(t, str) and t]
    assert len(suite) > 300
    for prompt, _ in R.read_labels(R.LABELS):
        a = words(prompt)
        near = [s for s in suite if len(a & words(s)) >= 0.75 * len(a | words(s))]
        assert not near, (prompt, near[:1])


def test_router_falls_back_to_keywords_when_file_is_missing(tmp_path):
    r = R.load_router(tmp_path / "absent.json")
    assert r.source == "keywords"
    assert r.is_list("What are the main features of `asyncio`?")
    assert not r.is_list("What is 12 * 7?")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert R.load_router(bad).source == "keywords"


def test_sot_r_runs_ar_directly_on_non_list_questions(tiny_engine):
    e = tiny_engine
    q = "What does `json.dumps` do?"
    with PassCounter(e) as pc:
        steps = run(e, "sot-r", Request(prompt=q, max_new_tokens=10))
    ar = run(e, "ar", Request(prompt=q, max_new_tokens=10))
    assert steps[0].info["route"] == "ar" and steps[0].info["p_list"] < 0.5
    assert not any(s.stage == "skeleton" for s in steps)
    assert [s.token_ids for s in steps] == [s.token_ids for s in ar]
    assert pc.n == sum(s.forward_passes for s in ar) == 10


def test_sot_r_runs_sot_on_list_questions(tiny_engine):
    e = tiny_engine
    req = Request(prompt=QUESTION, max_new_tokens=16, skeleton=POINTS, params={"point_max_tokens": 4})
    steps = run(e, "sot-r", req)
    assert steps[0].info["route"] == "sot"
    direct = run(e, "sot", dataclasses.replace(req, params={"point_max_tokens": 4}))
    assert [(s.segment, s.token_ids) for s in steps] == [(s.segment, s.token_ids) for s in direct]
    assert steps[-1].answer == direct[-1].answer


# ------------------------------------------------------------------------------------------- history
def test_sot_history_keeps_only_question_and_answer(tiny_engine):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": QUESTION}]
    req = Request(messages=msgs, max_new_tokens=8, skeleton=POINTS[:2])
    steps = run(tiny_engine, "sot", req)
    answer = steps[-1].answer
    nxt = sot_history(msgs, answer)
    assert nxt == msgs + [{"role": "assistant", "content": answer}]
    assert not any("Expand point" in m["content"] for m in nxt)
    assert msgs[-1]["content"] == QUESTION and len(msgs) == 3     # the input is not modified


def test_unknown_template_is_rejected(tiny_engine):
    from paradec.strategies import RequestError
    with pytest.raises(RequestError):
        run(tiny_engine, "sot", Request(prompt=QUESTION, params={"template": "nope"}))


# ------------------------------------------------------------------------------------------- shipped model
@pytest.mark.skipif(not (R.ROOT / "data" / "models" / "paradec-tiny" / "config.json").exists(),
                    reason="the shipped model data/models/paradec-tiny is not trained yet")
def test_default_model_outline_end_to_end(tiny_model_engine):
    """paradec-tiny writes a skeleton for a held-out module; points expand in one batch, exactly."""
    from paradec.training.corpus import is_held_out
    e = tiny_model_engine
    module = "difflib"            # held out of training, and it has a 10-point outline in the corpus
    assert is_held_out(module)
    req = Request(prompt=f"Outline the module `{module}`.", max_new_tokens=160, params={"point_max_tokens": 40})
    with PassCounter(e) as pc:
        steps = run(e, "sot", req)
    assert sum(s.forward_passes for s in steps) == pc.n
    sk = [s for s in steps if s.stage == "skeleton"]
    assert sk and sk[0].text.startswith("1.")
    points = sk[-1].info["points"]
    if len(points) < 2:
        assert any("fallback" in s.info for s in steps)
        return
    pre = [s for s in steps if s.stage == "expand-prefix"]
    assert pre and pre[0].info["reused_tokens"] > 5      # the question's tokens come from the skeleton pass
    got = point_ids(steps, len(points))
    budget = point_budgets(len(points), 160, 40)[0]
    for b, prompt in enumerate(expansion_prompts(e, points, question=req.prompt), 1):
        assert got[b] == alone(e, prompt, budget, req)
    assert steps[-1].answer.startswith("1. ")
