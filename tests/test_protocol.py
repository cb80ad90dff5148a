"""The explicit protocol and the hot path.

Protocol: control flags are typed fields (`Request.skeleton`, `Step.stage` / `planning` / `answer`, the
`long_ok` of a length check), never underscore keys in the user's parameters; every strategy starts from one
shared set-up (`Strategy.begin` -> `Run`); the server encodes a prompt once. Hot path: all candidates of a step
verified in one batched pick, rejection sampling's accept tests read back at once, tree masks' static blocks
built once, logits kept in the model dtype until the rows needed are chosen - each equal to what it replaced.
"""
import dataclasses
import gc
import random

import pytest
import torch

from paradec import server, verification
from paradec.decoding import pick_token
from paradec.engine import Engine
from paradec.race import run_alone
from paradec.remote import RemoteEngine, VllmSpec
from paradec.sampling import SamplingParams, UStream, pick, process
from paradec.strategies import REGISTRY, Param, Request, RequestError, Step, Strategy, get, load_all
from paradec.strategies import base
from paradec.strategies.base import Run
from paradec.strategies.lookahead import layout as lookahead_layout, window_mask
from paradec.strategies.ptp import layout as ptp_layout
from paradec.testing import random_engine

QUESTION = "What are the benefits of regular exercise?"
POINTS = ["Better heart health", "Improved mood", "Stronger muscles"]
SAMPLED = SamplingParams(0.8, 20, 0.9)


# ---------------------------------------------------------------------------------------------- protocol
def test_no_strategy_takes_an_underscore_parameter():
    load_all()
    for name in REGISTRY:
        for key in ("_long_ok", "_skeleton", "_x"):
            with pytest.raises(RequestError, match="unknown parameter"):
                get(name).resolve_params(Request(prompt="x", params={key: True}))


def test_long_prompts_pass_only_the_length_check_that_allows_them(tiny_engine):
    req = Request(prompt="word " * 600, max_new_tokens=5)
    with pytest.raises(RequestError, match="context"):
        req.validate(tiny_engine)
    assert len(req.validate(tiny_engine, long_ok=True)) > tiny_engine.context_length
    with pytest.raises(RequestError, match="context"):
        next(get("ar").stream(tiny_engine, req))
    with pytest.raises(RequestError, match="skeleton"):
        Request(prompt="x", skeleton=[1, 2]).validate()


def test_every_strategy_starts_from_the_shared_set_up(tiny_engine):
    seen: list[Run] = []

    class Probe(Strategy):
        name = "probe"
        params = {"n": Param(2, int, 1, 5)}

        def steps(self, run):
            seen.append(run)
            yield run.out.step(run.ids[-run.params["n"]:])

    req = Request(prompt="def f(x):", max_new_tokens=8, ignore_eos=True)
    gen = Probe().stream(tiny_engine, dataclasses.replace(req, max_new_tokens=0))
    assert not seen                                   # nothing runs before the first next() (the timed region)
    with pytest.raises(RequestError, match="max_new_tokens"):
        next(gen)
    steps = list(Probe().stream(tiny_engine, req))
    run = seen[-1]
    assert run.ids == tiny_engine.encode(req) and run.params == {"n": 2} and run.us is None
    assert run.engine.cache_len(run.cache) == 0 and run.out.ids == steps[0].token_ids == run.ids[-2:]
    list(Probe().stream(tiny_engine, dataclasses.replace(req, temperature=0.7, seed=4)))
    assert isinstance(seen[-1].us, UStream) and seen[-1].us[0] == UStream(4)[0]


def test_the_server_encodes_a_prompt_once(tiny_engine, monkeypatch):
    calls = []
    real = tiny_engine.encode
    monkeypatch.setattr(tiny_engine, "encode", lambda request: calls.append(1) or real(request))
    for kind, body in (("completions", {"prompt": "def f(x):", "paradec": {"strategy": "pld"}}),
                       ("chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                                 "paradec": {"strategy": "ar"}})):
        calls.clear()
        name, req, _, _ = server.build_request(body, kind, tiny_engine)   # no max_tokens: it encodes
        strategy, n = server.prepare(name, req, tiny_engine)
        steps = list(strategy.stream(tiny_engine, req))
        assert steps and n == len(real(req)) and len(calls) == 1, (kind, body, len(calls))
    calls.clear()
    next(get("ar").stream(tiny_engine, dataclasses.replace(req, prompt="other")))   # a copy encodes its own
    req.messages = [{"role": "user", "content": "changed"}]
    req.prompt_ids(tiny_engine)                                                     # so does a changed prompt
    assert len(calls) == 2
    assert Request(**req.__dict__) == req and "engine" not in str(dataclasses.asdict(req))   # the memo is no field
    key = id(req)
    assert key in base._ENCODED
    del req
    gc.collect()
    assert key not in base._ENCODED                                                 # and it goes with its request


def test_the_server_refuses_private_flags(tiny_engine):
    for params in ({"_long_ok": True}, {"_skeleton": "1. a\n2. b"}, {"skeleton": "1. a\n2. b"}):
        name, req, _, _ = server.build_request({"prompt": "hi", "max_tokens": 4,
                                                "paradec": {"strategy": "sot", "params": params}},
                                               "completions", tiny_engine)
        assert req.skeleton is None
        with pytest.raises(server.ApiError, match="unknown parameter"):
            server.prepare(name, req, tiny_engine)


def test_sot_steps_carry_stage_planning_and_answer_as_fields(tiny_engine):
    given = list(get("sot").stream(tiny_engine, Request(prompt=QUESTION, max_new_tokens=24, skeleton=POINTS)))
    assert given[-1].answer.startswith("1. Better heart health") and given[-1].info["point_tokens"]
    assert {s.stage for s in given} <= {"expand-prefix", "expand"} and not any(s.planning for s in given)
    assert all(s.answer is None for s in given[:-1])
    model = list(get("sot").stream(tiny_engine, Request(prompt=QUESTION, max_new_tokens=12)))
    sk = [s for s in model if s.stage == "skeleton"]
    assert sk and all(s.planning and s.segment == 0 for s in sk)
    for s in given + model:
        assert not {"stage", "answer"} & set(s.info)
    lane = run_alone(tiny_engine, "sot", Request(prompt=QUESTION, max_new_tokens=12))
    assert lane.status == "done" and lane.planning_segments == {0}
    assert lane.token_ids == [t for s in model if not s.planning for t in s.token_ids]
    assert lane.text == model[-1].answer and lane.stage == [s.stage for s in model if s.stage][-1]
    fig = server._step_figures(Step(stage="skeleton", planning=True, answer="a", info={"k": 1}))
    assert fig["stage"] == "skeleton" and fig["planning"] is True and fig["answer"] == "a" and fig["info"] == {"k": 1}


def test_remote_lossless_flags_come_from_the_strategies():
    load_all()
    for name, cls in REGISTRY.items():
        assert RemoteEngine.lossless(name) is cls.lossless
    assert RemoteEngine.lossless(VllmSpec.name) is VllmSpec.lossless is True
    assert RemoteEngine.lossless("no-such") is False


# ---------------------------------------------------------------------------------------------- hot path
def test_picks_equal_row_by_row_targets():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(12, 300, generator=g) * 3
    us = UStream(3)
    rows, positions = [3, 0, 7, 7, 11], [5, 6, 9, 2, 4]
    for sp in (SamplingParams(), SAMPLED, SamplingParams(1.3)):
        want = [verification.target_tokens(logits[r:r + 1], sp, None if sp.greedy else us, p)[0]
                for r, p in zip(rows, positions)]
        assert verification.picks(logits, rows, positions, sp, None if sp.greedy else us) == want
        bf = logits.bfloat16()      # model-dtype logits pick exactly what their float32 copy picks
        assert (verification.picks(bf, rows, positions, sp, us)
                == verification.picks(bf.float(), rows, positions, sp, us))


def _longest_reference(cands, rows, sp, us, start):
    """The old per-candidate verification: one coupled() (one pick, one read-back) per candidate."""
    best, best_v = -1, None
    for c, (cand, lg) in enumerate(zip(cands, rows)):
        v = verification.coupled(cand, lg, sp, us, start)
        if best_v is None or v.accepted > best_v.accepted:
            best, best_v = c, v
    return best, best_v


def test_batched_candidate_verification_equals_one_candidate_at_a_time():
    rnd = random.Random(1)
    for trial in range(40):
        V, P = 12, rnd.randint(1, 3)
        sp = (SamplingParams(), SAMPLED)[trial % 2]
        us = None if sp.greedy else UStream(trial)
        cands = [[rnd.randrange(V) for _ in range(rnd.randint(1, 4))] for _ in range(rnd.randint(1, 5))]
        T = P + sum(map(len, cands))
        logits = torch.randn(T, V, generator=torch.Generator().manual_seed(trial))
        at, pos = [], P
        for c in cands:
            at.append(pos)
            pos += len(c)
        for c, a in zip(cands, at):     # make some candidates (partly) right, so acceptance varies
            t = verification.target_tokens(logits[[P - 1] + list(range(a, a + len(c)))], sp, us, 7)
            keep = rnd.randint(0, len(c))
            c[:keep] = t[:keep]
        rows, positions = verification.candidate_rows(P - 1, at, cands, 7)
        got = verification.longest(cands, verification.picks(logits, rows, positions, sp, us))
        ref = _longest_reference(cands, [logits[[P - 1] + list(range(a, a + len(c)))] for c, a in zip(cands, at)],
                                 sp, us, 7)
        assert got[0] == ref[0] and got[1] == ref[1], trial
    assert verification.longest([], [5]) == (-1, verification.Verdict([5], 0))


def _rejection_reference(draft, draft_probs, logits, sp, rng):
    """The old rejection sampling: two read-backs per draft token and one for the residual's sum."""
    p = process(logits, sp)
    q = draft_probs.reshape(-1, p.shape[-1]).to(p.device, torch.float32)
    for i, x in enumerate(map(int, draft)):
        px, qx = float(p[i, x]), float(q[i, x])
        if qx > 0 and rng.uniform() < min(1.0, px / qx):
            continue
        residual = (p[i] - q[i]).clamp_min(0)
        if float(residual.sum()) <= 0:
            residual = p[i]
        return verification.Verdict([int(t) for t in draft[:i]] + [rng.sample(residual)], i)
    return verification.Verdict([int(t) for t in draft] + [rng.sample(p[len(draft)])], len(draft))


def test_rejection_reads_back_once_and_decides_as_before():
    V = 16
    for trial in range(60):
        g = torch.Generator().manual_seed(trial)
        k = trial % 5
        logits = torch.randn(k + 1, V, generator=g) * 2
        p = process(logits, SAMPLED)
        kind = trial % 3
        q = p[:k].clone() if kind == 0 else process(torch.randn(k, V, generator=g) * 2, SAMPLED)   # q == p: residual 0
        draft = [int(torch.multinomial(q[i], 1, generator=g)) for i in range(k)]
        zero = (p[0] == 0).nonzero().flatten().tolist() if k else []
        if kind == 0 and zero:
            draft[0] = zero[0]                      # outside p's (and q's) support: rejected, residual 0, p used
        if kind == 2 and k:
            q[0, draft[0]] = 0.0                    # a draft token its own q gave no mass: rejected at once
        a, b = verification.Rng(trial), verification.Rng(trial)
        got = verification.rejection(draft, q, logits, SAMPLED, a)
        assert got == _rejection_reference(draft, q, logits, SAMPLED, b), trial
        assert a.uniform() == b.uniform()           # the same random draws were spent


def _lookahead_allowed_reference(P, W, L, lens):
    """The old mask: built entry by entry on every pass."""
    T = P + W * L + sum(lens)
    allowed = torch.zeros(T, T, dtype=torch.bool)
    allowed[:, :P] = True
    allowed[:P, :P] = torch.ones(P, P, dtype=torch.bool).tril()
    for l in range(L):
        for j in range(W):
            r = P + l * W + j
            allowed[r, P:P + j + 1] = True
            allowed[r, [P + m * W + j for m in range(1, l + 1)]] = True
    at = P + W * L
    for n in lens:
        allowed[at:at + n, at:at + n] = torch.ones(n, n, dtype=torch.bool).tril()
        at += n
    return allowed


def test_lookahead_masks_from_static_blocks_equal_the_entrywise_mask():
    for P, W, L, lens in ((1, 5, 1, []), (1, 5, 2, [2, 2, 1]), (3, 4, 3, [3]), (2, 1, 2, [1, 4]), (4, 0, 0, [2])):
        levels = [[9] * W for _ in range(L)]
        cands = [[7] * n for n in lens]
        _, _, allowed, _, _ = lookahead_layout([1] * P, 10, levels, cands)
        assert torch.equal(allowed, _lookahead_allowed_reference(P, W, L, lens)), (P, W, L, lens)
    assert window_mask(5, 2) is window_mask(5, 2)


def test_ptp_layouts_are_built_once_per_shape():
    a, b = ptp_layout(4, 2, [0, 2], 3), ptp_layout(4, 2, (0, 2), 3)
    assert all(x is y for x, y in zip(a, b))
    assert ptp_layout(4, 2, [0, 2], 3, torch.device("cpu"))[0] is a[0]


def test_model_dtype_logits_decode_as_float32_logits_did():
    """`ar` keeps a bf16 model's logits in bf16 (no full-vocabulary copy): the same tokens, greedy and sampled,
    as decoding from the float32 upcast of every pass."""
    base = random_engine(3)
    e = Engine(base.model.to(torch.bfloat16), base.tokenizer, name="random-3-bf16")
    assert e.dtype == torch.bfloat16
    for temperature in (0.0, 0.9):
        req = Request(prompt="def add(a, b):", max_new_tokens=20, ignore_eos=True, temperature=temperature, seed=2)
        got = [t for s in get("ar").stream(e, req) for t in s.token_ids]
        us = None if req.sampling.greedy else UStream(req.seed)
        cache, want = e.new_cache(), []
        logits = e.forward(e.encode(req), cache, logits_to_keep=1)[0, -1]
        assert logits.dtype == torch.float32
        while len(want) < req.max_new_tokens:
            want.append(pick_token(logits, req.sampling, us, len(want)))
            logits = e.forward([want[-1]], cache, logits_to_keep=1)[0, -1]
        assert got == want, temperature


def test_pick_of_model_dtype_rows_is_exact():
    g = torch.Generator().manual_seed(5)
    lg = (torch.randn(4, 1000, generator=g) * 4).bfloat16()
    u = torch.rand(4, generator=g, dtype=torch.float64)
    assert torch.equal(pick(process(lg, SAMPLED), u), pick(process(lg.float(), SAMPLED), u))
    assert torch.equal(process(lg, SamplingParams()), process(lg.float(), SamplingParams()))
