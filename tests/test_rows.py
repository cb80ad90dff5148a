"""One path from a finished lane to a stored row: the row builder (`paradec.bench.result_row`) that bench, the
Arena and the long-context eval use, the one quality schema (old rows read into it by the store), and the one
speed-up table with its rule for 'all' (bench's Markdown, the Dashboard, the Eval sets tab)."""
from __future__ import annotations

import json
import sqlite3
import sys

import pandas as pd
import pytest

from conftest import ROOT
from paradec import bench as B
from paradec import quality
from paradec.metrics import ALL, speedup
from paradec.race import run_alone
from paradec.store import RESULT_FIELDS, Store
from paradec.strategies import Request
from paradec.ui import charts

sys.path.insert(0, str(ROOT))

REQ = Request(prompt="def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n", chat=False, max_new_tokens=12,
              ignore_eos=True)


def test_a_lanes_row_carries_its_figures_and_the_one_quality_schema(tiny_engine):
    ar = run_alone(tiny_engine, "ar", REQ)
    pld = run_alone(tiny_engine, "pld", REQ)
    row = B.result_row(pld, REQ, item_key=7, category="code", repeat=1, turn=0, ar=(ar.token_ids, ar.text),
                       reference=["no such text", ar.text], engine=tiny_engine, perplexity=True, params={"k": 1})
    f = pld.figures()
    assert set(row) <= RESULT_FIELDS and row["item_key"] == "7" and row["strategy"] == "pld"
    assert (row["n_tokens"], row["forward_passes"], row["e2e_s"], row["tokens_per_s"], row["itl"]) == \
        (f.tokens, f.forward_passes, f.elapsed_s, f.tokens_per_s, f.itl)
    assert row["token_ids"] == ar.token_ids and row["text"] == ar.text and row["params"] == {"k": 1}
    q = row["quality"]
    assert q["exact_match"] is True and q["diverges_at"] is None and "first_mismatch" not in q
    assert q["lossless_strategy"] is True and q["status"] == "done" and q["finish_reason"] == "length"
    assert q["rouge_l_vs_ar"] == 1.0 and q["rouge_l_vs_ref"] == 1.0 and q["contains_ref"] is not None
    assert q["perplexity"] > 0
    # ar's own row is not compared with itself; a lane that failed keeps its state but no comparison
    own = B.result_row(ar, REQ, item_key="7", category="code", ar=(ar.token_ids, ar.text))["quality"]
    assert "exact_match" not in own and "rouge_l_vs_ar" not in own and own["lossless_strategy"] is True
    bad = run_alone(tiny_engine, "pld", Request(prompt="x", params={"nonsense": 1}))
    failed = B.result_row(bad, REQ, item_key="7", category="code", ar=(ar.token_ids, ar.text))
    assert failed["error"] and failed["quality"] == {"lossless_strategy": True, "status": "error",
                                                     "finish_reason": None}
    # a divergence is an index; a peer lane is never a lossless mismatch; task scores ride along
    other = B.result_row(pld, REQ, item_key="7", category="code", ar=(ar.token_ids[:3] + [ar.token_ids[3] + 1], ar.text), peer=True,
                         scores={"correct": True})["quality"]
    assert other["exact_match"] is False and other["diverges_at"] == 3 and other["lossless_strategy"] is False
    assert other["correct"] is True


def test_a_lossless_mismatch_carries_the_models_margin_where_it_diverged(tiny_engine):
    """A lossless lane whose greedy ids differ from ar's gets `divergence`: at the first differing token, the
    model's logit of ar's (greedy) token minus the other's, from one scoring pass; bench's Markdown lists it."""
    import torch
    ar = run_alone(tiny_engine, "ar", REQ)
    pld = run_alone(tiny_engine, "pld", REQ)
    at = 5
    fake_ar = ar.token_ids[:at] + [(ar.token_ids[at] + 1) % len(tiny_engine.tokenizer)] + ar.token_ids[at + 1:]
    row = B.result_row(pld, REQ, item_key="x", category="code", ar=(fake_ar, ar.text), engine=tiny_engine)
    q = row["quality"]
    assert q["exact_match"] is False and q["diverges_at"] == at
    d = q["divergence"]
    logits = tiny_engine.forward(tiny_engine.encode(REQ) + ar.token_ids[:at], logits_to_keep=1)[0, -1].float()
    assert d["at"] == at and d["logit_margin"] == pytest.approx(float(logits[fake_ar[at]] - logits[ar.token_ids[at]]),
                                                                 abs=1e-4)
    assert d["logit_margin"] < 0 and d["p_other"] > d["p_ar"]      # the lane kept the model's greedy token
    assert int(torch.argmax(logits)) == ar.token_ids[at]
    text = B.mismatch_lines(pd.DataFrame([{**row, "turn": 0}]))
    assert "pld, item x (turn 0): first differs at token 5: logit margin -" in text
    # identical answers, and a peer's difference, carry none
    same = B.result_row(pld, REQ, item_key="x", category="code", ar=(ar.token_ids, ar.text), engine=tiny_engine)
    assert "divergence" not in same["quality"]
    peer = B.result_row(pld, REQ, item_key="x", category="code", ar=(fake_ar, ar.text), engine=tiny_engine, peer=True)
    assert "divergence" not in peer["quality"] and B.mismatch_lines(pd.DataFrame([{**peer, "turn": 0}])) == ""


def test_text_only_comparison_and_old_rows_in_the_new_schema():
    q = quality.quality_row("same", [0, 0], ar_text="same", ar_ids=[1, 2], text_only=True)
    assert q["exact_match"] is True and "diverges_at" not in q
    new = {"exact_match": False, "diverges_at": 4, "rouge_l_vs_ar": 0.5}
    assert quality.normalise(new) is new and quality.normalise(None) is None and quality.normalise({}) == {}
    arena_old = {"exact_match": False, "diverges_at": 4, "first_mismatch": 4, "status": "done"}
    assert quality.normalise(arena_old) == {"exact_match": False, "diverges_at": 4, "status": "done"}
    assert quality.normalise({"exact_match": 0.0, "first_mismatch": 2}) == {"exact_match": False, "diverges_at": 2}
    assert quality.normalise({"exact_match": 1.0, "bleu_vs_ar": 100.0}) == \
        {"exact_match": True, "diverges_at": None, "bleu_vs_ar": 100.0}


def test_the_store_reads_old_rows_in_the_new_schema_and_leaves_the_file_alone(tmp_path):
    db = tmp_path / "old.db"
    store = Store(db)
    rid = store.create_run("race", name="old arena run", strategies=["ar", "pld"])
    store.add_result(rid, item_key="arena", category="arena", strategy="ar", tokens_per_s=10.0,
                     quality={"lossless_strategy": True, "status": "done", "finish_reason": "length"})
    old = {"lossless_strategy": True, "status": "done", "exact_match": False, "diverges_at": 2, "first_mismatch": 2}
    store.add_result(rid, item_key="arena", category="arena", strategy="pld", tokens_per_s=20.0, quality=old)
    store.add_result(rid, item_key="q", category="arena", strategy="pld", quality={"exact_match": 1.0})
    rows = {r["item_key"]: r for r in store.get_results(rid) if r["strategy"] == "pld"}
    assert rows["arena"]["quality"] == {"lossless_strategy": True, "status": "done", "exact_match": False,
                                        "diverges_at": 2}
    assert rows["q"]["quality"] == {"exact_match": True, "diverges_at": None}
    assert store.get_result(rid, "q", "pld")["quality"]["exact_match"] is True
    df = store.results_dataframe(rid)
    assert "q_first_mismatch" not in df and df.loc[df.item_key == "q", "q_exact_match"].item() is True
    # the old mismatch counts as one in the one table, as it did
    t = {(r["category"], r["strategy"]): r for r in B.table(df)}
    assert t[("arena", "pld")]["lossless_mismatches"] == 1 and t[(ALL, "pld")]["speedup"] == 2.0
    store.close()
    with sqlite3.connect(db) as c:                  # read, never rewritten
        stored = [json.loads(q) for (q,) in c.execute("select quality from results where strategy='pld'")]
    assert old in stored and {"exact_match": 1.0} in stored


def _frame() -> pd.DataFrame:
    rows = []
    for run, cats in ((1, ("code",)), (2, ("code", "prose"))):
        for i, cat in enumerate(cats * 2):
            for s, tps in (("ar", 10.0), ("pld", 20.0 + i), ("sot", float("nan") if i == 0 else 15.0)):
                rows.append({"run_id": run, "item_key": f"{cat}{i}", "repeat": 0, "turn": 0, "category": cat,
                             "strategy": s, "tokens_per_s": tps, "e2e_s": 1.0, "error": None,
                             "quality": {"lossless_strategy": s == "pld"}})
    return pd.DataFrame(rows)


def test_one_speedup_table_and_one_rule_for_all():
    """bench's table (its Markdown, the Dashboard's summary) and the Dashboard's speed-up chart hold the same
    speed-ups; every run has 'all', also a run of one category; a missing (NaN) tokens/s is left out."""
    df = _frame()
    rows = B.table(df)
    assert [(r["run"], r["category"]) for r in rows if r["strategy"] == "ar"] == \
        [(1, "code"), (1, ALL), (2, "code"), (2, "prose"), (2, ALL)]
    sp = charts.speedup_table(df)
    want = {(r["run"], r["category"], r["strategy"]): r["speedup"] for r in rows if r["strategy"] != "ar"}
    assert {(r.run_id, r.category, r.strategy): r.speedup for r in sp.itertuples()} == want
    one = {r["strategy"]: r for r in rows if r["run"] == 1}
    assert one["pld"]["speedup"] == pytest.approx(2.05) and one["sot"]["speedup"] == pytest.approx(1.5)
    assert speedup([20.0, float("nan"), None, 0], [10.0]) == 2.0 and speedup([float("nan")], [1.0]) is None
    shown = charts.filter_results(df.assign(run_created_at=pd.Timestamp("2026-01-01")), strategies=["pld"])
    assert set(charts.speedup_table(shown)["strategy"]) == {"pld"}
    bar = charts.speedup_bar(df)
    assert {c for tr in bar.data for c in tr.x} == {"code", "prose", ALL}


def test_the_long_context_baseline_is_a_timed_lane(tiny_engine, tmp_path):
    from evals import longcontext_eval as lc
    req = Request(prompt="word " * 2000, chat=False, max_new_tokens=4, ignore_eos=True)
    lane = lc.run_strategy(tiny_engine, lc.BASELINE, req)
    f = lane.figures()
    assert lane.status == "done" and len(lane.token_ids) == f.tokens == 4 and f.forward_passes == 4
    assert f.ttft_s is not None and 0 < f.ttft_s <= f.elapsed_s and len(lane.steps) == 4
    assert lane.info["kept"] == tiny_engine.context_length - 4 and lane.lossless is False
    text, n, kept = lc.ar_truncated(tiny_engine, req)
    assert text == lane.text and kept == lane.info["kept"] and n > tiny_engine.context_length
    row = B.result_row(lane, req, item_key="p", category="passkey", reference="12345", scores={"correct": False})
    assert row["n_tokens"] == 4 and row["quality"]["contains_ref"] == 0.0 and row["quality"]["correct"] is False
