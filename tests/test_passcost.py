"""Measured pass costs (paradec/passcost.py) and ptp's choice of (k, branches) from them and a decoding profile."""
import json

import pytest
import torch

from paradec import passcost
from paradec import ptp as P
from paradec.strategies import Request, get
from paradec.strategies.ptp import PROFILE, pick_config, plan
from paradec.testing import random_engine


def test_cost_at_interpolates_between_and_extends_beyond_the_measured_widths():
    costs = {1: 1.0, 8: 1.7, 16: 3.3}
    assert passcost.cost_at(costs, 8) == 1.7
    assert passcost.cost_at(costs, 12) == pytest.approx(2.5)
    assert passcost.cost_at(costs, 4) == pytest.approx(1.3)
    assert passcost.cost_at(costs, 20) == pytest.approx(4.1)          # the last segment's slope
    assert passcost.cost_at({4: 2.0}, 8) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        passcost.cost_at({}, 3)


def test_pass_costs_are_measured_once_per_key_and_width():
    e = random_engine(5)
    calls = []
    real = e.forward

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)
    e.forward = counting
    first = passcost.pass_costs(e, [1, 4, 8], repeats=2)
    assert set(first) == {1, 4, 8} and all(0 < v < 10 for v in first.values())
    n = len(calls)
    assert n == 1 + 3 * 2                                  # the context, then 2 rounds of 3 widths
    again = passcost.pass_costs(e, [4, 8, 12], repeats=2)
    assert again[4] == first[4] and again[8] == first[8] and 12 in again
    assert len(calls) - n == 1 + 2                         # only the new width was timed
    gated = []
    passcost.pass_costs(e, [4], key="other", gate=lambda w: _noting(gated, w), repeats=1)
    assert gated == [4]                                    # another key measures again, inside its gate


class _noting:
    def __init__(self, seen, w):
        seen.append(w)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_pick_config_weighs_tokens_per_pass_against_the_pass_costs():
    wide = {"k": 3, "branches": 2, "tokens_per_pass": 2.0, "widths": {"12": 90, "5": 10}}
    narrow = {"k": 3, "branches": 1, "tokens_per_pass": 1.8, "widths": {"8": 80, "5": 20, "30": 1}}
    flat = pick_config([wide, narrow], lambda w: 0.06)                  # a pass costs the same at any width
    assert (flat["k"], flat["branches"]) == (3, 2) and flat["tok_s"] == pytest.approx(2.0 / 0.06, rel=1e-3)
    steep = pick_config([wide, narrow], lambda w: 0.05 + 0.004 * w)       # every position costs 4 ms more
    assert (steep["k"], steep["branches"]) == (3, 1)
    # the width seen in 1 of 101 passes is left out of the mean (MIN_SHARE): 0.8 * 0.082 + 0.2 * 0.07
    assert steep["pass_ms"] == pytest.approx((0.8 * 0.082 + 0.2 * 0.07) * 1000, rel=1e-3)


def test_ptp_on_auto_takes_the_profiles_configuration_measured_here_and_stays_lossless(tmp_path):
    e = random_engine(0)
    if e.device.type != "cpu":
        pytest.skip("ptp plans its passes on a CPU only (a GPU takes every branch)")
    torch.manual_seed(0)
    ad = P.PTPAdapter.for_model(e.model, rank=4, block=6)
    with torch.no_grad():
        for b in ad.lora_b.values():
            b.normal_(std=0.2)
    ad.save(tmp_path)
    configs = [{"k": 2, "branches": 1, "tokens_per_pass": 1.5, "widths": {"6": 10, "4": 3}},
               {"k": 5, "branches": 6, "tokens_per_pass": 1.6, "widths": {"42": 10, "7": 3}},
               {"k": 9, "branches": 1, "tokens_per_pass": 9.0, "widths": {"20": 10}}]      # k > block - 1: out
    (tmp_path / PROFILE).write_text(json.dumps({"configs": configs}))
    loaded = P.PTPAdapter.load(tmp_path, e.model, name=e.name)
    assert loaded.folder == tmp_path
    e.extras["ptp"] = loaded
    req = dict(prompt="def add(a, b):\n", max_new_tokens=24, ignore_eos=True)
    steps = list(get("ptp").stream(e, Request(**req)))
    chosen = steps[0].info["plan"]
    costs = e.extras["pass_costs"][f"ptp-{id(loaded)}"]
    assert set(costs) == {4, 6, 7, 42}                     # the kept configurations' widths, measured here
    want = pick_config(configs[:2], lambda w: passcost.cost_at(costs, w))
    assert (chosen["k"], chosen["branches"]) == (want["k"], want["branches"])
    assert all(s.info["k"] <= chosen["k"] and s.info["branches"] <= chosen["branches"] for s in steps)
    ar = [t for s in get("ar").stream(e, Request(**req)) for t in s.token_ids]
    assert [t for s in steps for t in s.token_ids] == ar
    assert plan(e, loaded) is chosen                       # chosen once per engine and adapter
    from paradec.bench import result_row
    from paradec.race import run_alone
    row = result_row(run_alone(e, "ptp", Request(**req)), Request(**req), item_key="x", category="c")
    assert row["meta"]["plan"] == chosen                   # a benchmark stores what it chose
    fixed = list(get("ptp").stream(e, Request(**req, params={"k": 1})))
    assert "plan" not in fixed[0].info and all(s.info["k"] <= 1 for s in fixed)   # explicit k: no plan
