"""The lossless speculative family: shared verification, `sps`, `pld`, `lookahead`.

Everything runs on random tiny Llamas with the project tokenizer. Greedy outputs must equal `ar` token for
token; `pld` and `lookahead` must also equal `ar` under sampling with the same seed (coupled verification);
`sps` sampling is checked statistically against the target's exact probabilities.
"""
import copy
import dataclasses
import random

import pytest
import torch

from paradec import passcost, verification
from paradec.engine import ModelError
from paradec.sampling import SamplingParams, UStream, process
from paradec.strategies import Request, RequestError, get
from paradec.strategies import speculative
from paradec.strategies.speculative import K_MAX, K_MIN, best_k
from paradec.strategies.lookahead import NgramPool, layout
from paradec.strategies.prompt_lookup import ContextIndex, lookup
from paradec.testing import random_engine

PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "Explain what a Python list comprehension is.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "import os\nimport sys\nimport re\n",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)          # tiny models: threads only add overhead (and the machine is shared)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def target():
    return random_engine(0)


@pytest.fixture(scope="module")
def other_draft():
    return random_engine(7)          # a different random model: it almost never agrees with the target


@pytest.fixture(scope="module")
def looping():
    """A random model with small weights: a few varied tokens, then it repeats itself (copyable context)."""
    return random_engine(0, init=0.1)


def run(engine, name, prompt, **kw):
    params = kw.pop("params", {})
    req = Request(prompt=prompt, params=params, **{"max_new_tokens": 40, "ignore_eos": True, **kw})
    steps = list(get(name).stream(engine, req))
    return [t for s in steps for t in s.token_ids], steps


def with_draft(engine, draft):
    engine.extras.pop("draft_checks", None)
    engine.extras["draft"] = draft
    return engine


# ---------------------------------------------------------------- shared verification

def test_greedy_and_coupled_rules():
    V = 6
    logits = torch.full((4, V), -5.0)
    for row, tok in enumerate([2, 3, 1, 4]):       # target argmax per row
        logits[row, tok] = 5.0
    v = verification.greedy([2, 3, 5], logits)
    assert v.tokens == [2, 3, 1] and v.accepted == 2          # mismatch at d_3: the target's own token
    v = verification.greedy([2, 3, 1], logits)
    assert v.tokens == [2, 3, 1, 4] and v.accepted == 3       # all accepted: bonus token
    v = verification.greedy([0, 3, 1], logits)
    assert v.tokens == [2] and v.accepted == 0
    greedy = SamplingParams()
    assert verification.coupled([2, 3, 5], logits, greedy, None, 0).tokens == [2, 3, 1]
    # coupled under sampling: accept exactly the tokens Pick(u_i, p_i) would give
    sp = SamplingParams(1.0)
    us = UStream(11)
    rnd = torch.randn(4, V, generator=torch.Generator().manual_seed(0))
    want = verification.target_tokens(rnd, sp, us, 5)
    assert want == [int(torch.searchsorted(process(rnd[i], sp).double().cumsum(0), us[5 + i], right=True))
                    for i in range(4)]
    v = verification.coupled(want[:3], rnd, sp, us, 5)
    assert v.tokens == want and v.accepted == 3
    wrong = (want[1] + 1) % V
    v = verification.coupled([want[0], wrong, want[2]], rnd, sp, us, 5)
    assert v.tokens == want[:2] and v.accepted == 1
    with pytest.raises(ValueError):
        verification.greedy([1, 2], logits)                   # needs k+1 rows


def test_rejection_sampling_matches_target_distribution():
    """Rejection sampling from a draft q must give tokens distributed as the target p - for the first output
    token and for the second given the first draft token was accepted; a draft-biased rule would fail."""
    V, n = 6, 8000
    g = torch.Generator().manual_seed(3)
    target_logits = torch.randn(3, V, generator=g) * 1.5
    draft_logits = torch.randn(2, V, generator=g) * 1.5
    sp = SamplingParams(1.0)
    p, q = process(target_logits, sp), process(draft_logits, sp)
    assert 0.5 * (p[0] - q[0]).abs().sum() > 0.3               # the draft is far from the target: power
    rng = verification.Rng(0)
    first, second = torch.zeros(V), torch.zeros(V)
    accepted = first_accepted = 0
    for _ in range(n):
        d = [rng.sample(q[0]), rng.sample(q[1])]
        v = verification.rejection(d, q, target_logits, sp, rng)
        assert len(v.tokens) == v.accepted + 1 and v.tokens[:v.accepted] == d[:v.accepted]
        first[v.tokens[0]] += 1
        if v.accepted >= 1:
            second[v.tokens[1]] += 1
        accepted += v.accepted
        first_accepted += v.accepted >= 1
    tv1 = 0.5 * (first / n - p[0]).abs().sum()
    tv2 = 0.5 * (second / second.sum() - p[1]).abs().sum()
    assert tv1 < 0.03, (first / n, p[0])
    assert tv2 < 0.05, (second / second.sum(), p[1])
    # d_1 is accepted with probability sum_x min(p(x), q(x))
    rate = float(torch.minimum(p[0], q[0]).sum())
    assert abs(first_accepted / n - rate) < 0.02, (first_accepted / n, rate)
    assert accepted > first_accepted


def test_rejection_degenerates_to_greedy_and_full_acceptance():
    V = 5
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1))
    sp = SamplingParams(0.7, top_k=3)
    p = process(logits, sp)
    rng = verification.Rng(5)
    for _ in range(50):      # draft == target: every proposal is accepted, a bonus token follows
        d = [rng.sample(p[0]), rng.sample(p[1])]
        assert verification.rejection(d, p[:2], logits, sp, rng).accepted == 2
    v = verification.rejection([int(logits[0].argmax()), 0], torch.zeros(2, V), logits, SamplingParams(), rng)
    assert v.tokens == verification.greedy([int(logits[0].argmax()), 0], logits).tokens


def test_tree_verification_greedy_walks_the_matching_path():
    V = 7
    logits = torch.full((6, V), -5.0)
    # nodes: 0 tok 3 (root), 1 tok 4 (root), 2 tok 5 (under 1), 3 tok 6 (under 1), 4 tok 2 (under 3)
    tokens, parents = [3, 4, 5, 6, 2], [-1, -1, 1, 1, 3]
    for row, best in enumerate([4, 0, 6, 0, 1, 2]):     # root -> 4 (node 1) -> 6 (node 3) -> target picks 1
        logits[row, best] = 5.0
    v, path = verification.tree(tokens, parents, logits, SamplingParams(), verification.Rng(0))
    assert path == [1, 3] and v.tokens == [4, 6, 1] and v.accepted == 2
    logits[0] = -5.0
    logits[0, 0] = 5.0                                  # no child of the root matches: the target's own token
    v, path = verification.tree(tokens, parents, logits, SamplingParams(), verification.Rng(0))
    assert path == [] and v.tokens == [0] and v.accepted == 0
    with pytest.raises(ValueError):
        verification.tree(tokens, [-1, -1, 3, 1, 3], logits, SamplingParams(), verification.Rng(0))
    with pytest.raises(ValueError):
        verification.tree(tokens, parents, logits[:4], SamplingParams(), verification.Rng(0))


def test_tree_verification_samples_the_target_distribution():
    """Fixed candidates (the draft's likeliest, not samples) tried in order with the refused ones removed: the first
    token follows the target's distribution, and so does the second after an accepted first; preferring the
    draft's candidates (a bias toward them) would show in the frequencies."""
    V, n = 5, 8000
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(6, V, generator=g) * 1.5
    sp = SamplingParams(1.0)
    p = process(logits, sp)
    # root children: tokens 1, 3 (nodes 0, 1); under node 0: tokens 0, 2 (nodes 2, 3); under node 1: token 4
    tokens, parents = [1, 3, 0, 2, 4], [-1, -1, 0, 0, 1]
    row_after = {1: 1, 3: 2}                     # the logits row that predicts the token after each root child
    rng = verification.Rng(1)
    first, second = torch.zeros(V), {1: torch.zeros(V), 3: torch.zeros(V)}
    accepted = 0
    for _ in range(n):
        v, path = verification.tree(tokens, parents, logits, sp, rng)
        assert [tokens[i] for i in path] == v.tokens[:v.accepted] and len(v.tokens) == v.accepted + 1
        first[v.tokens[0]] += 1
        if v.accepted >= 1:
            second[v.tokens[0]][v.tokens[1]] += 1
        accepted += v.accepted
    assert 0.5 * float((first / n - p[0]).abs().sum()) < 0.03, (first / n, p[0])
    for a, counts in second.items():
        assert counts.sum() > 300
        got = counts / counts.sum()
        assert 0.5 * float((got - p[row_after[a]]).abs().sum()) < 0.06, (a, got, p[row_after[a]])
    # a candidate is kept whenever the target draws it: the first proposal is accepted with p(1) + p(3)
    assert abs(sum(float(second[a].sum()) for a in second) / n - float(p[0][1] + p[0][3])) < 0.02
    assert accepted > sum(float(second[a].sum()) for a in second)      # second-level acceptances happened


# ---------------------------------------------------------------- pld lookup and lookahead layout

def test_lookup_proposals():
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup(seq, 3, 4) == [7, 8, 5, 1]                 # most recent earlier match of [1, 2, 3]
    assert lookup([4, 5, 6, 7, 4], 3, 2) == [5, 6]           # falls back to a 1-gram
    assert lookup([1, 2, 3], 3, 5) == []                     # nothing repeats
    assert lookup([7, 8, 7, 8], 2, 5) == [7, 8, 7, 8, 7]     # a short cycle continues past the end
    # the incremental index pld uses gives the same proposals as the plain scan
    r = random.Random(0)
    for _ in range(200):
        vocab, index, seq = r.choice([2, 3, 5, 20]), ContextIndex(3), []
        for _ in range(r.randrange(1, 10)):
            new = [r.randrange(vocab) for _ in range(r.randrange(1, 6))]
            index.extend(new)
            seq += new
            for k in (0, 1, 4, 10):
                assert index.propose(k) == lookup(seq, 3, k), (seq, k)


def test_lookahead_layout_equals_causal_chains(target):
    """Every token of one lookahead pass (window and candidates) must see exactly its own chain: its logits
    equal those of an ordinary causal forward over context + chain."""
    ctx = target.tokenizer("hello world, this is a test of lookahead")["input_ids"]
    cache = target.new_cache()
    target.forward(ctx[:-2], cache)
    levels = [[11, 12, 13, 14], [21, 22, 23, 24], [31, 32, 33, 34]]
    cands = [[41, 42, 43], [51], [61, 62]]
    toks, pos, allowed, look_at, cand_at = layout(ctx[-2:], len(ctx) - 2, levels, cands)
    got = target.forward(toks, cache, pos, target.tree_mask(len(ctx) - 2, allowed))[0]

    def causal(chain):
        return target.forward(ctx + chain)[0, -1]

    torch.testing.assert_close(got[1], causal([]), atol=1e-4, rtol=1e-4)
    for l in range(3):
        for j in range(4):
            chain = levels[0][:j + 1] + [levels[m][j] for m in range(1, l + 1)]
            torch.testing.assert_close(got[look_at + 4 * l + j], causal(chain), atol=1e-4, rtol=1e-4)
    for c, at in zip(cands, cand_at):
        for i in range(len(c)):
            torch.testing.assert_close(got[at + i], causal(c[:i + 1]), atol=1e-4, rtol=1e-4)


def test_ngram_pool_keeps_recent_distinct():
    pool = NgramPool(cap=2)
    for g in ([1, 2, 3], [1, 4, 5], [1, 2, 3], [1, 6, 7]):
        pool.add(g)
    assert pool.get(1, 5) == [(6, 7), (2, 3)]
    assert pool.get(9, 5) == []


# ---------------------------------------------------------------- greedy == ar

@pytest.mark.parametrize("name", ["pld", "lookahead", "sps-other", "sps-self"])
def test_greedy_equals_ar(target, other_draft, name):
    strategy = name.split("-")[0]
    if name == "sps-other":
        with_draft(target, other_draft)
    elif name == "sps-self":
        with_draft(target, target)
    # a draft as dear as its target: the cost rule would keep k at 1, transformers' rule lets it grow
    params = {"rule": "transformers", "lookup": 0} if name == "sps-self" else {}    # self: the draft's own figures
    totals = {"passes": 0, "tokens": 0, "accepted": 0, "drafted": 0}
    for i, prompt in enumerate(PROMPTS):
        ref, _ = run(target, "ar", prompt, ignore_eos=bool(i % 2))
        got, steps = run(target, strategy, prompt, ignore_eos=bool(i % 2), params=params)
        assert got == ref, (name, prompt)
        assert all(s.forward_passes == 1 for s in steps) and steps[0].prefill
        assert not any(s.prefill for s in steps[1:])
        assert steps[-1].finished and sum(s.finished for s in steps) == 1
        assert all(0 <= s.accepted <= s.drafted and len(s.token_ids) <= s.accepted + 1 for s in steps)
        totals["passes"] += len(steps)
        totals["tokens"] += len(got)
        totals["accepted"] += sum(s.accepted for s in steps)
        totals["drafted"] += sum(s.drafted for s in steps)
    if strategy == "sps":
        assert totals["drafted"] > 0
    if name == "sps-self":          # the target drafting for itself: every proposal accepted
        assert totals["accepted"] == totals["drafted"] and totals["tokens"] / totals["passes"] > 4


@pytest.mark.parametrize("which", ["other", "sharpened", "self"])
def test_sps_tree_greedy_equals_ar(target, other_draft, which):
    """`sps` with tree=true: the target's greedy text token for token, with a draft that rarely agrees, one that
    often does (the target sharpened: same ranking, confident) and the target itself (flat: the cost cut keeps
    mostly its first level); the sharpened draft's trees get paths accepted below their first level."""
    draft = {"other": other_draft, "sharpened": _sharpened(target, 3.0), "self": target}[which]
    with_draft(target, draft)
    params = {"tree": True, "adaptive": False, "nodes": 10, "depth": 4, "lookup": 0}     # the draft's tree alone
    accepted = deep = drafted = 0
    for i, prompt in enumerate(PROMPTS):
        ref, _ = run(target, "ar", prompt, ignore_eos=bool(i % 2))
        got, steps = run(target, "sps", prompt, ignore_eos=bool(i % 2), params=params)
        assert got == ref, (which, prompt)
        assert all(s.forward_passes == 1 and s.drafted <= 10 for s in steps) and steps[0].prefill
        assert all(0 <= s.accepted <= s.info["depth"] and len(s.token_ids) <= s.accepted + 1 for s in steps)
        accepted += sum(s.accepted for s in steps)
        deep += sum(s.accepted >= 2 for s in steps)
        drafted += sum(s.drafted for s in steps)
        if which == "self":        # the target's own argmax is a first-level child of every tree it drafts
            assert all(s.accepted >= 1 for s in steps[1:-1] if s.drafted)
    assert drafted > 0
    if which == "sharpened":       # confident: deep paths pay by the cost cut and are accepted
        assert accepted > 40 and deep > 5
        for n in range(1, 7):      # the budget holds whatever the tree's depth
            ref, _ = run(target, "ar", PROMPTS[3], max_new_tokens=n)
            got, steps = run(target, "sps", PROMPTS[3], max_new_tokens=n, params=params)
            assert got == ref and len(got) == n and steps[-1].finish_reason == "length"


def test_sps_tree_lookup_grafts_copies_and_keeps_ar(looping, other_draft):
    """`sps` tree=true with `lookup`: on text that repeats itself the copy grafted into the tree is verified (after
    the tree's own nodes, beyond `nodes`) and accepted, still ar's output; at every budget too."""
    with_draft(looping, other_draft)
    prompt = "a b c a b c a b c a b c"
    ref, _ = run(looping, "ar", prompt, max_new_tokens=60)
    params = {"tree": True, "adaptive": False, "nodes": 4, "lookup": 16}
    got, steps = run(looping, "sps", prompt, max_new_tokens=60, params=params)
    alone, plain = run(looping, "sps", prompt, max_new_tokens=60, params={**params, "lookup": 0})
    assert got == ref and alone == ref
    assert sum(s.info["copied"] for s in steps) > 0 and all(s.info["copied"] == 0 for s in plain)
    assert any(s.drafted > 4 for s in steps) and all(s.drafted <= 4 for s in plain)
    assert len(got) / len(steps) > 1.5 * len(alone) / len(plain)
    for n in range(1, 7):
        ref_n, _ = run(looping, "ar", prompt, max_new_tokens=n)
        assert run(looping, "sps", prompt, max_new_tokens=n, params=params)[0] == ref_n


def test_sps_counts_draft_passes_and_adapts_k(target, other_draft):
    with_draft(target, other_draft)
    hf_rule = {"rule": "transformers", "lookup": 0}
    _, steps = run(target, "sps", PROMPTS[1], params=hf_rule)
    assert [s.info["k"] for s in steps[:3]] == [4, 3, 2]          # rejected: k shrinks by one
    assert all(s.draft_passes == s.drafted == s.info["k"] for s in steps)
    with_draft(target, target)
    _, steps = run(target, "sps", PROMPTS[1], max_new_tokens=60, params=hf_rule)
    assert [s.info["k"] for s in steps[:3]] == [4, 6, 8]          # all accepted: k grows by two
    _, steps = run(target, "sps", PROMPTS[1], params={"k": 3, "adaptive": False, "lookup": 0})
    assert {s.info["k"] for s in steps[:-3]} == {3} and sum(map(len, (s.token_ids for s in steps))) == 40


def test_best_k_weighs_acceptance_against_pass_costs():
    flat = lambda w: 1.0                                           # noqa: E731 - a verify pass of any width
    ks = [best_k(a, flat, 0.05) for a in (0.05, 0.2, 0.4, 0.6, 0.8, 0.95)]
    assert ks == sorted(ks) and ks[0] == K_MIN and ks[-1] > 8      # more acceptance, longer drafts
    assert best_k(0.99, flat, 0.0) == K_MAX                        # free drafts, certain acceptance: draft all
    assert best_k(0.5, flat, 0.5) == K_MIN                         # a draft pass costing half a target pass
    steep = lambda w: 1.0 if w <= 5 else 3.0                       # noqa: E731 - wide passes compute-bound
    assert best_k(0.9, steep, 0.01) == 4                           # k + 1 = 5 positions, the widest cheap pass
    # the choice is the argmax of expected tokens per second over every k
    speed = lambda k: sum(0.7 ** i for i in range(k + 1)) / (steep(k + 1) + 0.02 * k)   # noqa: E731
    assert speed(best_k(0.7, steep, 0.02)) == max(speed(k) for k in range(K_MIN, K_MAX + 1))


def test_sps_cost_rule_follows_acceptance(target, other_draft):
    """The default rule: its k falls to 1 when proposals are rejected and grows when every one is accepted, with
    the pass costs it finds on the engines (here set: flat target passes, drafts at 5% of one); ar's output
    either way. Without stored costs it measures them once per engine."""
    ref, _ = run(target, "ar", PROMPTS[1], max_new_tokens=60)
    for e in (target, other_draft):
        e.extras.pop("pass_costs", None)
    with_draft(target, other_draft)
    alone = {"lookup": 0}                            # the draft's k alone (copies take steps of their own)
    got, _ = run(target, "sps", PROMPTS[1], max_new_tokens=20, params=alone)
    assert got == ref[:20]
    assert set(speculative.COST_WIDTHS) <= set(target.extras["pass_costs"]["plain"])
    assert 1 in other_draft.extras["pass_costs"]["plain"]

    target.extras["pass_costs"] = {"plain": {w: 1.0 for w in speculative.COST_WIDTHS}}
    other_draft.extras["pass_costs"] = {"plain": {1: 0.05}}
    got, steps = run(target, "sps", PROMPTS[1], max_new_tokens=60, params=alone)
    assert got == ref
    low = [s.info["k"] for s in steps[1:-1]]             # a random draft: now and then one proposal is right
    self_draft = copy.copy(target)                   # the target's own weights, priced as a cheap draft
    self_draft.extras = {"pass_costs": {"plain": {1: 0.05}}}
    with_draft(target, self_draft)
    got, steps = run(target, "sps", PROMPTS[1], max_new_tokens=60, params=alone)
    assert got == ref
    high = [s.info["k"] for s in steps[1:-1]]
    assert max(low) <= 2 and sum(low) / len(low) < 1.5 and min(high) >= 4 and max(high) >= 12
    target.extras.pop("pass_costs")


def test_cost_rule_falls_back_to_plain_steps_and_probes(target, other_draft):
    target.extras["pass_costs"] = {"plain": {w: 1.0 for w in speculative.COST_WIDTHS}}
    other_draft.extras["pass_costs"] = {"plain": {1: 0.3}}           # a draft pass at 0.3 of a target pass
    rule = speculative.CostRule(target, other_draft)
    ks = [rule.next_k(1, 0) for _ in range(3)]                          # every proposal rejected
    assert ks[-1] == 0 and rule.rate < 0.3
    zeros = ks.count(0)                                                 # plain steps chosen so far, in a row
    plain = [rule.next_k(0, 0) for _ in range(speculative.PROBE_EVERY + 1 - zeros)]
    assert plain == [0] * (speculative.PROBE_EVERY - zeros) + [1]      # a one-token probe after PROBE_EVERY
    grown = [rule.next_k(1, 1) for _ in range(6)]                       # now every proposal accepted
    assert grown[-1] >= 2 and rule.rate > 0.7
    for _ in range(20):                                                 # drafting takes 0.01 s a token here
        rule.next_k(2, 1, draft_seconds=0.02)
    assert abs(rule.draft_cost - 0.01) < 0.01 and rule.next_k(2, 1, None) >= 1
    target.extras.pop("pass_costs")
    other_draft.extras.pop("pass_costs")


def test_sps_plain_steps_keep_the_output(target, other_draft):
    """Target passes priced near zero: drafting never pays, so sps decodes with plain steps (k 0) and a
    one-token probe every PROBE_EVERY + 1 steps; the output is ar's."""
    ref, _ = run(target, "ar", PROMPTS[3], max_new_tokens=40)
    target.extras["pass_costs"] = {"plain": {w: 1e-9 for w in speculative.COST_WIDTHS}}
    with_draft(target, other_draft)
    got, steps = run(target, "sps", PROMPTS[3], max_new_tokens=40, params={"lookup": 0})
    assert got == ref
    ks = [s.info["k"] for s in steps[1:]]
    assert ks.count(0) >= 25 and 1 <= ks.count(1) <= 5
    assert all(s.drafted == 0 and s.draft_passes == 0 and len(s.token_ids) == 1 for s in steps[1:] if not s.info["k"])
    target.extras.pop("pass_costs")


def test_sps_lookup_adds_copies_and_keeps_ar(looping, other_draft):
    """`lookup`: on text that repeats itself copies from the context are verified after the draft's proposals, or
    alone with no draft pass; a draft that rarely agrees then still gets well over one token a pass (the draft alone
    does not), and the output is ar's token for token, at every budget."""
    with_draft(looping, other_draft)
    prompt = "a b c a b c a b c a b c"
    ref, _ = run(looping, "ar", prompt, max_new_tokens=60)
    alone, plain = run(looping, "sps", prompt, max_new_tokens=60, params={"lookup": 0})
    got, steps = run(looping, "sps", prompt, max_new_tokens=60, params={"lookup": 16})
    assert alone == ref and got == ref
    assert all("copied" not in s.info for s in plain)
    copied = [s for s in steps if s.info["copied"]]
    assert copied and all(s.drafted == s.info["k"] + s.info["copied"] and s.draft_passes == s.info["k"]
                          for s in steps)
    assert all(0 <= s.accepted <= s.drafted and len(s.token_ids) <= s.accepted + 1 for s in steps)
    assert len(got) / len(steps) > 2 > len(alone) / len(plain)
    assert any(s.info["k"] == 0 for s in copied)            # a copy alone: no draft pass that step
    for n in range(1, 7):
        ref_n, _ = run(looping, "ar", prompt, max_new_tokens=n)
        got_n, steps_n = run(looping, "sps", prompt, max_new_tokens=n, params={"lookup": 16})
        assert got_n == ref_n and steps_n[-1].finish_reason == "length"
        assert all(s.drafted <= n for s in steps_n)
    for i, text in enumerate(PROMPTS):                       # text with few repeats: ar's output still
        with_draft(looping, other_draft)
        ref, _ = run(looping, "ar", text, ignore_eos=bool(i % 2))
        assert run(looping, "sps", text, ignore_eos=bool(i % 2), params={"lookup": 16})[0] == ref, text


def test_copies_priced_by_their_acceptance():
    """`Copies` keeps copied tokens while their expected acceptance pays for the wider pass, and takes a copy alone
    over drafting when it is worth more; a copy that keeps being refused is soon left out."""
    costs = {1: 1.0, 2: 1.05, 4: 1.15, 8: 1.5, 16: 2.5}    # a row costs a little, wide passes more
    tc = lambda w: passcost.cost_at(costs, w)                                   # noqa: E731
    ids = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7]              # the context's tail 5 6 7 was seen: copy 8 9 10 ...
    c = speculative.Copies(ids, 16, tc)
    copy, ngram = c.after([], 20, 0.5, 0.1)
    assert ngram == 3 and copy == [8, 9, 10]                 # at the prior rate 0.5: what a 4-wide pass holds
    assert c.alone(4, 20, 0.99, 0.0) == ([], 0)              # a free, certain draft is worth more
    alone, n = c.alone(4, 20, 0.3, 0.1)                      # a weak draft at 0.1 a pass: the copy instead
    assert n == 3 and alone == [8, 9, 10]
    after, _ = c.after([8, 9], 18, 0.5, 0.1)                 # after drafts that follow the copy: its continuation
    assert after[:1] == [10]
    for _ in range(10):                                      # copies after a 3-gram keep being accepted
        c.rates.record(3, 8, 8)
    long, _ = c.after([], 20, 0.5, 0.1)
    assert len(long) == 16 and long[:8] == [8, 9, 10, 11, 12, 5, 6, 7]
    for _ in range(30):
        c.rates.record(3, 1, 0)
    assert c.after([], 20, 0.5, 0.1) == ([], 0)              # refused copies: none verified
    # settled: a copy is tried only when every drafted proposal before it held
    c = speculative.Copies(ids, 16, tc)
    c.settled([8], drafted=2, copied=3, ngram=3, accepted=1)
    assert c.rates.tries == {} and c.index.seq[-1] == 8
    c.settled([9, 10, 11], drafted=1, copied=3, ngram=3, accepted=2)
    assert c.rates.hits[3] == 0.8 * 1.0 + 1 and c.rates.tries[3] == 0.8 * 2.0 + 2


def test_repetitive_output_is_accelerated(looping):
    """When the output repeats, copied drafts are accepted: > 1 token per target pass, still == ar."""
    prompt = "a b c a b c a b c a b c"
    ref, _ = run(looping, "ar", prompt, max_new_tokens=60)
    for name, params in [("pld", {}), ("lookahead", {}), ("lookahead", {"context_pool": False})]:
        got, steps = run(looping, name, prompt, max_new_tokens=60, params=params)
        assert got == ref
        accepted = sum(s.accepted for s in steps)
        assert accepted > 0, (name, params)
        if params.get("context_pool", True):      # n-grams from the context; Jacobi-only harvest is slower
            assert len(got) / len(steps) > 1.5, (name, params, len(got) / len(steps))
        assert len(got) == len(steps) + accepted


# ---------------------------------------------------------------- sampling

@pytest.mark.parametrize("name", ["pld", "lookahead"])
def test_coupled_sampling_equals_ar_with_same_seed(target, looping, name):
    cases = [(target, PROMPTS[0], dict(temperature=0.8, seed=1)),
             (target, PROMPTS[2], dict(temperature=1.0, top_k=20, seed=2)),
             (target, PROMPTS[3], dict(temperature=0.7, top_p=0.9, seed=3)),
             (looping, "a b c a b c a b c", dict(temperature=0.3, seed=4)),
             (looping, "x y x y x y", dict(temperature=0.5, top_k=5, seed=5))]
    accepted = 0
    for engine, prompt, kw in cases:
        ref, _ = run(engine, "ar", prompt, **kw)
        got, steps = run(engine, name, prompt, **kw)
        assert got == ref, (name, prompt, kw)
        accepted += sum(s.accepted for s in steps)
    assert accepted > 0            # drafts were really accepted under sampling, not only plain steps
    other, _ = run(target, "ar", PROMPTS[0], temperature=0.8, seed=99)
    assert other != run(target, name, PROMPTS[0], temperature=0.8, seed=1)[0]   # the seed matters


def _sharpened(engine, factor):
    """The same model with its final norm scaled: same ranking, much sharper distribution (a biased draft)."""
    d = copy.deepcopy(engine)
    d.extras = {}
    with torch.no_grad():
        d.model.model.norm.weight.mul_(factor)
    return d


def test_sps_rejection_sampling_is_lossless_in_distribution(target):
    """Over 300 seeds the first two sps tokens follow the target's exact distribution (T 1.0, top-k 5), while
    the draft's own distribution is far from it - accepting drafts blindly or resampling from p instead of
    max(p - q, 0) would fail the bounds; drafting a tree, the first token follows it too."""
    draft = _sharpened(target, 6.0)
    with_draft(target, draft)
    sp = SamplingParams(1.0, top_k=5)
    prompt = "The quick brown fox"
    ids = target.encode(Request(prompt=prompt))
    p1 = process(target.forward(ids)[0, -1], sp)
    q1 = process(draft.forward(ids)[0, -1], sp)
    support = p1.nonzero().flatten().tolist()
    assert len(support) == 5 and 0.5 * float((p1 - q1).abs().sum()) > 0.4
    joint = {}
    for a in support:
        p2 = process(target.forward(ids + [a])[0, -1], sp)
        for b in p2.nonzero().flatten().tolist():
            joint[(a, b)] = float(p1[a] * p2[b])
    n = 300
    counts1, counts2 = torch.zeros(target.vocab_size), {}
    accepted = drafted = 0
    for seed in range(n):
        toks, steps = run(target, "sps", prompt, max_new_tokens=3, temperature=1.0, top_k=5, seed=seed,
                          params={"lookup": 0})
        counts1[toks[0]] += 1
        counts2[tuple(toks[:2])] = counts2.get(tuple(toks[:2]), 0) + 1
        accepted += sum(s.accepted for s in steps)
        drafted += sum(s.drafted for s in steps)
    assert 0.2 < accepted / drafted < 0.9          # both acceptances and rejections happened
    assert set(counts1.nonzero().flatten().tolist()) <= set(support)
    expected = p1[support].cpu() * n
    chi2 = float(((counts1[support] - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, (chi2, counts1[support], expected)          # chi-square df 4, p = 0.001
    assert set(counts2) <= set(joint)
    tv = 0.5 * sum(abs(counts2.get(c, 0) / n - pr) for c, pr in joint.items())
    assert tv < 0.2, tv
    # the draft alone would be rejected by the same chi-square bound
    q_chi2 = float(((q1[support].cpu() * n - expected) ** 2 / expected).sum())
    assert q_chi2 > 100
    # a drafted tree (tree=true), its children tried in turn with p(child) / (mass left): the same first-token law
    tree = {"tree": True, "adaptive": False}
    counts1, accepted = torch.zeros(target.vocab_size), 0
    for seed in range(n):
        toks, steps = run(target, "sps", prompt, max_new_tokens=3, temperature=1.0, top_k=5, seed=seed, params=tree)
        counts1[toks[0]] += 1
        accepted += sum(s.accepted for s in steps)
    assert accepted > 0 and set(counts1.nonzero().flatten().tolist()) <= set(support)
    chi2 = float(((counts1[support] - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, (chi2, counts1[support], expected)
    a = run(target, "sps", PROMPTS[1], temperature=0.8, seed=5, params=tree)[0]
    assert a == run(target, "sps", PROMPTS[1], temperature=0.8, seed=5, params=tree)[0]     # same seed, same text


def test_sps_sampled_copies_keep_the_target_distribution(looping, other_draft):
    """Copied proposals (one-hot q) under rejection sampling: over 300 seeds the first token, proposed as a copy in
    the first step, follows the target's exact distribution (T 1.0, top-k 5); copies are both accepted and refused.
    Accepting a copy outright, or resampling from p instead of p without the refused token, fails the bound."""
    with_draft(looping, other_draft)
    sp = SamplingParams(1.0, top_k=5)
    start, _ = run(looping, "ar", "a", chat=False, max_new_tokens=8)
    prompt = "a" + looping.decode(start)          # the model's own loop: the copy is a token it may sample
    ids = looping.encode(Request(prompt=prompt, chat=False))
    p1 = process(looping.forward(ids)[0, -1], sp)
    support = p1.nonzero().flatten().tolist()
    index = ContextIndex(3)
    index.extend(ids)
    assert 0.1 < float(p1[index.propose(1)[0]]) < 0.9       # so the copy is sometimes accepted, sometimes refused
    n = 300
    counts = torch.zeros(looping.vocab_size)
    first_copied = copy_hits = 0
    for seed in range(n):
        toks, steps = run(looping, "sps", prompt, chat=False, max_new_tokens=4, temperature=1.0, top_k=5, seed=seed,
                          params={"lookup": 16})
        counts[toks[0]] += 1
        first_copied += steps[0].info["copied"] > 0 and steps[0].info["k"] == 0
        copy_hits += steps[0].accepted > 0
    assert first_copied == n and 0 < copy_hits < n         # every first step verified a copy alone; mixed verdicts
    assert set(counts.nonzero().flatten().tolist()) <= set(support)
    expected = p1[support] * n
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, (chi2, counts[support], expected)          # chi-square df 4, p = 0.001


# ---------------------------------------------------------------- stopping, params, draft loading

def test_stops_at_budget(target, other_draft, looping):
    with_draft(target, other_draft)
    with_draft(looping, other_draft)
    for name in ["pld", "lookahead", "sps"]:
        for engine in (target, looping):
            ref, _ = run(engine, "ar", PROMPTS[2], max_new_tokens=7)
            got, steps = run(engine, name, PROMPTS[2], max_new_tokens=7)
            assert got == ref and steps[-1].finish_reason == "length"
    one, steps = run(looping, "pld", PROMPTS[2], max_new_tokens=1)
    assert len(one) == 1 and len(steps) == 1 and steps[0].drafted == 0


def test_eos_inside_an_accepted_draft_ends_the_output(target):
    """The target drafting for itself accepts whole drafts; an EOS in the middle of one must cut it there."""
    ref, _ = run(target, "ar", PROMPTS[1])
    cut = next(i for i in range(8, 30) if ref[i] not in ref[:i])
    eng = copy.copy(target)
    eng.eos_ids = {ref[cut]}
    eng.extras = {"draft": target}
    for name, params in [("ar", {}), ("sps", {"rule": "transformers"})]:     # k grows (a self-draft is dear)
        got, steps = run(eng, name, PROMPTS[1], ignore_eos=False, params=params)
        assert got == ref[:cut] and steps[-1].finish_reason == "eos", name
    assert steps[-1].drafted > len(steps[-1].token_ids)          # the last sps step was cut short


def test_stop_string_cuts_a_multi_token_step(looping):
    ref, _ = run(looping, "ar", "a b c a b c a b c", max_new_tokens=60)
    text = looping.decode(ref)
    stop = text[len(text) // 2:len(text) // 2 + 3]
    req = dict(max_new_tokens=60, stop=[stop])
    want = "".join(s.text for s in get("ar").stream(looping, Request(prompt="a b c a b c a b c", **req)))
    for name in ["pld", "lookahead"]:
        got = "".join(s.text for s in get(name).stream(looping, Request(prompt="a b c a b c a b c", **req)))
        assert got == want and stop not in got


def test_parameters_are_validated(target):
    for name, params in [("sps", {"k": 0}), ("sps", {"k": 17}), ("sps", {"adaptive": "yes"}), ("sps", {"draft": 3}),
                         ("pld", {"max_ngram": 0}), ("pld", {"num_pred": 1.5}), ("lookahead", {"window": 0}),
                         ("lookahead", {"ngram": 1}), ("lookahead", {"bogus": 1})]:
        with pytest.raises(RequestError):
            list(get(name).stream(target, Request(prompt="hi", params=params)))


def test_draft_model_loading_and_availability(target, tmp_path, monkeypatch):
    sps = get("sps")
    bare = copy.copy(target)
    bare.extras = {}
    bare.profile = dataclasses.replace(bare.profile, draft=tmp_path / "no-draft-here")
    assert sps.available(bare) == (False, "train it: python -m paradec train draft --model MODEL")
    with pytest.raises(ModelError, match="python -m paradec train draft"):
        list(sps.stream(bare, Request(prompt="hi")))
    # a draft folder given by path: loaded once with Engine.load, cached, usable
    d = random_engine(3)
    d.model.save_pretrained(tmp_path / "d")
    d.tokenizer.save_pretrained(tmp_path / "d")
    req = dict(max_new_tokens=20, ignore_eos=True)
    ref, _ = run(bare, "ar", PROMPTS[0], **req)
    got, steps = run(bare, "sps", PROMPTS[0], params={"draft": str(tmp_path / "d")}, **req)
    assert got == ref and sum(s.draft_passes for s in steps) > 0
    loaded = bare.extras["drafts"][str(tmp_path / "d")]
    assert speculative.draft_model(bare, Request(prompt="x", params={"draft": str(tmp_path / "d")})) is loaded
    # the shipped draft location, when present, is loaded into engine.extras['draft']
    bare.profile = dataclasses.replace(bare.profile, draft=tmp_path / "d")
    assert sps.available(bare) == (True, "")
    assert bare.extras["draft"].name == "d"
    # a draft with another tokenizer is refused with the reason
    odd = random_engine(4)
    odd.tokenizer = copy.deepcopy(odd.tokenizer)
    odd.tokenizer.add_tokens(["<not-in-the-target>"])
    mismatched = copy.copy(target)
    mismatched.extras = {"draft": odd}
    ok, why = sps.available(mismatched)
    assert not ok and "different tokenizer" in why
    with pytest.raises(ModelError, match="different tokenizer"):
        list(sps.stream(mismatched, Request(prompt="hi")))


def test_fit_vocab_pads_with_zero_probability():
    lg = torch.tensor([[1.0, 2.0, 3.0]])
    padded = speculative.fit_vocab(lg, 5)
    assert padded.shape == (1, 5) and torch.isinf(padded[0, 3:]).all()
    assert process(padded, SamplingParams(1.0))[0, 3:].sum() == 0
    assert speculative.fit_vocab(lg, 2).tolist() == [[1.0, 2.0]]
