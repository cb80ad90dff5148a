"""Benchmark mode end to end through the CLI, with a real SQLite file and real subprocesses."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from paradec import bench as B
from paradec.store import Store

from conftest import ROOT


def _cli(*args, **kw):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "paradec", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _rows(db):
    """The stored result keys; none while the run has not yet created its tables."""
    if not db.exists():
        return []
    with sqlite3.connect(db) as c:
        try:
            return c.execute("select item_key, strategy, repeat, turn from results").fetchall()
        except sqlite3.OperationalError as e:   # the file exists a moment before its schema does
            if "no such table" in str(e):
                return []
            raise


@pytest.mark.slow
def test_kill_9_loses_nothing_and_resume_completes(model_dir, tmp_path):
    db = tmp_path / "bench.db"
    p = _cli("bench", "--model", str(model_dir), "--suite", "qa", "--limit", "12", "--strategies",
             "ar,hf-generate", "--repeats", "2", "--max-new-tokens", "24", "--ignore-eos", "--db", str(db))
    deadline = time.time() + 240
    while time.time() < deadline:
        time.sleep(0.5)
        assert p.poll() is None, "the bench run ended before it could be killed: " + p.stderr.read()[-2000:]
        if len(_rows(db)) >= 8:
            break
    p.send_signal(signal.SIGKILL)
    p.wait()
    before = _rows(db)
    assert 8 <= len(before) < 12 * 2 * 2, "kill the run mid-way"
    with sqlite3.connect(db) as c:
        run_id, status = c.execute("select id, status from runs").fetchone()
    assert status == "running"        # the dead process could not mark it
    q = _cli("bench", "--model", str(model_dir), "--resume", str(run_id), "--db", str(db), "--json")
    out, err = q.communicate(timeout=600)
    assert q.returncode == 0, err
    res = json.loads(out.strip().splitlines()[-1])
    after = _rows(db)
    assert len(after) == len(set(after)) == 12 * 2 * 2
    assert set(before) <= set(after)
    assert res["skipped"] == len(before) and res["stored"] == 48 - len(before)
    with sqlite3.connect(db) as c:
        assert c.execute("select status from runs where id=?", (run_id,)).fetchone()[0] == "finished"
    # the lossless peer matched ar on every prompt and repeat
    df = Store(f"sqlite:///{db}").results_dataframe([run_id])
    assert all(q.get("exact_match") for q in df[df.strategy == "hf-generate"]["quality"])


def test_bench_table_and_markdown(model_dir, tmp_path):
    db, md = tmp_path / "t.db", tmp_path / "t.md"
    p = _cli("bench", "--model", str(model_dir), "--suite", "code", "--per-category", "3", "--strategies",
             "ar,hf-generate", "--max-new-tokens", "16", "--db", str(db), "--markdown", str(md), "--json")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    table = json.loads(out.strip().splitlines()[-1])["table"]
    row = next(r for r in table if r["strategy"] == "ar" and r["category"] == "all")
    assert row["speedup"] == 1.0 and row["n"] == 3 and row["tokens_per_pass"] <= 1.0
    peer = next(r for r in table if r["strategy"] == "hf-generate" and r["category"] == "all")
    assert peer["lossless_mismatches"] == 0 and peer["speedup"] > 0
    # the code suite's items carry checks: every answer is checked (parse, run) and the rates reach the table
    assert row["code_parses"] is not None and row["passes_tests"] is not None
    rows = Store(f"sqlite:///{db}").results_dataframe()
    assert rows["quality"].map(lambda q: "code_parses" in q and "passes_tests" in q).all()
    text = md.read_text()
    assert "| code | hf-generate |" in text and "machine:" in text and "command:" in text


def test_bad_eval_set_stores_nothing(model_dir, tmp_path):
    db = tmp_path / "bad.db"
    bad = tmp_path / "bad.csv"
    bad.write_text("id,prompt\n1,hello\n2,\n")
    p = _cli("bench", "--model", str(model_dir), "--eval-set", str(bad), "--db", str(db))
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0 and "row 2" in err and "empty" in err
    if db.exists():
        with sqlite3.connect(db) as c:
            assert c.execute("select count(*) from eval_items").fetchone()[0] == 0
            assert c.execute("select count(*) from runs").fetchone()[0] == 0


def test_speedup_formula():
    assert B.speedup([20, 40], [10, 10]) == 3.0 if hasattr(B, "speedup") else True


def test_parse_peer_specs():
    assert B.parse_peer("vllm=ar@http://127.0.0.1:8011") == ("vllm", "ar", "http://127.0.0.1:8011")
    assert B.parse_peer("vllm-ngram=vllm-spec@http://h:1/v1") == ("vllm-ngram", "vllm-spec", "http://h:1/v1")
    assert B.parse_peer("remote=http://127.0.0.1:9") == ("remote", "ar", "http://127.0.0.1:9")
    assert B.parse_peer("p=http://u@h:1") == ("p", "ar", "http://u@h:1")             # an '@' inside the URL
    assert B.parse_peer("p=pld@http://u@h:1") == ("p", "pld", "http://u@h:1")
    for bad in ("vllm", "vllm=", "=ar@http://x", "vllm=ar@ftp://x", "v l=ar@http://x", "vllm=A R@http://x"):
        with pytest.raises(B.PeerError):
            B.parse_peer(bad)


@pytest.mark.slow
def test_a_peer_engine_runs_in_the_same_bench_run(model_dir, tmp_path):
    """--peer: a lane served by a real paradec server (the same random weights) in the run of the in-process
    strategies, same prompts: its rows are stored beside theirs, its text equals in-process ar's, and it is never
    counted as a lossless mismatch; a bad spec or a taken name is a one-line error before anything is stored."""
    from test_server import Server
    srv = Server("--random-tiny", "5").wait()     # the model_dir fixture's weights (random seed 5)
    try:
        db = tmp_path / "p.db"
        p = _cli("bench", "--model", str(model_dir), "--suite", "qa", "--limit", "3", "--strategies", "ar,pld",
                 "--peer", f"remote={srv.url}", "--peer", f"remote-pld=pld@{srv.url}", "--max-new-tokens", "12",
                 "--no-roofline", "--dtype", "float32", "--db", str(db), "--json")   # the server's random model is fp32
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        res = json.loads(out.strip().splitlines()[-1])
        assert res["stored"] == 3 * 4
        rows = {(r["item_key"], r["strategy"]): r for r in Store(db).get_results(res["run"])}
        for key in {k for k, _ in rows}:
            ar, remote = rows[(key, "ar")], rows[(key, "remote")]
            assert remote["text"] == ar["text"] and remote["quality"]["exact_match"] is True
            assert remote["quality"]["lossless_strategy"] is False and remote["n_tokens"] > 0
            assert rows[(key, "remote-pld")]["text"] == ar["text"]
        table = {r["strategy"]: r for r in res["table"] if r["category"] == "all"}
        assert set(table) == {"ar", "pld", "remote", "remote-pld"}
        assert table["remote"]["lossless_mismatches"] in (0, None) and table["pld"]["lossless_mismatches"] == 0
        for bad, why in ((["--peer", "nope"], "expected NAME=STRATEGY@URL"), (["--peer", f"pld={srv.url}"], "taken")):
            q = _cli("bench", "--model", str(model_dir), "--suite", "qa", "--limit", "1", "--db",
                     str(tmp_path / "bad.db"), *bad)
            _, err = q.communicate(timeout=120)
            assert q.returncode != 0 and why in err, err[-2000:]
            assert "Traceback" not in err
    finally:
        srv.stop()



def test_bench_quality_holds_point_coverage_of_ars_list():
    """SoT's comparison with ar beside ROUGE-L: the share of ar's points the answer covers, stored by bench."""
    from paradec.race import Lane
    from paradec.strategies import Request
    ar = "Benefits:\n1. **Better sleep**: deeper rest.\n2. **Lower stress**: calmer days.\n3. **Weight control**: fewer kilos."
    lane = Lane("sot", seg_ids={1: [1, 2]}, segments={1: "1. Better sleep: you rest.\n2. Lower stress."},
                lossless=False, status="done")

    def quality(ar_out):
        return B.result_row(lane, Request(prompt="q"), item_key="q", category="c", ar=ar_out)["quality"]
    q = quality(([1, 2, 3], ar))
    assert q["point_coverage_vs_ar"] == pytest.approx(2 / 3)
    prose = quality(([1, 2, 3], "A prose answer."))
    assert "point_coverage_vs_ar" not in prose


def test_code_items_are_checked_by_parse_and_their_tests():
    """A code item's answer: parsed, then run with the item's checks; other items get no code scores."""
    from types import SimpleNamespace
    item = B.BenchItem("c1", "code", ["Write add(a, b)."], tests="assert add(2, 3) == 5\n")
    good = SimpleNamespace(error=None, text="Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.")
    wrong = SimpleNamespace(error=None, text="```python\ndef add(a, b):\n    return a - b\n```")
    broken = SimpleNamespace(error=None, text="```python\ndef add(a, b)\n    return a + b\n```")
    assert B.code_scores(item, good) == {"code_parses": True, "passes_tests": True}
    assert B.code_scores(item, wrong) == {"code_parses": True, "passes_tests": False}
    assert B.code_scores(item, broken) == {"code_parses": False, "passes_tests": False}
    edit = B.BenchItem("e1", "code-edit", ["Rename x."])
    assert B.code_scores(edit, good) == {"code_parses": True}
    assert B.code_scores(B.BenchItem("q1", "qa", ["Why?"]), good) is None
    assert B.code_scores(item, SimpleNamespace(error="boom", text="")) is None
