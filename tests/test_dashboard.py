"""The Dashboard's parameter-sweep and long-context charts on real SQLite stores filled through the real APIs
(`paradec.bench.run_bench` on the random tiny engine, `evals/longcontext_eval.py`'s own functions, and
`Store.add_result`), the per-result parameters and meta the store keeps (an older database gains them), and the
BENCHMARKS.md helpers that read the sweep and long-context tables."""
from __future__ import annotations

import re
import sqlite3
import sys

import pandas as pd
import pytest

from conftest import ROOT
from paradec import bench as B
from paradec.metrics import speedup
from paradec.store import Store
from paradec.ui import charts

sys.path.insert(0, str(ROOT))

ITEMS = [B.BenchItem("c1", "code", ["def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n"], chat=False),
         B.BenchItem("c2", "code", ["for i in range(10):\n    print(i)\nfor i in range(10):\n"], chat=False),
         B.BenchItem("p1", "prose", ["Name three colours."])]
NGRAMS = (1, 2, 3)


@pytest.fixture(scope="module")
def sweep_store(tmp_path_factory, tiny_engine):
    """Three real bench runs (ar + pld) that differ only in pld's max_ngram."""
    import torch
    torch.set_num_threads(1)
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('sweep') / 'p.db'}")
    runs = {}
    for n in NGRAMS:
        settings = B.BenchSettings(strategies=["ar", "pld"], max_new_tokens=12, warmup=False,
                                   params={"pld": {"max_ngram": n}})
        rid = store.create_run("bench", name=f"pld sweep {n}", model="random-0", device="cpu", dtype="float32",
                               strategies=["ar", "pld"], settings={"bench": B.asdict(settings)})
        B.run_bench(tiny_engine, store, rid, ITEMS, settings)
        store.finish_run(rid)
        runs[n] = rid
    yield store, runs
    store.close()


def test_bench_stores_each_results_parameters_with_defaults(sweep_store):
    store, runs = sweep_store
    rows = store.get_results(runs[2])
    pld = [r for r in rows if r["strategy"] == "pld"]
    assert pld and all(r["params"] == {"max_ngram": 2, "num_pred": 10} for r in pld)   # default filled in
    assert all(r["params"] == {} for r in rows if r["strategy"] == "ar")


def test_sweep_detection_table_and_chart(sweep_store):
    store, runs = sweep_store
    df = store.results_dataframe(light=True)
    cands = charts.sweep_candidates(df)
    assert [(c["strategy"], c["param"], c["values"], c["runs"]) for c in cands] == \
        [("pld", "max_ngram", [1.0, 2.0, 3.0], 3)]                       # num_pred never varies: no sweep
    assert [k for _, k in charts.sweep_choices(df)] == [charts.SWEEP_AUTO, "pld:max_ngram"]
    t = charts.sweep_table(df, "pld", "max_ngram")
    assert set(t["category"]) == {"code", "prose", "all"} and sorted(set(t["value"])) == [1.0, 2.0, 3.0]
    # each point is measured inside its own run against that run's ar, like speedup_table
    for n, rid in runs.items():
        d = df[(df.run_id == rid) & (df.category == "code")]
        want = speedup(d[d.strategy == "pld"]["tokens_per_s"].tolist(), d[d.strategy == "ar"]["tokens_per_s"].tolist())
        got = t[(t.value == n) & (t.category == "code")].iloc[0]
        assert got["speedup"] == pytest.approx(want) and got["n"] == 2 and got["runs"] == 1
        rouge = d[d.strategy == "pld"]["q_rouge_l_vs_ar"].mean()
        assert got["rouge_l_vs_ar"] == pytest.approx(rouge)
        assert got["ppl_change_pct"] == pytest.approx(0.0, abs=1e-6)   # pld is lossless: same text, same perplexity
    fig = charts.sweep_chart(df)                                         # 'auto' picks the only sweep
    assert "pld · max_ngram" in fig.layout.title.text
    lines = {tr.name for tr in fig.data if tr.showlegend}
    assert lines == {"all", "code", "prose"}
    speed = [tr for tr in fig.data if tr.name == "code" and tr.yaxis in (None, "y")][0]
    assert list(speed.x) == [1.0, 2.0, 3.0]
    assert len(fig.data) == 9                                            # 3 lines x (speed-up, ROUGE-L, perplexity)
    # the filters apply: without pld's rows there is no sweep, and the chart says so
    only_ar = charts.filter_results(df, strategies=["ar"])
    empty = charts.sweep_chart(only_ar)
    assert not empty.data and "no parameter sweep" in empty.layout.annotations[0].text
    gone = charts.sweep_chart(df, "lud:threshold")
    assert not gone.data and "not in the selected runs" in gone.layout.annotations[0].text


def test_sweep_lines_split_on_another_varying_parameter(sweep_store):
    """Two settings of another parameter never share a line (e.g. two LUD adapters swept over threshold)."""
    store, runs = sweep_store
    df = store.results_dataframe(light=True)
    df = df.copy()
    second = df.run_id == runs[3]
    df.loc[second & (df.strategy == "pld"), "params"] = [{"max_ngram": 3, "num_pred": 4}] * int(
        (second & (df.strategy == "pld")).sum())
    t = charts.sweep_table(df, "pld", "max_ngram")
    assert set(t["variant"]) == {"num_pred=10", "num_pred=4"}


def test_old_database_gains_the_columns_and_params_fall_back_to_run_settings(tmp_path):
    db = tmp_path / "old.db"
    Store(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as c:                      # a database made before results kept params and meta
        c.execute("ALTER TABLE results DROP COLUMN params")
        c.execute("ALTER TABLE results DROP COLUMN meta")
        c.execute("INSERT INTO runs (kind, status, name, model, device, dtype, environment, strategies, settings, "
                  "host, process_tag, created_at) VALUES ('bench', 'finished', 'old', 'm', 'cpu', 'float32', '{}', "
                  "'[\"ar\", \"lud\"]', '{\"bench\": {\"params\": {\"lud\": {\"threshold\": 0.7}}}}', 'h', '', "
                  "'2026-01-01 00:00:00')")
        c.execute("INSERT INTO results (run_id, item_key, category, strategy, repeat, turn, prompt, text, n_tokens, "
                  "forward_passes, draft_passes, drafted, accepted, created_at) VALUES (1, 'q', 'code', 'lud', 0, 0, "
                  "'', '', 0, 0, 0, 0, 0, '2026-01-01 00:00:00')")
    store = Store(f"sqlite:///{db}")
    with sqlite3.connect(db) as c:
        cols = {r[1] for r in c.execute("PRAGMA table_info(results)")}
    assert {"params", "meta"} <= cols
    df = store.results_dataframe()
    assert df.loc[0, "params"] == {"threshold": 0.7}               # from the run's settings
    store.add_result(1, item_key="q2", strategy="lud", params={"threshold": 0.5}, meta={"approx_tokens": 10})
    df = store.results_dataframe()
    assert df.loc[1, "params"] == {"threshold": 0.5} and df.loc[1, "m_approx_tokens"] == 10
    store.close()


# ------------------------------------------------------------------------------------------- long context
def _lc_store(path):
    """A long-context run through the store API with a known pattern: pcw right at depth 10 of every length,
    ar-truncated right only at the shortest length."""
    store = Store(f"sqlite:///{path}")
    rid = store.create_run("longcontext", name="lc", model="m", strategies=["ar-truncated", "pcw"])
    for n in (400, 1024, 2048):
        for depth in (10, 50, 90):
            for s in ("ar-truncated", "pcw"):
                ok = (s == "pcw" and depth == 10) or (s == "ar-truncated" and n == 400)
                store.add_result(rid, item_key=f"i{n}-{depth}", category="passkey", strategy=s, text="x",
                                 quality={"correct": ok},
                                 meta={"approx_tokens": n, "depth_percent": depth, "input_tokens": n + 40,
                                       "context_length": 512})
    store.finish_run(rid)
    return store, rid


def test_longcontext_accuracy_grouping_and_charts(tmp_path):
    store, rid = _lc_store(tmp_path / "lc.db")
    df = store.results_dataframe(light=True)
    by_len = charts.longcontext_accuracy(df)
    assert list(by_len["strategy"].unique()) == ["ar-truncated", "pcw"]          # stored order kept
    acc = {(r.strategy, r.approx_tokens): (r.correct, r.n) for r in by_len.itertuples()}
    assert acc[("ar-truncated", 400)] == (3, 3) and acc[("ar-truncated", 2048)] == (0, 3)
    assert acc[("pcw", 1024)] == (1, 3)
    cells = charts.longcontext_accuracy(df, ("approx_tokens", "depth_percent"))
    assert len(cells) == 18 and set(cells["n"]) == {1}
    line = charts.longcontext_length_chart(df)
    assert [tr.name for tr in line.data] == ["ar-truncated", "pcw"]
    assert list(line.data[1].y) == pytest.approx([1 / 3] * 3) and list(line.data[0].x) == [400, 1024, 2048]
    assert "(2× ctx)" in " ".join(line.layout.xaxis.ticktext)                    # 1024 tokens = 2 context windows
    heat = charts.longcontext_heatmap(df)
    assert len(heat.data) == 2
    pcw = heat.data[1]
    assert list(pcw.x) == ["10%", "50%", "90%"] and list(pcw.y) == ["~400", "~1024", "~2048"]
    assert [row[0] for row in pcw.z] == [1.0, 1.0, 1.0] and pcw.text[0][1] == "0/1"
    # other runs' rows and an empty selection give the empty-state message, not a crash
    none = charts.longcontext_heatmap(df.iloc[0:0])
    assert not none.data and "no long-context results" in none.layout.annotations[0].text
    store.close()


def test_longcontext_eval_stores_its_answers_and_skips_what_cannot_run(tmp_path, tiny_engine):
    """The eval's own pieces on the tiny engine: unknown / unavailable strategies are skipped with a reason; each
    answer is stored with its task, length, window, correctness, cost and memory; the tables are generic over the
    strategies, and make_benchmarks_md reads them back."""
    import argparse

    from evals import longcontext_eval as lc
    from evals import make_benchmarks_md as M
    run, skipped = lc.usable_strategies(tiny_engine, ["ar-full", "ar-truncated", "pcw", "ape", "pcw+select=2",
                                                      "no-such-strategy"])
    assert run == ["ar-full", "ar-truncated", "pcw", "ape", "pcw+select=2"]
    assert "unknown strategy" in skipped["no-such-strategy"]
    store = Store(f"sqlite:///{tmp_path / 'lc.db'}")
    args = argparse.Namespace(window=128, tasks=["passkey", "kv"], limit=1)
    rid = lc.start_run(store, tiny_engine, run, skipped, args)
    items = lc.load_items(["passkey", "kv"], {384, 1024}, 1)
    assert [(it["task"], it["approx_tokens"]) for it in items] == [("passkey", 384), ("kv", 1024)]
    rows = lc.evaluate(tiny_engine, items, run, 128, store, rid)
    assert len(rows) == 10 and all(r["ttft_s"] and r["e2e_s"] >= r["ttft_s"] for r in rows if not r["error"])
    by = {(r["id"], r["strategy"]): r for r in rows}
    # the tiny model's 512 positions cannot hold the 1K-token kv prompt whole: ar-full fails in its own lane,
    # ar-truncated keeps the last 128 - 16 tokens, the chunked methods read it in windows of 128
    kv = items[1]["id"]
    assert by[(kv, "ar-full")]["error"] and not by[(kv, "pcw")]["error"] and by[(kv, "pcw")]["chunks"] >= 8
    assert by[(kv, "ar-truncated")]["kv_mb"] < by[(kv, "pcw")]["kv_mb"]
    res = store.results_dataframe(rid)
    assert len(res) == 10 and set(res["strategy"]) == set(run)
    assert (res["run_kind"] == "longcontext").all() and set(res["category"]) == {"passkey-control", "kv"}
    assert set(res["m_approx_tokens"]) == {384, 1024} and res["m_context_length"].eq(128).all()
    assert res["q_correct"].isin([True, False]).all() and res["m_kv_cache_mb"].notna().all()
    assert res.loc[res.strategy == "ape", "params"].map(lambda p: p["temperature"] == 0.9).all()
    assert res.loc[res.strategy == "pcw+select=2", "params"].map(lambda p: p["select"] == 2).all()
    # the kv prompt's 8+ chunks: select keeps two of them, so it caches fewer positions than pcw
    assert by[(kv, "pcw+select=2")]["kv_mb"] < by[(kv, "pcw")]["kv_mb"]
    # the charts count answers, not failed lanes: ar-full's two refusals (555 and 860 tokens > 512) are left out
    assert len(charts.longcontext_accuracy(res, ("category",), passkey_only=False)) == 8
    page = tmp_path / "lc.md"
    body = lc.tables(tiny_engine, rows, run, 128, [], skipped, 1.0)
    page.write_text(body + "\n")
    assert "| ar-full | ar-truncated | pcw | ape | pcw+select=2 |" in body and "`no-such-strategy` was not run" in body
    assert "### Cost per answer" in body and "full ÷ pcw, ape, pcw+select=2 prefill" in body
    section = M.longcontext(page)
    assert "### Passkey accuracy" in section and "### Reading" in section and "Sample answers" not in section
    store.close()


def test_longcontext_scores_and_kv_positions():
    from evals import longcontext_eval as lc
    num = {"task": "section_number", "reference": "34"}
    assert lc.score(num, "Section 34.") and lc.score(num, "34") and not lc.score(num, "Section 134 or 341")
    name = {"task": "name_lookup", "reference": "logging.setLoggerClass"}
    assert lc.score(name, "`logging.setLoggerClass`") and lc.score(name, "setLoggerClass")
    assert not lc.score(name, "setLoggerClassic") and not lc.score(name, "logging.getLogger")
    assert lc.score({"task": "kv", "reference": "0a1b2c3d"}, '"0a1b2c3d"') and not lc.score({"task": "passkey",
                                                                                              "reference": "12345"}, "1234")
    lane = type("L", (), {"token_ids": [1, 2], "info": {"chunk_lengths": [100, 100, 60], "shared_prefix": 20,
                                                         "question_tokens": 30}})()
    assert lc.cached_positions("ape", lane, 999) == 260 - 40 + 30 + 2
    lane.info["selected"] = [0, 2]                    # select: only the kept chunks stay cached
    assert lc.cached_positions("ape+select=2", lane, 999) == 160 - 20 + 30 + 2
    lane.info = {"kept": 112}
    assert lc.cached_positions("ar-truncated", lane, 999) == 114
    lane.info = {}
    assert lc.cached_positions("ar-full", lane, 999) == 1001


def test_benchmarks_md_reads_the_full_sweep_table():
    from evals import make_benchmarks_md as M
    table, summary = M.lud_sweep()
    sweep = (ROOT / "docs" / "lud_sweep.md").read_text()
    assert table.count("\n") >= 3 and table.strip() in sweep
    assert "- code:" in summary and "thresholds" in summary


def test_lud_sweep_runs_land_in_the_apps_database_unless_db_says_otherwise(monkeypatch, tmp_path):
    """`lud_train sweep` runs one bench per threshold with its threshold as a lud parameter; without --db the
    bench uses the app's store (no --db passed on), with --db that store."""
    import json
    import subprocess
    import types

    from paradec.training import lud_train
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        row = {"speedup": 0.5, "tokens_per_s": 10.0, "tokens_per_pass": 1.0, "rouge_l_vs_ar": 1.0,
               "perplexity": 5.0, "n": 3}
        out = {"run": len(calls), "table": [{"category": "all", "strategy": s, **row} for s in ("ar", "lud")]}
        return types.SimpleNamespace(returncode=0, stdout=json.dumps(out) + "\n", stderr="")
    monkeypatch.setattr(subprocess, "run", fake_run)
    assert lud_train.sweep_main(["--thresholds", "0.5,0.9", "--suites", "code", "--limit", "2",
                                 "--out", str(tmp_path / "s.md")]) == 0
    assert len(calls) == 2 and all("--db" not in c for c in calls)
    assert [json.loads(c[c.index("--params") + 1]) for c in calls] == [{"lud": {"threshold": 0.5}},
                                                                       {"lud": {"threshold": 0.9}}]
    assert "| code | – | 0.9 |" in (tmp_path / "s.md").read_text()     # k column: the strategy's default
    calls.clear()
    lud_train.sweep_main(["--thresholds", "0.5", "--suites", "code", "--db", str(tmp_path / "x.db")])
    assert calls[0][calls[0].index("--db") + 1] == str(tmp_path / "x.db")


# ------------------------------------------------------------------------------------------- reading the page
def _hand_rows(store, n_items: int, strategies=("ar", "pld", "sot"), run_name="r", categories=("code", "qa")):
    """Hand-made results (no model): tokens/s, tau and latencies with long decimals, as real runs have."""
    rid = store.create_run("bench", name=run_name, model="m", device="cpu", dtype="float32",
                           strategies=list(strategies))
    for i in range(n_items):
        for k, s in enumerate(strategies):
            tps = 6.123456789 + k * 1.987654321 + (i % 7) / 3
            store.add_result(rid, item_key=f"i{i}", category=categories[i % len(categories)], strategy=s, text="t",
                             n_tokens=40, forward_passes=40 // (k + 1), tokens_per_s=tps,
                             tokens_per_pass=1.0 + k * (0.5 + (i % 5) / 9), ttft_s=0.1234567, tpot_s=1 / tps,
                             e2e_s=40 / tps, itl=[1 / tps] * 3,
                             quality={"rouge_l_vs_ar": 1.0 if s == "pld" else 0.5555555555})
    store.finish_run(rid)
    return rid


def test_numbers_are_formatted_for_reading():
    assert charts.fmt_number(0.8888888888888888, "speedup") == "0.89×"
    assert charts.fmt_number(0.123456, "ms") == "123.5" and charts.fmt_number(12.5, "ms") == "12,500"
    assert charts.fmt_number(19.846028605864063, "rate") == "19.8"
    assert charts.fmt_number(3.0, "int") == "3" and charts.fmt_number(None) == "–"
    assert charts.fmt_number(float("nan"), "ratio") == "–"
    assert charts.fmt_number(0.123456789) == "0.1235" and charts.fmt_number(2.0) == "2"
    rows = [{"run": 1, "category": "all", "strategy": "pld", "n": 3, "tokens_per_s": 19.846028605864063,
             "speedup": 0.8888888888888888, "e2e_speedup": None, "forward_passes": 10.333333,
             "tokens_per_pass": 1.23456789, "ttft_p50": 0.0123456, "tpot_p50": 0.16666666,
             "rouge_l_vs_ar": 0.55555555, "rouge_l_vs_ref": None, "perplexity": 4.56789, "lossless_mismatches": 0}]
    f = charts.summary_frame(rows)
    cells = [str(v) for v in f.iloc[0]]
    assert all(not re.search(r"\d\.\d{5,}", c) for c in cells), cells
    row = dict(zip(f.columns, cells))
    assert row["speed-up vs ar"] == "0.89×" and row["TTFT p50 (ms)"] == "12.3" and row["n"] == "3"
    assert row["end-to-end speed-up"] == "–" and row["ROUGE-L vs ar"] == "0.556"
    empty = charts.summary_frame([])
    assert len(empty) == 0 and "speed-up vs ar" in empty.columns           # named headers, never "1 2 3"
    generic = charts.format_table(pd.DataFrame({"run_id": [1], "ttft_s": [0.5], "x": [1 / 3], "name": ["a"]}))
    assert list(generic.iloc[0]) == ["1", "500.0", "0.3333", "a"] and "ttft_s (ms)" in generic.columns


def test_histogram_bins_fit_the_data():
    one = charts.hist_bins([1.0, 1.0, 1.0])                  # three ar results: one narrow bin at 1.00
    assert one["start"] < 1.0 < one["end"] and one["size"] <= 0.05
    many = charts.hist_bins([1 + i / 100 for i in range(300)])
    assert 6 <= (many["end"] - many["start"]) / many["size"] <= 41 and many["end"] >= 3.99


def test_charts_read_well_with_one_and_with_300_results(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'h.db'}")
    _hand_rows(store, 1, run_name="one")
    df1 = store.results_dataframe(light=True)
    _hand_rows(store, 100, run_name="many")           # 300 results
    df = store.results_dataframe(light=True)
    assert len(df[df.run_name == "many"]) == 300
    for d in (df1, df):
        bar = charts.speedup_bar(d)
        assert bar.layout.yaxis.range[1] > max(max(t.y) for t in bar.data) * 1.1      # room for the labels
        assert all(t.cliponaxis is False for t in bar.data)
        colours = {t.name: t.marker.color for t in bar.data}
        assert colours == {s: charts.strategy_colour(s) for s in colours}
        lat = charts.latency_box(d)
        assert all(set(t.y) == {t.legendgroup} and t.orientation == "h" for t in lat.data)   # names on y
        tau = charts.tokens_per_pass_hist(d)
        ar = [t for t in tau.data if t.name.startswith("ar ")][0]
        assert ar.xbins.size <= 0.25 and ar.marker.color == charts.strategy_colour("ar")
        q = charts.quality_scatter(d)
        assert {t.marker.color for t in q.data} <= set(charts.STRATEGY_COLOURS.values())
    store.close()


def test_empty_states_wrap_to_fit():
    for fig in (charts.sweep_chart(pd.DataFrame()), charts.longcontext_heatmap(pd.DataFrame()),
                charts.speedup_bar(pd.DataFrame())):
        text = fig.layout.annotations[0].text
        assert all(len(line) <= 56 for line in text.split("<br>")), text


def test_race_chart_one_line_per_strategy():
    lanes = {"ar": {"groups": [{"t": 0.2, "ids": [1]}, {"t": 0.4, "ids": [2]}]},
             "pld": {"groups": [{"t": 0.1, "ids": [1, 2, 3]}]}}
    fig = charts.race_chart(lanes)
    assert [t.name for t in fig.data] == ["ar", "pld"]
    assert list(fig.data[0].y) == [0, 1, 2] and list(fig.data[1].x) == [0.0, 0.1]
    assert fig.data[1].line.color == charts.strategy_colour("pld")
    assert charts.race_chart(lanes, t_now=3.0).layout.xaxis.range[1] >= 3.0       # the replay's clock


def test_reference_runs_are_a_separate_labelled_source(tmp_path, monkeypatch):
    from paradec.ui import dashboard as D
    src = Store(f"sqlite:///{tmp_path / 'bench.db'}")
    _hand_rows(src, 4, run_name="reference bench")
    src.close()
    shipped = D.make_reference(str(tmp_path / "bench.db"), tmp_path / "ref" / "reference.db")
    before = shipped.read_bytes()
    monkeypatch.setenv("PARADEC_REFERENCE_DB", str(shipped))
    mine = Store(f"sqlite:///{tmp_path / 'mine.db'}")
    dash = D.Dashboard(mine)
    assert dash.reference is not None and dash.auto_source() == D.REFERENCE       # a newcomer sees the reference
    out = dash.open(D.MINE, False, [], "all", [], [], "", "auto")
    assert out[0]["value"] == D.REFERENCE
    info = out[6 + 1]
    assert "Showing the reference runs" in info and "12 result rows" in info
    assert len(out[6 + 2].data) > 0                                                # the speed-up chart is drawn
    # the user's own runs: never mixed with the reference
    _hand_rows(mine, 1, strategies=("ar", "pld"), run_name="my run")
    assert dash.auto_source() == D.MINE
    out = dash.open(D.REFERENCE, False, [], "all", [], [], "", "auto")
    assert out[0]["value"] == D.MINE and "2 result rows from 1 run(s)" in out[7]
    assert "reference" not in out[7].lower()
    kept = dash.open(D.REFERENCE, True, [], "all", [], [], "", "auto")            # picked by the user: kept
    assert kept[0]["value"] == D.REFERENCE and "12 result rows" in kept[7]
    assert shipped.read_bytes() == before                                          # the shipped file is untouched
    monkeypatch.setenv("PARADEC_REFERENCE_DB", "")
    assert D.Dashboard(mine).reference is None
    empty = D.Dashboard(Store(f"sqlite:///{tmp_path / 'new.db'}"), reference=None)
    assert "No runs yet" in empty.open(D.MINE, False, [], "all", [], [], "", "auto")[7]
    mine.close()


def test_benchmarks_md_ratios_of_two_lanes_use_the_one_speedup():
    from evals import make_benchmarks_md as M
    r = {"ar": {"speed-up vs ar": "1.00×", "tokens/s": "4.4"}, "x": {"speed-up vs ar": "1.37×", "tokens/s": "6.1"},
         "big": {"speed-up vs ar": "1.10×", "tokens/s": "123.4"}, "big-ar": {"speed-up vs ar": "1.00×",
                                                                            "tokens/s": "112.2"}}
    assert M.relative(r, "x", "ar") == pytest.approx(1.37)                   # coarse tokens/s: the speed-up cells
    assert M.relative(r, "big", "big-ar") == pytest.approx(123.4 / 112.2)   # fine tokens/s cells
    assert M.relative(r, "x", "ar", "tokens/s") == pytest.approx(6.1 / 4.4)
    assert M.relative(r, "x", "none") is None


def test_longcontext_strategy_specs_carry_parameters(tiny_engine):
    from evals import longcontext_eval as lc
    assert lc.parse_spec("ape+temperature=1+scale=0.5") == ("ape", {"temperature": 1, "scale": 0.5})
    assert lc.parse_spec("pcw") == ("pcw", {})
    run, skipped = lc.usable_strategies(tiny_engine, ["ape+temperature=1", "pcw+nope=3", "ape+scale=-1"])
    assert run == ["ape+temperature=1"] and "unknown parameter" in skipped["pcw+nope=3"]
    assert "scale must be between" in skipped["ape+scale=-1"]
    from paradec.strategies import Request
    req = Request(prompt="word " * 300 + "\n\nWhat is the pass key? The pass key is", chat=False, max_new_tokens=3,
                  ignore_eos=True)
    lane = lc.run_strategy(tiny_engine, "ape+temperature=1+scale=1", req, window=128)
    assert lane.name == "ape+temperature=1+scale=1" and lane.params == {"temperature": 1, "scale": 1}
    assert not lane.error and lane.info["chunks"] >= 2


def test_the_lud_sweep_table_names_its_runs_machine_and_dtype(tmp_path):
    from paradec.engine import cpu_name
    from paradec.training import lud_train
    db = tmp_path / "s.db"
    s = Store(f"sqlite:///{db}")
    ids = [s.create_run("bench", name=f"lud-sweep code k=2 {t}", model="qwen", device="cpu", dtype="bfloat16")
           for t in (0.7, 0.9)]
    s.close()
    head = lud_train.sweep_head([{"run": i} for i in ids], str(db))
    assert head.startswith(f"Runs {ids[0]}-{ids[1]}, ") and cpu_name() in head and "cpu, bfloat16" in head
    assert "model qwen" in head
    assert lud_train.sweep_head([{"run": 1}], str(tmp_path / "none.db")) == ""
    assert not (tmp_path / "none.db").exists()
