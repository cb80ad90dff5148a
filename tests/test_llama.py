"""llama.cpp as an optional peer of the benchmark (issue 24): the agreement report, and, where `./run.sh llama` has
built llama-cpp-python into .venv-llama, a real llama.cpp server on the default model's GGUF as a `--peer` lane."""
import json
import socket
import subprocess
import sys
import time

import httpx
import pytest

from conftest import ROOT
from paradec.store import Store

sys.path.insert(0, str(ROOT / "evals"))
from peer_agreement import agreement  # noqa: E402

LLAMA_PY = ROOT / ".venv-llama" / "bin" / "python"


def _row(item, strategy, text, turn=0, error=None):
    return dict(item_key=item, strategy=strategy, repeat=0, turn=turn, text=text, error=error)


def test_peer_agreement_counts_identical_texts_and_where_they_part():
    rows = [_row("a", "ar", "def f(x):\n    return x"), _row("a", "llama", "def f(x):\n    return x"),
            _row("b", "ar", "abcdefghij"), _row("b", "llama", "abcdeXXXXX"),
            _row("c", "ar", "one"), _row("c", "llama", "", error="RemoteError: down"),
            _row("d", "llama", "no ar row for this turn")]
    got = agreement(rows)
    assert set(got) == {"llama"}
    assert got["llama"]["turns"] == 2 and got["llama"]["identical"] == 1
    assert got["llama"]["shared_fraction_mean"] == pytest.approx((1.0 + 0.5) / 2, abs=1e-3)
    assert got["llama"]["shared_chars_p50"] == pytest.approx((22 + 5) / 2)   # len("def f(x):\n    return x") == 22


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.skipif(not LLAMA_PY.exists(), reason="llama.cpp is optional: `./run.sh llama --build-only` builds it")
def test_llama_cpp_server_is_a_peer_lane_of_a_bench_run(tmp_path):
    """`./run.sh llama` serves the checked GGUF; a bench run with `--peer llama=ar@URL` stores its rows beside
    paradec's, counts one token per streamed chunk (the count the default model's tokenizer gives for the text),
    and never counts the peer as a lossless mismatch."""
    from transformers import AutoTokenizer

    from paradec import provision
    model = provision.ensure_default()          # what a user's first run does; the GGUF is assembled by run.sh
    port = _free_port()
    srv = subprocess.Popen(["bash", str(ROOT / "run.sh"), "llama", "--port", str(port)], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            assert srv.poll() is None, srv.stderr.read()[-2000:]
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "llama.cpp did not start in 300 s"
            time.sleep(1)
        db = tmp_path / "l.db"
        p = subprocess.run([sys.executable, "-m", "paradec", "bench", "--suite", "code-edit", "--limit", "1",
                            "--strategies", "ar", "--peer", f"llama=ar@{url}", "--max-new-tokens", "24",
                            "--no-roofline", "--no-perplexity", "--db", str(db), "--json"],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        res = json.loads(p.stdout.strip().splitlines()[-1])
        rows = {r["strategy"]: r for r in Store(db).get_results(res["run"])}
        assert set(rows) == {"ar", "llama"}
        peer = rows["llama"]
        assert peer["error"] is None and peer["text"].strip()
        tok = AutoTokenizer.from_pretrained(str(model))
        assert peer["n_tokens"] == len(tok(peer["text"], add_special_tokens=False).input_ids)
        assert 0 < peer["n_tokens"] <= 24
        assert peer["quality"]["lossless_strategy"] is False
        table = {r["strategy"]: r for r in res["table"] if r["category"] == "all"}
        assert table["llama"]["lossless_mismatches"] in (0, None)
    finally:
        import os
        import signal
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait(timeout=30)
