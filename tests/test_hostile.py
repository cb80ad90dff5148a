"""Hostile and careless clients (issue 23): each defect the probe found, as a regression test against the real
server (`python -m paradec.server --random-tiny` subprocesses on 127.0.0.1), the app's handlers and the CLI; and
property-based fuzzing (hypothesis) of the API's request validation, the strategy parameters and the eval-set
validator: no generated input may give a 5xx, a traceback, or a database change on rejection.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paradec.strategies import REGISTRY, load_all
from test_server import PROMPT, ROOT, Server, post, sse_chunks

load_all()

DRAFT = ROOT / "data" / "models" / "paradec-tiny-draft"
NOAUTH: dict = {}
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def servers():
    """plain: the default flags; slow: no queue, a pause per step."""
    s = {"plain": Server(), "slow": Server("--max-queue", "0", "--step-delay", "0.05")}
    try:
        for v in s.values():
            v.wait()
        yield s
    finally:
        for v in s.values():
            v.stop()


@pytest.fixture(scope="module")
def drafty():
    """A server with one operator-configured draft (serve --draft NAME=PATH); it has served no sps request yet."""
    s = Server("--draft", f"tiny-draft={DRAFT}")
    try:
        yield s.wait()
    finally:
        s.stop()


@pytest.fixture(scope="module")
def plain(servers):
    return servers["plain"]


def _post(server, body, path="/v1/completions", raw=None, timeout=60):
    return post(server, path, body, headers=NOAUTH, raw=raw)


def _is_clean_error(r, status=400):
    """An OpenAI-shaped JSON error with this status, and no traceback anywhere."""
    assert r.status_code == status, (r.status_code, r.text[:500])
    assert "Traceback" not in r.text and 'File "' not in r.text
    err = r.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    return err["message"]


# ---------------------------------------------------------------------------------------------- 1. sps burst
def test_concurrent_first_draft_loads_in_process_share_one_draft():
    """Threads released together by a barrier all load the draft of a fresh engine at once: one load, one draft."""
    from paradec.strategies.speculative import SpeculativeSampling, draft_model
    from paradec.testing import random_engine
    engine = random_engine(0)
    engine.profile = dataclasses.replace(engine.profile, draft=DRAFT)
    n = 4
    barrier, out, errors = threading.Barrier(n), [None] * n, []

    def work(i):
        try:
            barrier.wait(10)
            out[i] = (SpeculativeSampling().available(engine), draft_model(engine))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert all(o[0] == (True, "") for o in out)
    assert len({id(o[1]) for o in out}) == 1


def test_concurrent_first_sps_requests_against_the_server_all_succeed(drafty):
    """A burst of sps requests on a server that has served none (released together by a barrier): every one
    200, and the server keeps answering sps and /v1/strategies afterwards."""
    s = drafty
    n = 4
    barrier, results = threading.Barrier(n), {}
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "paradec": {"strategy": "sps"}}

    def work(i):
        barrier.wait(10)
        try:
            r = httpx.post(s.url + "/v1/completions", json=body, timeout=120)
            results[i] = (r.status_code, r.text)
        except httpx.HTTPError as e:
            results[i] = (None, repr(e))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert [results[i][0] for i in range(n)] == [200] * n, results
    assert len({json.loads(results[i][1])["choices"][0]["text"] for i in range(n)}) == 1   # greedy: the same
    r = httpx.get(s.url + "/v1/strategies", timeout=60)
    assert r.status_code == 200
    sps = next(x for x in r.json()["data"] if x["name"] == "sps")
    assert sps["available"], sps
    assert _post(s, body).status_code == 200


# ---------------------------------------------------------------------------------------------- 2. drafts
def test_clients_can_only_pick_a_draft_the_operator_configured(drafty):
    s = drafty

    def ask(draft):
        return _post(s, {"prompt": PROMPT, "max_tokens": 6, "temperature": 0,
                         "paradec": {"strategy": "sps", "params": {"draft": draft}}})
    ok = ask("tiny-draft")
    assert ok.status_code == 200, ok.text
    messages = {}
    for probe in ("/etc", "/root/.ssh", "/nonexistent-dir", str(DRAFT), str(DRAFT) + "/", "/" + str(DRAFT),
                  str(DRAFT.parent) + "/./paradec-tiny-draft", str(DRAFT) + "/../paradec-tiny-draft",
                  "data/models/paradec-tiny-draft", "paradec-tiny-draft", "Qwen/Qwen2.5-0.5B", "~", "."):
        msg = _is_clean_error(ask(probe))
        assert "tiny-draft" in msg
        for leak in ("not a model folder", "does not exist", "no such", "config.json", "permission"):
            assert leak not in msg.lower(), (probe, msg)
        messages[probe] = msg.replace(repr(probe[:64]), "X")
    assert len(set(messages.values())) == 1, messages    # the same answer whatever exists on the disk
    assert _post(s, {"prompt": PROMPT, "max_tokens": 6, "paradec": {"strategy": "sps"}}).status_code == 200


def test_serve_refuses_a_draft_that_is_not_a_model_folder(tmp_path):
    p = subprocess.run([sys.executable, "-m", "paradec.server", "--random-tiny", "--draft", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert p.returncode == 2 and "not a model folder" in p.stderr and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------------- 3. private keys
def test_clients_cannot_switch_off_the_context_check(plain):
    long_prompt = "word " * 1200            # > 512 tokens of the tiny model
    for params in ({"_long_ok": True}, {"_skeleton": "1. a\n2. b"}, {"_anything": 1}):
        for name in ("ar", "pld"):
            msg = _is_clean_error(_post(plain, {"prompt": long_prompt, "max_tokens": 4,
                                                "paradec": {"strategy": name, "params": params}}))
            assert "unknown parameter" in msg
    _is_clean_error(_post(plain, {"prompt": PROMPT, "max_tokens": 4096, "paradec": {"strategy": "ar"}}))
    _is_clean_error(_post(plain, {"prompt": long_prompt, "max_tokens": 4}))
    msg = _is_clean_error(_post(plain, {"prompt": PROMPT, "paradec": {"strategy": "pld", "params": {"nope": 1}}}))
    assert "unknown parameter" in msg


# ---------------------------------------------------------------------------------------------- 4. disconnects
def test_an_abandoned_non_streaming_request_frees_the_engine(servers):
    slow = servers["slow"]
    _wait_idle(slow)
    before = slow.health()
    body = {"prompt": PROMPT, "max_tokens": 300, "ignore_eos": True}       # 300 x 0.05 s = 15 s of work
    with pytest.raises(httpx.TimeoutException):
        httpx.post(slow.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.6))
    left = time.time()
    while time.time() - left < 10:
        h = slow.health()
        if h["running"] == 0 and h["cancelled"] > before["cancelled"]:
            break
        time.sleep(0.1)
    assert h["running"] == 0 and h["cancelled"] == before["cancelled"] + 1, h
    assert time.time() - left < 2.5, f"the engine worked {time.time() - left:.1f} s for a client that had left"


# ---------------------------------------------------------------------------------------------- 8. low
def test_non_finite_numbers_and_string_booleans_are_400(plain):
    raw_bodies = ['{"prompt": "hi", "temperature": NaN}', '{"prompt": "hi", "top_p": Infinity}',
                  '{"prompt": "hi", "paradec": {"strategy": "pld", "params": {"max_ngram": NaN}}}',
                  '{"prompt": "hi", "paradec": {"strategy": "lookahead", "params": {"window": -Infinity}}}',
                  '{"prompt": "hi", "max_tokens": 4, "paradec": {"strategy": "sot-r", "params": {"threshold": 1e999}}}']
    for raw in raw_bodies:
        _is_clean_error(_post(plain, None, raw=raw))
    for field, value in (("ignore_eos", "false"), ("ignore_eos", "no"), ("ignore_eos", 1), ("stream", "yes"),
                         ("seed", "7"), ("seed", 1.5)):
        msg = _is_clean_error(_post(plain, {"prompt": "hi", "max_tokens": 4, field: value}))
        assert field in msg
        msg = _is_clean_error(_post(plain, {"messages": [{"role": "user", "content": "hi"},
                                                         {"role": "assistant", "content": "a"}],
                                            "max_tokens": 4, field: value}, path="/v1/chat/completions"))
        assert field in msg
    _is_clean_error(_post(plain, {"prompt": "hi", "max_tokens": 4, "stream": True,
                                  "stream_options": {"include_usage": "yes"}}))
    _is_clean_error(_post(plain, {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"}],
                                  "max_tokens": 4, "continue_final_message": "true"}, path="/v1/chat/completions"))
    r = _post(plain, {"prompt": "hi", "max_tokens": 4, "ignore_eos": False})
    assert r.status_code == 200


def _wait_idle(server, timeout=30):
    t0 = time.time()
    while time.time() - t0 < timeout:
        h = server.health()
        if h["running"] == 0 and h["waiting"] == 0:
            return
        time.sleep(0.1)


def test_request_body_size_is_limited(plain):
    MAX_BODY_BYTES = 4 * 1024 * 1024        # paradec.server.MAX_BODY_BYTES
    big = json.dumps({"prompt": "x" * (MAX_BODY_BYTES + 10)})
    r = _post(plain, None, raw=big)
    assert r.status_code == 413 and "larger than" in r.json()["error"]["message"]
    assert plain.health()["status"] == "ok"


def test_429_carries_retry_after(servers):
    slow = servers["slow"]
    _wait_idle(slow)
    body = {"prompt": PROMPT, "max_tokens": 60, "ignore_eos": True, "stream": True}   # 3 s of work
    with httpx.stream("POST", slow.url + "/v1/completions", json=body, timeout=60) as first:
        assert first.status_code == 200
        r = _post(slow, {"prompt": PROMPT, "max_tokens": 4})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        for _ in first.iter_lines():
            pass


# ---------------------------------------------------------------------------------------------- fuzzing: API
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12) | st.sampled_from(["", "\x00", "ar", "pld", "sot", "sps", "true", "NaN", "-1"])
    | st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e308, 0.5, 3]),
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3),
    max_leaves=8)
TRICKY = st.sampled_from([float("nan"), float("inf"), float("-inf"), "true", "no", "3", 1.5, -1, 0, 10**9, 2**64,
                          True, False, None, [], {}, "", "\x00", "../../etc"])
VALUES = st.one_of(TRICKY, JSONISH)          # boundary values first, then anything JSON can say
FIELDS = ["prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
          "stop", "stream", "stream_options", "ignore_eos", "n", "best_of", "logprobs", "echo",
          "continue_final_message", "model", "paradec"]
STRATEGY_NAMES = ["ar", "pld", "lookahead", "sot", "sps", "lud", "pcw", "hf-generate", "nope"]


@st.composite
def api_bodies(draw):
    body = draw(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6))
    if draw(st.booleans()):     # often a nearly valid request, so validation past the first check is reached
        body.setdefault("prompt", draw(st.sampled_from(["hi", "def f(x):", " ", "\x00x"])))
        body["max_tokens"] = draw(st.integers(1, 6) | VALUES)
        pd = {"strategy": draw(st.sampled_from(STRATEGY_NAMES) | JSONISH)}
        if draw(st.booleans()):
            pd["params"] = draw(st.dictionaries(st.sampled_from(["k", "max_ngram", "window", "max_points",
                                                                  "draft", "_long_ok", "x"]) | st.text(max_size=5),
                                                VALUES, max_size=3))
        body["paradec"] = pd
    return body


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=api_bodies(), chat=st.booleans())
def test_fuzz_api_requests_never_give_5xx_or_a_traceback(plain, body, chat):
    raw = json.dumps(body, allow_nan=True)      # NaN / Infinity as JavaScript writes them
    r = _post(plain, None, path="/v1/chat/completions" if chat else "/v1/completions", raw=raw)
    assert r.status_code < 500, (raw, r.status_code, r.text[:300])
    assert "Traceback" not in r.text
    if r.status_code >= 400:
        assert isinstance(r.json()["error"]["message"], str)
    elif body.get("stream") is True:
        sse_chunks(r.text)


# ---------------------------------------------------------------------------------------------- fuzzing: params
@FUZZ
@given(name=st.sampled_from(sorted(REGISTRY)), data=st.data())
def test_fuzz_strategy_parameters_are_valid_or_a_request_error(tiny_engine, name, data):
    from paradec.strategies import RequestError, Request, get
    strat = get(name)
    keys = st.sampled_from(list(strat.params) + ["_long_ok", "x"]) | st.text(max_size=6)
    params = data.draw(st.dictionaries(keys, VALUES, max_size=3))
    try:
        out = strat.resolve_params(Request(prompt="hi", params=params), tiny_engine)
    except RequestError:
        return
    for k, p in strat.params.items():     # accepted: typed, finite, in range
        v = out[k]
        assert isinstance(v, p.kind) and not (p.kind is not bool and isinstance(v, bool)), (k, v)
        if p.kind in (int, float):
            assert v == v and abs(v) != float("inf")
            assert (p.low is None or v >= p.low) and (p.high is None or v <= p.high)


def test_strategy_parameters_reject_non_finite_numbers():
    from paradec.strategies import RequestError, Request, get
    for name, key in (("pld", "max_ngram"), ("lookahead", "window"), ("sot-r", "threshold")):
        for v in (float("nan"), float("inf"), float("-inf")):
            with pytest.raises(RequestError):
                get(name).resolve_params(Request(prompt="x", params={key: v}))


# ---------------------------------------------------------------------------------------------- fuzzing: eval sets
ROW_VALUES = st.one_of(st.text(max_size=20), st.sampled_from(["", " ", "\x00", "=1+1", "<b>x</b>", "a|b", "\ufeff",
                                                             "ok\x00ok", "p\x00"]),
                       st.integers(-5, 5), st.none(), st.booleans(), st.lists(st.text(max_size=5), max_size=3))


@st.composite
def evalset_files(draw):
    kind = draw(st.sampled_from(["csv", "jsonl", "json", "bytes"]))
    rows = draw(st.lists(st.dictionaries(st.sampled_from(["prompt", "id", "category", "reference", "chat", "turns",
                                                          "question_id", "x"]), ROW_VALUES, max_size=5),
                         max_size=5))
    if kind == "bytes":
        return draw(st.sampled_from(["a.csv", "a.jsonl", "a.json", "a.txt"])), draw(st.binary(max_size=200))
    if kind == "csv":
        cols = sorted({k for r in rows for k in r}) or ["prompt"]
        lines = [",".join(cols)] + [",".join(str(r.get(c, "")).replace("\n", " ") for c in cols) for r in rows]
        return "set.csv", "\n".join(lines).encode("utf-8", "surrogatepass")
    if kind == "json":
        return "set.json", json.dumps(rows).encode()
    return "set.jsonl", "\n".join(json.dumps(r) for r in rows).encode()


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory):
    from paradec.store import Store
    s = Store(f"sqlite:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.db'}")
    yield s
    s.close()


@FUZZ
@given(f=evalset_files())
def test_fuzz_evalset_upload_stores_all_or_nothing(tiny_engine, fuzz_store, tmp_path_factory, f):
    """Through the Eval sets tab's upload handler: a valid file is stored whole, a rejected one changes nothing;
    nothing raises but the validator's EvalSetError (shown as a message)."""
    from paradec import evalsets
    from paradec.ui.evalsets_tab import EvalSetsTab
    name, data = f
    try:
        es = evalsets.load_eval_set(data, filename=name)
    except evalsets.EvalSetError as e:
        es = None
        assert e.errors and all(isinstance(x, str) for x in e.errors)
    if es is not None:
        for it in es.items:
            assert it.turns and all(t.strip() and "\x00" not in t for t in it.turns)
            assert "\x00" not in it.category and "\x00" not in it.item_id
    path = tmp_path_factory.mktemp("up") / Path(name).name
    try:
        path.write_bytes(data)
    except (OSError, ValueError):
        return
    before = fuzz_store.counts()
    msg, _, _ = EvalSetsTab(tiny_engine, fuzz_store).upload(str(path))
    after = fuzz_store.counts()
    if msg.startswith("**Stored"):
        assert after["eval_sets"] == before["eval_sets"] + 1
        assert after["eval_items"] == before["eval_items"] + len(es.items)
    else:
        assert "Not stored" in msg and after == before
    for bad in ("<b>", "<img", "<script"):
        assert bad not in msg


# ---------------------------------------------------------------------------------------------- eval sets, app
def test_nul_bytes_in_prompts_are_rejected(tmp_path):
    from paradec.evalsets import EvalSetError, load_eval_set
    for name, data in (("a.csv", b"prompt,category\nhello\x00world,x\n"),
                       ("a.jsonl", b'{"prompt": "hello\\u0000world"}\n'),
                       ("b.jsonl", b'{"prompt": "ok", "category": "c\\u0000"}\n'),
                       ("c.jsonl", b'{"turns": ["ok", "no\\u0000"]}\n')):
        with pytest.raises(EvalSetError, match="NUL"):
            load_eval_set(data, filename=name)


def test_upload_success_message_shows_categories_as_text(tiny_engine, tmp_path):
    from paradec.store import Store
    from paradec.ui.evalsets_tab import EvalSetsTab
    store = Store(f"sqlite:///{tmp_path / 'u.db'}")
    f = tmp_path / "cats.jsonl"
    cats = ["<b>bold</b>", "<a href='http://x'>link</a>", "<img src=x onerror=alert(1)>", "[md](javascript:alert(1))",
            "**strong**"]
    f.write_text("\n".join(json.dumps({"prompt": f"p{i}", "category": c}) for i, c in enumerate(cats)))
    msg, _, _ = EvalSetsTab(tiny_engine, store).upload(str(f))
    assert msg.startswith("**Stored")
    for bad in ("<b>", "<a ", "<img", "](javascript", "**strong**"):
        assert bad not in msg, msg
    assert "&lt;img src=x onerror=alert\\(1\\)&gt;" in msg
    store.close()


def test_app_length_check_counts_the_chat_template_and_max_new_tokens(tiny_engine, tmp_path):
    """A prompt that fits the context alone but not with the chat template + max_new_tokens is refused before a
    run is stored (it used to run and 'finish' with every row failed)."""
    import gradio as gr

    from paradec.evalsets import load_eval_set
    from paradec.store import Store
    from paradec.ui.evalsets_tab import EvalSetsTab
    store = Store(f"sqlite:///{tmp_path / 'l.db'}")
    tok = tiny_engine.tokenizer
    prompt = "hello "
    while len(tok(prompt)["input_ids"]) < tiny_engine.context_length - 40:
        prompt += "hello "
    raw_n = len(tok(prompt)["input_ids"])
    assert raw_n <= tiny_engine.context_length
    f = tmp_path / "long.jsonl"
    f.write_text(json.dumps({"prompt": prompt}) + "\n" + json.dumps({"prompt": "short"}) + "\n")
    tab = EvalSetsTab(tiny_engine, store)
    msg, _, _ = tab.upload(str(f))
    assert msg.startswith("**Stored"), msg
    set_id = store.list_eval_sets()[0]["id"]
    runs = len(store.list_runs())
    with pytest.raises(gr.Error, match="do not fit"):
        tab.run(f"set:{set_id}", ["ar"], 64, 1, 0, progress=lambda *a, **k: None)
    assert len(store.list_runs()) == runs
    assert load_eval_set(f)   # the file itself is fine: only this run's settings make it too long
    store.close()


def test_markdown_table_survives_pipes_in_categories():
    from paradec.bench import markdown
    row = dict(category="a|b\nc", strategy="pld", speedup=1.0, e2e_speedup=1.0, tokens_per_s=1.0,
               tokens_per_pass=1.0, ttft_p50=0.1, tpot_p50=0.01, rouge_l_vs_ar=1.0, rouge_l_vs_ref=None,
               perplexity=None, lossless_mismatches=0, n=1)
    lines = markdown([row]).strip().splitlines()
    cells = [len(ln.replace("\\|", "").split("|")) for ln in lines]
    assert len(set(cells)) == 1, lines


# ---------------------------------------------------------------------------------------------- 5, 6. CSV export
FORMULAS = ["=HYPERLINK(\"http://evil\",\"x\")", "=1+1", "+cmd|' /C calc'!A0", "-2+3", "@SUM(A1)", "\t=1", "\r=1"]


def _results_store(path, n_runs=4):
    from paradec.store import Store
    store = Store(f"sqlite:///{path}")
    ids = []
    for r in range(n_runs):
        rid = store.create_run("race", name=FORMULAS[r % len(FORMULAS)], model="m")
        for i, f in enumerate(FORMULAS):
            for s in ("ar", "pld"):
                store.add_result(rid, item_key=f"{r}-{i}", category=f, strategy=s, prompt=f, text=f, n_tokens=3,
                                 tokens_per_s=10.0 + i, e2e_s=0.3, ttft_s=0.1, forward_passes=3)
        store.finish_run(rid)
        ids.append(rid)
    return store, ids


def _export_path(outputs):
    for o in outputs:
        v = o.get("value") if isinstance(o, dict) else None
        if isinstance(v, str) and v.endswith(".csv"):
            return Path(v)
    raise AssertionError("no CSV among the outputs")


def test_csv_export_neutralises_formulas_and_is_one_file_per_request(tmp_path):
    from paradec.ui.dashboard import Dashboard
    store, ids = _results_store(tmp_path / "csv.db")
    dash = Dashboard(store)
    n = 12
    barrier, got, errors = threading.Barrier(n), {}, []

    def work(i):
        rid = ids[i % len(ids)]
        try:
            barrier.wait(10)
            path = _export_path(dash.show([rid], "all", [], [], ""))
            with path.open(encoding="utf-8", newline="") as fh:
                got[i] = (rid, path, fh.read())
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len({p for _, p, _ in got.values()}) == n          # one file per request
    for rid, path, text in got.values():
        rows = list(csv.DictReader(io.StringIO(text, newline="")))
        assert rows and {int(r["run_id"]) for r in rows} == {rid}, path    # its own rows only
        for r in rows:
            for k, v in r.items():
                assert not v.startswith(("=", "+", "@", "\t", "\r")), (k, v)
                if v.startswith("-"):
                    float(v)                                   # only numbers may start with '-'
        assert {r["category"] for r in rows} == {"'" + f for f in FORMULAS}
    store.close()


def test_every_csv_the_project_writes_goes_through_the_safe_writer():
    offenders = []
    for p in list((ROOT / "paradec").rglob("*.py")) + list((ROOT / "evals").glob("*.py")) + [ROOT / "app.py"]:
        if p.name == "csvsafe.py":
            continue
        text = p.read_text(encoding="utf-8")
        if ".to_csv(" in text or "csv.writer(" in text or "csv.DictWriter(" in text:
            offenders.append(str(p.relative_to(ROOT)))
    assert not offenders, offenders


# ---------------------------------------------------------------------------------------------- 7. resume
def _cli(*args, wait=True):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "paradec", *args], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if not wait:
        return p
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err


def _rows(db):
    with sqlite3.connect(db) as c:
        return c.execute("select item_key, strategy, repeat, turn from results").fetchall()


def _app_suite_run(db, limit=6, status="interrupted", done=2, **kw):
    """A run as the Eval sets tab makes it for a built-in suite: source 'suite:qa', no eval_set_id."""
    from paradec.bench import BenchSettings
    from paradec.evalsets import load_suite
    from paradec.store import Store
    store = Store(f"sqlite:///{db}")
    settings = BenchSettings(strategies=["ar"], **{"max_new_tokens": 4, **kw})
    rid = store.create_run("eval", name="suite qa", model="m", settings={"bench": asdict(settings),
                                                                      "source": "suite:qa", "limit": limit})
    for it in load_suite("qa").items[:done]:
        store.add_result(rid, item_key=it.item_id, category=it.category, strategy="ar", repeat=0, turn=0, text="x")
    if status != "running":
        store.finish_run(rid, status)
    store.close()
    return rid


def test_bench_resume_completes_a_suite_run_made_in_the_app(model_dir, tmp_path):
    db = tmp_path / "r.db"
    rid = _app_suite_run(db)
    rc, out, err = _cli("bench", "--model", str(model_dir), "--resume", str(rid), "--db", str(db), "--no-roofline",
                        "--json")
    assert rc == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    assert res["skipped"] == 2 and res["stored"] == 4
    rows = _rows(db)
    assert len(rows) == len(set(rows)) == 6
    with sqlite3.connect(db) as c:
        assert c.execute("select status from runs where id=?", (rid,)).fetchone()[0] == "finished"


def test_the_app_resumes_a_cli_run_and_the_cli_an_app_run(tiny_engine, tmp_path):
    """One plan for both: the Eval sets tab's resume handler finishes an app suite run (no eval_set_id)."""
    from paradec.store import Store
    from paradec.ui.evalsets_tab import EvalSetsTab
    db = tmp_path / "a.db"
    rid = _app_suite_run(db, limit=4)
    store = Store(f"sqlite:///{db}")
    msg = EvalSetsTab(tiny_engine, store).resume(rid, progress=lambda *a, **k: None)[0]
    assert "finished" in msg and store.get_run(rid)["n_results"] == 4
    store.close()


@pytest.mark.slow
def test_two_resumes_of_one_run_one_refuses(model_dir, tmp_path):
    from paradec.store import Store, StoreError
    db = tmp_path / "two.db"
    # in one process: two threads released together
    # enough work (40 prompts x 300 tokens) that the first resumer is still running when the second process,
    # which needs seconds to start, tries to claim the run
    rid = _app_suite_run(db, limit=40, done=1, max_new_tokens=300, ignore_eos=True, perplexity=False, warmup=False)
    barrier, outcome = threading.Barrier(2), []

    def claim():
        s = Store(f"sqlite:///{db}")
        barrier.wait(10)
        try:
            s.resume_run(rid)
            outcome.append("ok")
        except StoreError as e:
            outcome.append(str(e))
        s.close()
    ts = [threading.Thread(target=claim) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert sorted(outcome)[0] == "ok" and "being r" in sorted(outcome)[1], outcome
    Store(f"sqlite:///{db}").finish_run(rid, "interrupted")
    # two processes: the second refuses while the first runs; the first completes without duplicates
    first = _cli("bench", "--model", str(model_dir), "--resume", str(rid), "--db", str(db), "--no-roofline",
                 "--json", wait=False)
    t0 = time.time()
    while time.time() - t0 < 120 and len(_rows(db)) < 3 and first.poll() is None:
        time.sleep(0.2)
    rc, _, err = _cli("bench", "--model", str(model_dir), "--resume", str(rid), "--db", str(db), "--no-roofline")
    out1, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert rc == 2 and "being run right now" in err and "Traceback" not in err, err
    rows = _rows(db)
    assert len(rows) == len(set(rows)) == 40


# ---------------------------------------------------------------------------------------------- 8. CLI errors
@pytest.mark.slow
def test_cli_bad_input_is_one_line_not_a_traceback(model_dir, tmp_path):
    from paradec.store import Store
    db = tmp_path / "c.db"
    store = Store(f"sqlite:///{db}")
    race = store.create_run("race", name="a race", settings={"strategies": ["ar"]})
    store.finish_run(race)
    store.close()
    cases = [
        (["bench", "--suite", "qa", "--strategies", "ar", "--db", "notadb://x"], "cannot be opened"),
        (["bench", "--suite", "qa", "--strategies", "ar", "--db", str(tmp_path / "is-a-dir")], "cannot be opened"),
        (["bench", "--model", str(model_dir), "--suite", "qa", "--strategies", "ar", "--db", str(db),
          "--params", "{bad"], "--params is not valid JSON"),
        (["bench", "--model", str(model_dir), "--suite", "qa", "--strategies", "ar,pld", "--db", str(db),
          "--params", '{"pld": {"nope": 1}}'], "unknown parameter"),
        (["bench", "--model", str(model_dir), "--suite", "qa", "--strategies", "ar,pld", "--db", str(db),
          "--params", '{"pld": {"max_ngram": "3"}}'], "whole number"),
        (["bench", "--model", str(model_dir), "--resume", str(race), "--db", str(db)], "not a benchmark"),
        (["bench", "--model", str(model_dir), "--resume", "999", "--db", str(db)], "there is no run 999"),
    ]
    (tmp_path / "is-a-dir").mkdir()
    (tmp_path / "is-a-dir" / "x").mkdir()
    cases[1] = (["bench", "--suite", "qa", "--strategies", "ar", "--db", f"sqlite:///{tmp_path / 'is-a-dir'}"],
                "cannot be opened")
    for args, want in cases:
        rc, out, err = _cli(*args)
        assert rc == 2 and want in err, (args, rc, err[-800:])
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    with sqlite3.connect(db) as c:
        assert c.execute("select count(*) from runs").fetchone()[0] == 1     # nothing stored by the failures
