"""The web app, launched for real on 127.0.0.1 (random tiny engine, temporary SQLite file) and driven over HTTP
with gradio_client; plus the chart functions on hand-made frames and app.py as a real subprocess."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N_COLS = 8
STATUS, FIGS = N_COLS, N_COLS + 1          # output positions of the race endpoint


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def app(tmp_path_factory, tiny_engine):
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    from app import build_app, launch
    from paradec.store import Store
    db = tmp_path_factory.mktemp("appdb") / "app.db"
    store = Store(f"sqlite:///{db}")
    demo = build_app(tiny_engine, store)
    port = free_port()
    launch(demo, "127.0.0.1", port, prevent_thread_lock=True, quiet=True)
    url = f"http://127.0.0.1:{port}/"
    yield {"url": url, "store": store, "demo": demo, "engine": tiny_engine}
    demo.close()
    store.close()


def client(app) -> Client:
    return Client(app["url"], verbose=False, analytics_enabled=False)


def race_args(prompt, strategies, max_new_tokens, temperature=0.0, seed=0, max_context=0):
    from paradec.ui.arena import default_params_json, param_strategies
    return [prompt, "chat", strategies, max_new_tokens, temperature, 1.0, seed, max_context,
            *[default_params_json(n) for n in param_strategies()]]


def val(x):
    """A component's value from an output (gr.update(...) arrives as a dict with 'value')."""
    return x["value"] if isinstance(x, dict) and x.get("__type__") == "update" else x


def array(v) -> list:
    """A numeric array of a plot's JSON as a list (plotly sends them base64-encoded: {dtype, bdata})."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        import numpy as np
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)


def wait_job(job, timeout=240):
    t0 = time.time()
    while not job.done():
        assert time.time() - t0 < timeout, "the job did not finish in time"
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------- Arena
def test_race_streams_every_column_at_once_and_is_stored(app):
    from paradec.strategies import get
    store = app["store"]
    before = {r["id"] for r in store.list_runs(kind="race")}
    names = ["ar", "hf-generate", "pld", "lookahead"]
    for n in names:
        assert get(n).available(app["engine"])[0], n
    c = client(app)
    job = c.submit(*race_args("Explain what a context manager is in Python.", names, 400), api_name="/race")
    frames = []                        # every streamed figures frame, observed while the job runs
    seen = 0
    t0 = time.time()
    while True:
        outs = job.outputs()
        for o in outs[seen:]:
            frames.append(o[FIGS])
        seen = len(outs)
        if job.done() and len(job.outputs()) == seen:
            break
        assert time.time() - t0 < 300
        time.sleep(0.02)
    assert len(frames) >= 5, "the race should stream many updates"
    stepwise = ["ar", "pld", "lookahead"]           # hf-generate is transformers' generate: one step by design
    # some frame shows every step-wise column with text while none of them has finished: they stream together
    together = [f for f in frames if f and all(f["lanes"][n]["tokens"] > 0 and f["lanes"][n]["status"] == "running"
                                                 for n in stepwise)]
    assert together, "no frame had partial output in every column before any column finished"
    mid = together[0]["lanes"]
    assert all(0 < mid[n]["tokens"] < 400 for n in stepwise)
    final = frames[-1]
    assert final["finished"] and final["run_id"] is not None
    ar = final["lanes"]["ar"]
    for n in names:
        lane = final["lanes"][n]
        assert lane["status"] == "done", (n, lane)
        assert lane["tokens"] > 0 and lane["elapsed_s"] > 0 and lane["ttft_s"] > 0 and lane["tokens_per_s"] > 0
        assert lane["forward_passes"] > 0 and lane["tokens_per_pass"] > 0
        if n != "ar":
            assert lane["speedup"] == pytest.approx(lane["tokens_per_s"] / ar["tokens_per_s"])
            assert lane["diverges_at"] is None, f"{n} is lossless but diverged from ar"
            assert lane["text"] == ar["text"]
    # the rendered columns carry the live figures and the lossless verdict
    last = job.outputs()[-1]
    html_cols = [last[i]["value"] if isinstance(last[i], dict) else last[i] for i in range(len(names))]
    for n, h in zip(names, html_cols):
        assert f'data-strategy="{n}"' in h and "tokens/s" in h and "TTFT" in h and "forward passes" in h
        if n != "ar":
            assert "lossless: identical to ar" in h and "speed-up vs ar" in h
    assert f"run #{final['run_id']}" in last[STATUS]
    # stored: one race run with one result row per strategy carrying the figures
    runs = [r for r in store.list_runs(kind="race") if r["id"] not in before]
    assert [r["id"] for r in runs] == [final["run_id"]]
    assert runs[0]["status"] == "finished" and runs[0]["strategies"] == names
    rows = {r["strategy"]: r for r in store.get_results(final["run_id"])}
    assert set(rows) == set(names)
    for n in names:
        assert rows[n]["n_tokens"] == final["lanes"][n]["tokens"]
        assert rows[n]["text"] == final["lanes"][n]["text"]
        assert rows[n]["tokens_per_s"] == pytest.approx(final["lanes"][n]["tokens_per_s"])
        assert rows[n]["forward_passes"] == final["lanes"][n]["forward_passes"]
    assert rows["pld"]["quality"]["exact_match"] is True and rows["pld"]["quality"]["diverges_at"] is None

    # replay: each column at its own pace, growing from nothing to the final text
    rjob = c.submit(4.0, api_name="/replay")
    wait_job(rjob)
    rep = rjob.outputs()
    assert len(rep) >= 3
    first_html = rep[0][0]["value"] if isinstance(rep[0][0], dict) else rep[0][0]
    last_html = rep[-1][0]["value"] if isinstance(rep[-1][0], dict) else rep[-1][0]
    assert "data-status=\"done\"" in last_html and len(last_html) > len(first_html)
    # the live chart during the race and the replay: one line per strategy, ending at each lane's tokens
    charts_out = [json.loads(o[-1]["plot"]) for o in rep if isinstance(o[-1], dict) and o[-1].get("plot")]
    assert charts_out, "the replay drew no chart"
    last_chart = charts_out[-1]
    assert [t["name"] for t in last_chart["data"]] == names
    race_chart = json.loads(job.outputs()[-1][-1]["plot"])
    assert [t["name"] for t in race_chart["data"]] == names
    assert all(array(t["y"])[-1] >= final["lanes"][t["name"]]["tokens"] for t in race_chart["data"])


def test_stop_really_stops_the_race_and_saves_it(app):
    store = app["store"]
    c = client(app)
    job = c.submit(*race_args("Tell me a long story about a parser.", ["ar", "pld", "lookahead"], 480),
                   api_name="/race")
    t0 = time.time()
    while True:
        outs = job.outputs()
        if outs and outs[-1][FIGS] and all(v["tokens"] >= 5 for v in outs[-1][FIGS]["lanes"].values()):
            break
        assert not job.done(), "the race ended before it could be stopped; raise max_new_tokens"
        assert time.time() - t0 < 120
        time.sleep(0.02)
    msg = c.predict(api_name="/stop")
    assert msg == "Stopping…"
    wait_job(job, 60)
    final = job.outputs()[-1][FIGS]
    assert final["finished"]
    assert all(v["status"] == "stopped" for v in final["lanes"].values()), final["lanes"]
    assert all(v["tokens"] < 480 for v in final["lanes"].values())
    run = store.get_run(final["run_id"])
    assert run["kind"] == "race" and run["status"] == "interrupted" and run["n_results"] == 3
    stored = {r["strategy"]: r for r in store.get_results(run["id"])}
    assert all(r["quality"]["status"] == "stopped" for r in stored.values())
    # the model work really stopped: a second look a moment later finds the same token counts
    time.sleep(0.5)
    assert {r["strategy"]: r["n_tokens"] for r in store.get_results(run["id"])} == \
        {n: v["tokens"] for n, v in final["lanes"].items()}
    assert c.predict(api_name="/stop") == "Nothing is running."


def test_race_rejects_bad_input_with_a_message(app):
    c = client(app)
    with pytest.raises(Exception, match="prompt is empty"):
        c.predict(*race_args("   ", ["ar", "pld"], 8), api_name="/race")
    args = race_args("hi", ["ar", "pld"], 8)
    from paradec.ui.arena import param_strategies
    args[8 + param_strategies().index("pld")] = '{"num_pred": 0}'
    with pytest.raises(Exception, match="num_pred must be between"):
        c.predict(*args, api_name="/race")
    # the context window field: a prompt that does not fit it is refused before anything runs
    with pytest.raises(Exception, match=r"window of 24 tokens \(max_context\)"):
        c.predict(*race_args("Explain what a context manager is in Python, in detail, with examples.", ["ar", "pld"],
                             8, max_context=24), api_name="/race")


def test_two_sessions_queue_for_the_engine(app):
    a, b = client(app), client(app)
    ja = a.submit(*race_args("first session", ["ar", "pld", "lookahead"], 300), api_name="/race")
    t0 = time.time()
    while not ja.outputs():
        assert time.time() - t0 < 60
        time.sleep(0.02)
    jb = b.submit(*race_args("second session", ["ar", "pld"], 16), api_name="/race")
    ranks = []
    while not jb.done():
        st = jb.status()
        if st.code.name == "IN_QUEUE" and st.rank is not None:
            ranks.append(st.rank)
        if not ja.done():
            assert not jb.outputs(), "the second race streamed while the first still held the engine"
        time.sleep(0.02)
    assert ranks and min(ranks) == 0, "the waiting session never saw its queue position"
    assert ja.done() and jb.outputs()[-1][FIGS]["finished"]


# ---------------------------------------------------------------------------------------------- Eval sets
BAD_CSV = "id,category,prompt\n1,code,write a loop\n2,code,\n3,code,a,b,c\n"
GOOD_JSONL = "\n".join(json.dumps({"id": f"q{i}", "category": "code" if i % 2 else "prose",
                                   "prompt": f"Write something about topic {i}."}) for i in range(5)) + "\n"


def test_malformed_upload_shows_row_errors_and_stores_nothing(app, tmp_path):
    store = app["store"]
    before = store.counts()
    bad = tmp_path / "broken.csv"
    bad.write_text(BAD_CSV, encoding="utf-8")
    msg, preview, _ = client(app).predict(handle_file(str(bad)), api_name="/upload_evalset")
    assert "Not stored" in msg and "broken.csv" in msg
    assert "row 2 (line 3): empty prompt" in msg
    assert "row 3 (line 4): has 5 fields but the header has 3" in msg
    assert not preview["data"] or preview["data"] == [[]] or len(preview["data"]) == 0
    after = store.counts()
    assert after["eval_sets"] == before["eval_sets"] and after["eval_items"] == before["eval_items"]

    bad_json = tmp_path / "broken.jsonl"
    bad_json.write_text('{"prompt": "ok"}\n{"prompt": \n{"id": 3}\n', encoding="utf-8")
    msg, _, _ = client(app).predict(handle_file(str(bad_json)), api_name="/upload_evalset")
    assert "line 2: invalid JSON" in msg and "line 3: missing key `prompt`" in msg
    assert store.counts()["eval_sets"] == before["eval_sets"]


def test_upload_preview_bench_run_and_resume(app, tmp_path):
    store = app["store"]
    good = tmp_path / "mine.jsonl"
    good.write_text(GOOD_JSONL, encoding="utf-8")
    c = client(app)
    msg, preview, source = c.predict(handle_file(str(good)), api_name="/upload_evalset")
    assert "Stored eval set" in msg and "5 items" in msg
    assert preview["headers"][:3] == ["id", "category", "prompt"]
    assert [r[0] for r in preview["data"]] == ["q0", "q1", "q2", "q3", "q4"]
    set_id = store.list_eval_sets()[0]["id"]
    assert store.get_eval_set(set_id)["n_items"] == 5
    src = f"set:{set_id}"

    msg, results, _ = c.predict(src, ["ar", "pld"], 8, 1, 3, api_name="/run_bench")
    assert "finished" in msg
    run = [r for r in store.list_runs(kind="eval")][0]
    assert run["status"] == "finished" and run["eval_set_id"] == set_id
    rows = store.get_results(run["id"])
    assert len(rows) == 3 * 2 and {r["strategy"] for r in rows} == {"ar", "pld"}
    assert all(r["n_tokens"] > 0 and r["tokens_per_s"] for r in rows)
    assert {r[1] for r in results["data"]} >= {"code", "prose", "all"}

    # an interrupted run (a closed page, a restart) is offered for resume and completed without duplicates
    from dataclasses import asdict

    from paradec.bench import BenchSettings, items_from_store, run_bench
    settings = BenchSettings(strategies=["ar", "pld"], max_new_tokens=8, warmup=False)
    rid = store.create_run("eval", name="half done", settings={"bench": asdict(settings), "source": src, "limit": 4},
                           eval_set_id=set_id)
    items = items_from_store(store, set_id)[:4]
    n = {"k": 0}
    run_bench(app["engine"], store, rid, items, settings, should_stop=lambda: n.__setitem__("k", n["k"] + 1) or
              n["k"] > 3)
    partial = len(store.get_results(rid))
    assert 0 < partial < 8
    store.finish_run(rid, "interrupted")
    src_up, unfinished = c.predict(api_name="/refresh_evalsets")
    assert rid in [v for _, v in unfinished["choices"]]
    msg, _, _ = c.predict(rid, api_name="/resume_bench")
    assert f"run #{rid}: finished" in msg and f"{partial} were already stored" in msg
    rows = store.get_results(rid)
    assert len(rows) == 8
    assert len({(r["item_key"], r["strategy"], r["repeat"], r["turn"]) for r in rows}) == 8
    assert store.get_run(rid)["status"] == "finished"


def test_builtin_suite_is_offered(app):
    _, unfinished = client(app).predict(api_name="/refresh_evalsets")
    from paradec.evalsets import builtin_suites
    assert builtin_suites(), "no built-in suites in evals/suites"


# ---------------------------------------------------------------------------------------------- Dashboard
def test_dashboard_returns_plots_and_csv(app):
    store = app["store"]
    c = client(app)
    if not store.list_runs(kind="race"):
        c.predict(*race_args("dashboard data", ["ar", "pld"], 12), api_name="/race")
    (warning, info, speed, latency, quality, tau, summary, export, sweep, sweep_pick, lc_len,
     lc_heat, lc_task, lc_cost) = c.predict([], "all", [], [], "", api_name="/dashboard")   # the sweep picker has a default
    for p in (sweep, lc_len, lc_heat, lc_task, lc_cost):      # no sweep and no long-context run stored yet: a message, no traces
        fig = json.loads(p["plot"])
        assert not fig["data"] and fig["layout"]["annotations"][0]["text"].startswith("no ")
    for p in (speed, latency, quality, tau):
        assert isinstance(p, dict) and p.get("type") == "plotly"
        fig = json.loads(p["plot"])
        assert fig["data"], "the plot has no traces"
    assert "result rows" in info
    lat = json.loads(latency["plot"])
    assert any("p50=" in str(t.get("name", "")) and "p99=" in str(t.get("name", "")) for t in lat["data"])
    csv = pd.read_csv(val(export))
    assert len(csv) == int(info.split()[0]) and {"strategy", "tokens_per_s", "run_id"} <= set(csv.columns)
    assert summary["data"]
    # filters: one strategy keeps ar as its reference; a bad date is a clear error
    export2 = c.predict([], "all", ["pld"], [], "", api_name="/dashboard")[7]
    assert set(pd.read_csv(val(export2))["strategy"]) == {"ar", "pld"}
    with pytest.raises(Exception, match="not YYYY-MM-DD"):
        c.predict([], "all", [], [], "yesterday", api_name="/dashboard")


def test_dashboard_charts_a_parameter_sweep_and_long_context_runs(app):
    store = app["store"]
    races = [r["id"] for r in store.list_runs(kind="race")]
    mine = []
    for n in (1, 3):            # two bench runs of ar + pld that differ in pld's max_ngram
        rid = store.create_run("bench", name=f"sweep {n}", model="random-0", strategies=["ar", "pld"])
        mine.append(rid)
        for item in range(2):
            store.add_result(rid, item_key=str(item), category="code", strategy="ar", tokens_per_s=100.0, params={})
            store.add_result(rid, item_key=str(item), category="code", strategy="pld", tokens_per_s=100.0 + 50 * n,
                             params={"max_ngram": n, "num_pred": 10}, quality={"rouge_l_vs_ar": 1.0})
        store.finish_run(rid)
    lc = store.create_run("longcontext", name="lc", model="random-0", strategies=["ar-truncated", "pcw"])
    for s in ("ar-truncated", "pcw"):
        for n, depth in ((1024, 10), (1024, 90), (2048, 10)):
            store.add_result(lc, item_key=f"{n}-{depth}", category="passkey", strategy=s, ttft_s=n / 1000,
                             quality={"correct": s == "pcw" and depth == 10},
                             meta={"approx_tokens": n, "depth_percent": depth, "context_length": 512})
        store.add_result(lc, item_key="kv-1024", category="kv", strategy=s, ttft_s=1.0, quality={"correct": True},
                         meta={"approx_tokens": 1024, "depth_percent": 25, "context_length": 512})
    mine.append(lc)
    c = client(app)             # (earlier tests' runs may hold pld at its default max_ngram too: pick ours)
    *_, sweep, pick, lc_len, lc_heat, lc_task, lc_cost = c.predict(mine, "all", [], [], "", "auto",
                                                                   api_name="/dashboard")
    fig = json.loads(sweep["plot"])
    assert "pld · max_ngram" in fig["layout"]["title"]["text"]
    code = [t for t in fig["data"] if t["name"] == "code"]
    assert array(code[0]["x"]) == [1.0, 3.0] and array(code[0]["y"]) == pytest.approx([1.5, 2.5])
    assert "pld:max_ngram" in [ch[1] for ch in pick["choices"]]
    heat = json.loads(lc_heat["plot"])
    assert len(heat["data"]) == 2 and heat["data"][1]["text"][0] == ["1/1", "0/1"]
    lines = json.loads(lc_len["plot"])
    assert [t["name"] for t in lines["data"]] == ["ar-truncated", "pcw"]      # passkey only: the kv item is not in it
    assert array(lines["data"][1]["y"]) == pytest.approx([0.5, 1.0])
    tasks = json.loads(lc_task["plot"])
    assert [t["name"] for t in tasks["data"]] == ["ar-truncated", "pcw"]
    assert dict(zip(tasks["data"][1]["x"], tasks["data"][1]["text"])) == {"passkey": "2/3", "kv": "1/1"}
    cost = json.loads(lc_cost["plot"])
    assert array(cost["data"][0]["x"]) == [1024.0, 2048.0] and array(cost["data"][0]["y"]) == pytest.approx([1.024, 2.048])
    # only a race picked: no sweep there, and the chart says so
    *_, sweep, _, lc_len, _, _, _ = c.predict(races[:1], "all", [], [], "", "pld:max_ngram", api_name="/dashboard")
    assert "not in the selected runs" in json.loads(sweep["plot"])["layout"]["annotations"][0]["text"]
    assert not json.loads(lc_len["plot"])["data"]
    # the reload button offers the sweep too
    *_, sweep_choices = c.predict(api_name="/dashboard_choices")
    assert "pld:max_ngram" in [ch[1] for ch in sweep_choices["choices"]]


def test_columns_render_groups_and_sot_points(tiny_engine):
    from paradec.race import Race
    from paradec.strategies import Request
    from paradec.ui.arena import render_all
    race = Race(tiny_engine, Request(prompt="List three tips for writing tests.", max_new_tokens=24),
                ["ar", "sot", "lookahead"])
    race.run()
    snap = race.snapshot()
    ar_html, sot_html, la_html = render_all(snap)
    assert 'class="pd-skeleton"' in sot_html and 'class="pd-point"' in sot_html     # skeleton + points apart
    assert "lossy strategy" in sot_html and "lossless" not in sot_html
    multi = [g for g in snap["lookahead"]["groups"] if len(g["ids"]) > 1 and g["text"]]
    assert la_html.count('class="pd-grp"') == len(multi)       # one shaded span per multi-token step
    assert 'class="pd-grp"' not in ar_html                      # ar never has multi-token steps
    assert "lossless: identical to ar" in la_html


def test_a_frame_says_stopped_only_above_final_columns(tiny_engine):
    """The status line and the columns of one frame come from one snapshot: a race that ends while a frame is being
    drawn (Stop pressed between its snapshot and its status line) gives a frame that still says Racing, so the
    page never shows "Stopped" above columns still marked running (CI saw exactly that in the browser)."""
    from paradec.race import Race
    from paradec.strategies import Request
    from paradec.ui.arena import MAX_COLUMNS, Arena
    arena = Arena(tiny_engine, store=None)
    race = Race(tiny_engine, Request(prompt="Say hi.", max_new_tokens=4), ["ar", "pld"])
    for lane in race.lanes.values():
        lane.status = "running"
    taken = race.snapshot

    def snapshot_then_end():
        snap = taken()
        for lane in race.lanes.values():     # the worker ends the race right after the snapshot
            lane.status = "stopped"
        race.finished.set()
        return snap
    race.snapshot = snapshot_then_end
    out = arena._frame(race, ["ar", "pld"], 1.0, chart=False)
    status, figs = out[MAX_COLUMNS], out[MAX_COLUMNS + 1]
    assert status.startswith("Racing 2 strategies (2 running)"), status
    assert not figs["finished"] and {v["status"] for v in figs["lanes"].values()} == {"running"}
    race.snapshot = taken                    # the next frame sees the end, in status and columns alike
    out = arena._frame(race, ["ar", "pld"], 2.0, chart=False)
    assert out[MAX_COLUMNS].startswith("**Stopped**") and out[MAX_COLUMNS + 1]["finished"]
    assert all('data-status="stopped"' in out[i]["value"] for i in range(2))


# ---------------------------------------------------------------------------------------------- charts
def _frame():
    rows = []
    for run, model in ((1, "m-a"), (2, "m-b")):
        for item in range(4):
            for s, tps, tau in (("ar", 100.0, 1.0), ("pld", 180.0, 2.0), ("sot", 250.0, 1.5)):
                rows.append({"run_id": run, "item_key": str(item), "repeat": 0, "turn": 0, "strategy": s,
                             "category": "code" if item < 2 else "prose", "tokens_per_s": tps * (1 + item / 10),
                             "tokens_per_pass": tau, "ttft_s": 0.01 * (item + 1), "tpot_s": 0.002,
                             "itl": [0.002, 0.003], "error": None, "model": model, "device": "cpu",
                             "dtype": "float32", "run_created_at": pd.Timestamp("2026-01-0%d" % (run + 1)),
                             "quality": {"rouge_l_vs_ar": 1.0 if s == "pld" else 0.4} if s != "ar" else {},
                             "q_rouge_l_vs_ar": (1.0 if s == "pld" else 0.4) if s != "ar" else None})
    return pd.DataFrame(rows)


def test_chart_functions_on_a_frame():
    from paradec.ui import charts
    df = _frame()
    t = charts.speedup_table(df)
    pld_code = t[(t.strategy == "pld") & (t.category == "code") & (t.run_id == 1)]["speedup"].iloc[0]
    assert pld_code == pytest.approx(1.8)
    fig = charts.speedup_bar(df)
    assert {tr.name for tr in fig.data} == {"pld", "sot"}          # one colour per strategy, categories on x
    assert {c for tr in fig.data for c in tr.x} == {"code", "prose", "all"}
    lat = charts.latency_box(df)
    assert len(lat.data) == 9 and all("p90=" in tr.name for tr in lat.data)
    sc = charts.quality_scatter(df)
    pts = {tr.name.split()[0]: tr for tr in sc.data}
    assert set(pts) == {"pld", "sot"} and all(y == 1.0 for y in pts["pld"].y)
    assert charts.tokens_per_pass_hist(df).data
    w = charts.env_warning(df)
    assert w and "model (m-a, m-b)" in w
    assert charts.env_warning(df[df.run_id == 1]) is None
    f = charts.filter_results(df, strategies=["pld"], since="2026-01-03")
    assert set(f.strategy) == {"ar", "pld"} and set(f.run_id) == {2}
    assert charts.speedup_bar(df.iloc[0:0]).layout.annotations      # empty data: a message, not a crash
    with pytest.raises(ValueError):
        charts.parse_since("31/01/2026")


# ---------------------------------------------------------------------------------------------- app.py


def start_app(args, env_extra, timeout):
    """Start `python app.py ARGS` on a free 127.0.0.1 port; wait until /config answers. -> (proc, port, response)."""
    import httpx
    port = free_port()
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", OMP_NUM_THREADS="1")
    env.pop("PARADEC_AUTH", None)
    env.update(env_extra)
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), *args, "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t0 = time.time()
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            return proc, port, httpx.get(f"http://127.0.0.1:{port}/config", timeout=2)
        except httpx.HTTPError:
            if time.time() - t0 > timeout:
                proc.kill()
                raise AssertionError("app.py did not start")
            time.sleep(0.5)


@pytest.mark.slow
def test_app_py_binds_localhost_with_basic_auth(tmp_path):
    sys.path.insert(0, str(ROOT))
    from app import parse_auth
    assert parse_auth("ann:s3cret") == ("ann", "s3cret") and parse_auth("") is None
    proc, port, r = start_app(["--random-tiny", "--db", str(tmp_path / "sub.db")], {"PARADEC_AUTH": "ann:s3cret"},
                              timeout=120)
    try:
        assert r.status_code == 401            # a login is required
        conns = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout if \
            subprocess.run(["which", "ss"], capture_output=True).returncode == 0 else ""
        if conns:
            listening = [ln for ln in conns.splitlines() if f":{port} " in ln]
            assert listening and all("127.0.0.1:" in ln for ln in listening), listening
        with pytest.raises(Exception):
            Client(f"http://127.0.0.1:{port}/", verbose=False, analytics_enabled=False)
        c = Client(f"http://127.0.0.1:{port}/", auth=("ann", "s3cret"), verbose=False, analytics_enabled=False)
        out = c.predict(*race_args("hello", ["ar", "pld", "lookahead"], 6), api_name="/race")
        assert out[FIGS]["finished"] and out[FIGS]["lanes"]["ar"]["tokens"] == 6
    finally:
        proc.terminate()
        proc.wait(20)


@pytest.mark.slow
def test_app_on_a_remote_engine(tmp_path):
    """`app.py --engine URL`: the app on one machine, `paradec serve` as the engine; a race of 3 runs through it."""
    from test_server import Server
    server = Server().wait()
    try:
        proc, port, _ = start_app(["--engine", server.url, "--db", str(tmp_path / "remote.db")], {}, timeout=300)
    except BaseException:
        server.stop()
        raise
    try:
        c = Client(f"http://127.0.0.1:{port}/", verbose=False, analytics_enabled=False)
        out = c.predict(*race_args("hello there", ["ar", "pld", "lookahead"], 8), api_name="/race")
        lanes = out[FIGS]["lanes"]
        assert out[FIGS]["finished"] and all(lanes[n]["status"] == "done" for n in ("ar", "pld", "lookahead")), lanes
        assert server.health()["served"] >= 3          # the work happened on the server
        # the same greedy text as the same race in-process (the server's --random-tiny is random_engine(0))
        from paradec.race import Race
        from paradec.strategies import Request
        from paradec.testing import random_tiny_engine
        local = Race(random_tiny_engine(0), Request(prompt="hello there", max_new_tokens=8),
                     ["ar", "pld", "lookahead"]).run()
        for n in ("ar", "pld", "lookahead"):
            assert lanes[n]["text"] == local[n].text, n
    finally:
        proc.terminate()
        proc.wait(20)
        server.stop()
