"""The results store on real SQLite files."""
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from paradec.evalsets import EvalItem, EvalSet
from paradec.store import Store, StoreError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def store(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'p.db'}")
    yield s
    s.close()


def _run(store, **kw):
    return store.create_run("bench", name="t", model="m", device="cpu", dtype="float32",
                            environment={"torch": "x"}, strategies=["ar", "pld"], settings={"repeats": 2}, **kw)


def test_round_trip(store):
    rid = _run(store)
    res = store.add_result(rid, item_key="q1", category="code", strategy="ar", repeat=0, prompt="p", text="hello",
                           token_ids=[1, 2, 3], n_tokens=3, forward_passes=3, ttft_s=0.01, e2e_s=0.03,
                           tokens_per_s=100.0, tpot_s=0.01, tokens_per_pass=1.0, itl=[0.01, 0.01],
                           quality={"exact_match": 1.0, "rouge_l_vs_ref": 0.5})
    store.add_result(rid, item_key="q1", category="code", strategy="pld", repeat=0, text="hello", token_ids=[1, 2, 3],
                     n_tokens=3, forward_passes=2, drafted=2, accepted=1, quality={"exact_match": 1.0})
    run = store.get_run(rid)
    assert run["status"] == "running" and run["n_results"] == 2 and run["strategies"] == ["ar", "pld"]
    assert run["environment"] == {"torch": "x"} and run["settings"] == {"repeats": 2}
    assert run["pid"] == os.getpid()
    store.finish_run(rid, "finished")
    assert store.get_run(rid)["status"] == "finished" and store.get_run(rid)["finished_at"] is not None
    rows = store.get_results(rid)
    assert rows[0]["id"] == res and rows[0]["token_ids"] == [1, 2, 3] and rows[0]["itl"] == [0.01, 0.01]
    df = store.results_dataframe(rid)
    assert len(df) == 2
    assert set(df["strategy"]) == {"ar", "pld"}
    assert (df["model"] == "m").all() and (df["device"] == "cpu").all() and (df["dtype"] == "float32").all()
    assert "run_created_at" in df.columns and df.loc[df.strategy == "ar", "q_rouge_l_vs_ref"].item() == 0.5
    assert store.results_dataframe(rid, strategies=["pld"])["forward_passes"].tolist() == [2]
    assert "text" not in store.results_dataframe(light=True).columns
    assert store.results_dataframe(run_ids=[rid + 99]).empty
    assert [r["id"] for r in store.list_runs()] == [rid] and store.list_runs()[0]["n_results"] == 2
    with pytest.raises(StoreError, match="unknown result field"):
        store.add_result(rid, item_key="q2", strategy="ar", nonsense=1)
    with pytest.raises(StoreError, match="kind"):
        store.create_run("sprint")


def test_wal_mode_and_foreign_keys(store, tmp_path):
    assert store.journal_mode() == "wal"
    _run(store)
    con = sqlite3.connect(tmp_path / "p.db")           # an independent connection sees the persistent mode
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    con.close()
    with pytest.raises(StoreError, match="no run 12345"):
        store.add_result(12345, item_key="q", strategy="ar")
    assert store.counts()["results"] == 0


def test_duplicate_results_impossible(store, tmp_path):
    rid = _run(store)
    a = store.add_result(rid, item_key="q1", strategy="ar", repeat=0, text="first")
    b = store.add_result(rid, item_key="q1", strategy="ar", repeat=0, text="second")
    assert a == b and store.counts()["results"] == 1
    assert store.get_results(rid)[0]["text"] == "first"
    # other repeat / turn / strategy are different rows
    store.add_result(rid, item_key="q1", strategy="ar", repeat=1)
    store.add_result(rid, item_key="q1", strategy="ar", repeat=0, turn=1)
    assert store.counts()["results"] == 3
    # the schema itself refuses a duplicate, whoever writes
    con = sqlite3.connect(tmp_path / "p.db")
    with pytest.raises(sqlite3.IntegrityError):
        con.execute("INSERT INTO results (run_id, item_key, category, strategy, repeat, turn, prompt, text, n_tokens,"
                    " forward_passes, draft_passes, drafted, accepted, created_at)"
                    " VALUES (?, 'q1', '', 'ar', 0, 0, '', '', 0, 0, 0, 0, 0, '2026-01-01')", (rid,))
    con.close()


def test_done_keys_and_error_retry(store):
    rid = _run(store)
    store.add_result(rid, item_key="a", strategy="ar", repeat=0)
    store.add_result(rid, item_key="a", strategy="pld", repeat=0, turn=1)
    bad = store.add_result(rid, item_key="b", strategy="ar", repeat=0, error="CUDA out of memory")
    assert store.done_keys(rid) == {("a", "ar", 0, 0), ("a", "pld", 0, 1)}
    assert ("b", "ar", 0, 0) in store.done_keys(rid, include_errors=True)
    # a resumed run retries the failed row: replaced in place, never duplicated
    again = store.add_result(rid, item_key="b", strategy="ar", repeat=0, text="ok", n_tokens=2)
    assert again == bad and store.counts()["results"] == 3
    row = [r for r in store.get_results(rid) if r["item_key"] == "b"][0]
    assert row["error"] is None and row["text"] == "ok"
    assert ("b", "ar", 0, 0) in store.done_keys(rid)
    for key in store.done_keys(rid):         # what a resumed run reads back for a skipped key
        assert store.get_result(rid, *key)["item_key"] == key[0]
    assert store.get_result(rid, "b", "ar", 0, 0)["text"] == "ok"
    assert store.get_result(rid, "b", "ar", 5, 0) is None
    assert store.done_keys(rid + 1) == set()


def test_deleting_a_run_deletes_its_results(store):
    rid = _run(store)
    store.add_result(rid, item_key="race", strategy="ar")
    store.delete_run(rid)
    assert store.counts() == {"runs": 0, "eval_sets": 0, "eval_items": 0, "results": 0}


def _set(ids):
    return EvalSet(name="s", format="jsonl",
                   items=[EvalItem(item_id=i, category="c", turns=[f"prompt {i}", "again"], references=["r", None])
                          for i in ids])


def test_eval_set_saved_and_loaded(store):
    sid = store.save_eval_set(_set(["a", "b", "c"]))
    info = store.list_eval_sets()
    assert [s["id"] for s in info] == [sid] and info[0]["n_items"] == 3 and info[0]["format"] == "jsonl"
    items = store.get_eval_set_items(sid)
    assert [i["item_id"] for i in items] == ["a", "b", "c"] and [i["position"] for i in items] == [0, 1, 2]
    assert items[0]["prompt"] == "prompt a" and items[0]["turns"] == ["prompt a", "again"]
    assert items[0]["reference"] == "r" and items[0]["references"] == ["r", None]
    back = store.load_eval_set(sid)
    assert [it.item_id for it in back.items] == ["a", "b", "c"] and back.items[1].reference_for(0) == "r"
    rid = _run(store, eval_set_id=sid)
    assert store.get_run(rid)["eval_set_id"] == sid
    store.delete_eval_set(sid)
    assert store.counts()["eval_items"] == 0 and store.get_run(rid)["eval_set_id"] is None


def test_eval_set_is_all_or_nothing(store):
    """The 4th item repeats an id: the unique constraint fails mid-way and nothing at all is stored."""
    with pytest.raises(StoreError, match="nothing stored"):
        store.save_eval_set(_set(["a", "b", "c", "a", "d"]))
    assert store.counts()["eval_sets"] == 0 and store.counts()["eval_items"] == 0
    with pytest.raises(StoreError):
        store.create_run("eval", eval_set_id=999)
    assert store.counts()["runs"] == 0


def test_interrupted_run_keeps_results_and_is_marked(tmp_path):
    """A real process writes two results and dies without finishing its run."""
    db = tmp_path / "crash.db"
    code = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from paradec.store import Store
        s = Store({str(db)!r})
        rid = s.create_run("bench", name="crashy")
        s.add_result(rid, item_key="1", strategy="ar")
        s.add_result(rid, item_key="2", strategy="ar")
        os._exit(3)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    s = Store(db)                              # a bare path works as well as a URL
    live = s.create_run("race")                # this process is alive: its run must stay 'running'
    [run] = [r for r in s.list_runs() if r["name"] == "crashy"]
    assert run["status"] == "running" and run["n_results"] == 2
    assert s.mark_interrupted_runs() == [run["id"]]
    assert s.get_run(run["id"])["status"] == "interrupted"
    assert s.get_run(live)["status"] == "running"
    assert s.done_keys(run["id"]) == {("1", "ar", 0, 0), ("2", "ar", 0, 0)}
    s.resume_run(run["id"])
    assert s.get_run(run["id"])["status"] == "running" and s.get_run(run["id"])["pid"] == os.getpid()
    s.close()


def test_default_url_from_env(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "env.db"
    monkeypatch.setenv("PARADEC_DB", f"sqlite:///{target}")
    s = Store()
    _run(s)
    assert target.exists() and s.counts()["runs"] == 1
    s.close()


def test_pid_reuse_is_not_mistaken_for_a_live_run(store):
    """A run whose pid now belongs to another process (same pid, different start) is interrupted."""
    mine = _run(store)
    reused = _run(store)
    store.update_run(reused, process_tag="some-other-boot:12345")
    assert store.mark_interrupted_runs() == [reused]
    assert store.get_run(mine)["status"] == "running"


def test_old_database_gains_new_columns(tmp_path):
    db = tmp_path / "old.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY, created_at DATETIME, kind VARCHAR(16), "
                "status VARCHAR(16), name VARCHAR(200))")
    con.execute("INSERT INTO runs (kind, status, name) VALUES ('bench', 'finished', 'old')")
    con.commit()
    con.close()
    s = Store(db)
    assert s.list_runs()[0]["name"] == "old" and s.list_runs()[0]["process_tag"] is None
    rid = _run(s)
    assert s.get_run(rid)["strategies"] == ["ar", "pld"]
    s.close()


def test_make_reference_add_appends_runs_with_their_sets_and_results(tmp_path):
    """`python -m evals.make_reference --add SRC DST`: every run of SRC lands in DST under new ids, with its eval
    set, items and results pointing at the new ids; DST's own runs stay; a missing DST is refused."""
    from evals import make_reference as MR

    def filled(path, names):
        s = Store(f"sqlite:///{path}")
        for name in names:
            sid = s.save_eval_set(_set(["a", "b"]), name=f"set of {name}")
            rid = s.create_run("bench", name=name, model="m", device="cpu", dtype="bfloat16", eval_set_id=sid)
            for item in ("a", "b"):
                s.add_result(rid, item_key=item, category="c", strategy="ar", text=f"{name}/{item}", n_tokens=3,
                             forward_passes=3, tokens_per_s=1.0)
            s.finish_run(rid)
        s.close()
        return path
    dst = filled(tmp_path / "ref.db", ["old-1", "old-2"])
    src = filled(tmp_path / "bench.db", ["new-1"])
    assert MR.main(["--add", str(src), str(dst)]) == 0
    s = Store(f"sqlite:///{dst}")
    runs = {r["name"]: r for r in s.list_runs()}
    assert set(runs) == {"old-1", "old-2", "new-1"} and len({r["id"] for r in runs.values()}) == 3
    new = runs["new-1"]
    assert sorted(r["text"] for r in s.get_results(new["id"])) == ["new-1/a", "new-1/b"]
    assert sorted(r["text"] for r in s.get_results(runs["old-1"]["id"])) == ["old-1/a", "old-1/b"]
    sets = {e["name"]: e["id"] for e in s.list_eval_sets()}
    assert s.get_run(new["id"])["eval_set_id"] == sets["set of new-1"]
    assert [i["item_id"] for i in s.get_eval_set_items(sets["set of new-1"])] == ["a", "b"]
    s.close()
    assert MR.main(["--add", str(src), str(tmp_path / "none.db")]) == 2
