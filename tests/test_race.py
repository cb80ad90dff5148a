"""The race runner: interleaved steps, per-strategy compute clocks, stop, replay, figures."""
import threading

from paradec.metrics import TimedStep, figures, percentile
from paradec.race import Race, first_divergence, run_alone
from paradec.strategies import REGISTRY, Request
from paradec.strategies.autoregressive import Autoregressive

from conftest import random_engine


def test_race_interleaves_and_matches_alone(tiny_engine):
    req = Request(prompt="Outline the module `json`.", max_new_tokens=40, ignore_eos=True)
    race = Race(tiny_engine, req, ["ar", "hf-generate", ("ar", {})][:2]).start()
    order = [ev["lane"] for ev in race.events(timeout=120) if ev["type"] == "step"]
    snap = race.snapshot()
    assert snap["ar"]["status"] == "done" and snap["hf-generate"]["status"] == "done"
    assert snap["ar"]["tokens"] == 40 and snap["ar"]["forward_passes"] == 40
    # hf-generate is one big step; ar's steps come before and after it: they interleaved
    i = order.index("hf-generate")
    assert 0 < i < len(order) - 1 and order.count("ar") == 40
    alone = run_alone(tiny_engine, "ar", req)
    assert alone.token_ids == snap["ar"]["token_ids"]
    assert snap["hf-generate"]["diverges_at"] is None   # identical greedy output
    assert snap["hf-generate"]["speedup"] is not None
    sched = race.replay_schedule()
    assert [t for t, _, _ in sched] == sorted(t for t, _, _ in sched)
    assert sum(1 for _, n, _ in sched if n == "ar") == 40


def test_each_lane_clock_is_its_own(monkeypatch):
    """Two identical strategies in one race get (roughly) equal clocks and equal step counts: every step goes to
    the lane furthest behind on its own compute clock, so while both run their clocks never drift apart by more
    than one step's time, and both do exactly the work each would do alone."""
    class Twin(Autoregressive):
        name = "ar-twin"

    monkeypatch.setitem(REGISTRY, "ar-twin", Twin)
    big = random_engine(3, hidden=128, layers=4)
    req = Request(prompt="import os", chat=False, max_new_tokens=30, ignore_eos=True)
    race = Race(big, req, ["ar", "ar-twin"]).start()
    clock, running, longest, checked = {"ar": 0.0, "ar-twin": 0.0}, {"ar", "ar-twin"}, 0.0, 0
    for ev in race.events(timeout=120):
        if ev["type"] == "end":
            running.discard(ev["lane"])
        if ev["type"] != "step":
            continue
        me = ev["lane"]
        other = "ar-twin" if me == "ar" else "ar"
        dt = ev["figures"]["elapsed_s"] - clock[me]
        if other in running:
            assert clock[me] <= clock[other], "a step went to the lane that was ahead"
            checked += 1
        clock[me] = ev["figures"]["elapsed_s"]
        longest = max(longest, dt)
        if other in running:
            assert abs(clock[me] - clock[other]) <= longest + 1e-9
    lanes = race.lanes
    assert checked >= 30
    for lane in lanes.values():
        f = lane.figures()
        assert lane.status == "done" and len(lane.steps) == 30 and f.tokens == 30 and f.forward_passes == 30
        assert f.ttft_s <= f.elapsed_s and f.tpot_s > 0
    assert lanes["ar"].token_ids == lanes["ar-twin"].token_ids


def test_stop_one_and_all():
    e = random_engine(4)
    req = Request(prompt="hello", max_new_tokens=400, ignore_eos=True)
    race = Race(e, req, ["ar"]).start()
    seen = 0
    for ev in race.events(timeout=120):
        if ev["type"] == "step":
            seen += 1
            if seen == 5:
                race.stop()
    snap = race.snapshot()
    assert snap["ar"]["status"] == "stopped" and 5 <= snap["ar"]["tokens"] < 400


def test_bad_strategy_is_an_error_event_not_a_crash(tiny_engine):
    race = Race(tiny_engine, Request(prompt="hi", max_new_tokens=3), ["ar", "nope"])
    lanes = race.run()
    assert lanes["nope"].status == "error" and "unknown strategy" in lanes["nope"].error
    assert lanes["ar"].status == "done"


def test_events_are_readable_from_another_thread(tiny_engine):
    race = Race(tiny_engine, Request(prompt="hi", max_new_tokens=20, ignore_eos=True), ["ar"])
    got = []
    t = threading.Thread(target=lambda: got.extend(race.events(timeout=60)))
    t.start()
    race.start()
    t.join(60)
    assert got[-1]["type"] == "done" and sum(1 for g in got if g["type"] == "step") == 20


def test_figures_definitions():
    steps = [TimedStep(0.5, 0.5, 1, forward_passes=1), TimedStep(0.6, 0.1, 3, forward_passes=1, drafted=4,
                                                                   accepted=2),
             TimedStep(0.8, 0.2, 0, forward_passes=1), TimedStep(1.0, 0.2, 2, forward_passes=1)]
    f = figures(steps)
    assert f.tokens == 6 and f.ttft_s == 0.5 and f.elapsed_s == 1.0
    assert abs(f.tpot_s - (1.0 - 0.5) / 5) < 1e-12
    assert abs(f.tokens_per_pass - 6 / 4) < 1e-12 and f.acceptance == 0.5
    # ITL: gap divided by the tokens that arrived together
    assert [round(x, 6) for x in f.itl] == [round(0.1 / 3, 6)] * 3 + [0.2] * 2
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None and first_divergence([1, 5], [1, 2]) == 1


def test_cli_race_gives_each_lane_the_parameters_its_strategy_has(tiny_engine):
    """`race --param num_pred=3` with ar and pld: pld gets it, ar (which has no parameters and refuses unknown
    ones) does not; a key no lane's strategy declares is refused before anything runs."""
    import pytest

    from paradec.cli import split_params
    req = Request(prompt="def f(x):", chat=False, max_new_tokens=8, params={"num_pred": 3})
    bare, per = split_params(req, ["ar", "pld"])
    assert bare.params == {} and per == {"ar": {}, "pld": {"num_pred": 3}}
    lanes = Race(tiny_engine, bare, ["ar", "pld"], per).run()
    assert lanes["ar"].status == "done" and lanes["pld"].status == "done"
    assert lanes["pld"].params == {"num_pred": 3}
    with pytest.raises(SystemExit, match="none of ar, pld has this parameter"):
        split_params(Request(prompt="x", params={"nope": 1}), ["ar", "pld"])
    assert split_params(Request(prompt="x"), ["ar"])[1] == {}
