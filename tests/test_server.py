"""The OpenAI-compatible server and the remote engine, over real HTTP on 127.0.0.1.

Each server is a real `python -m paradec.server --random-tiny` subprocess; its engine is built exactly like the
`tiny_engine` fixture, so greedy (and seeded) text through the server must equal the in-process text.
"""
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from paradec.remote import RemoteEngine, iter_sse, parse_prometheus, spec_counters, spec_delta
from paradec.strategies import REGISTRY, Request, RequestError, get, load_all

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "test-secret-token"
PROMPT = "How do I read a file line by line?"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        env.pop("PARADEC_TOKEN", None)
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"paradec-server-{self.port}.log", "w+")
        self.proc = subprocess.Popen([sys.executable, "-m", "paradec.server", "--random-tiny", "--port",
                                      str(self.port), "--threads", "1", "--log-level", "warning", *args],
                                     cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait(self, timeout=180):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("server did not come up")

    def health(self):
        r = httpx.get(self.url + "/health", timeout=10)
        assert r.status_code == 200
        return r.json()

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def servers():
    """main: token required; slow: --max-queue 1 and a pause per step; sot: a short pause per step."""
    s = {"main": Server("--token", TOKEN), "slow": Server("--max-queue", "1", "--step-delay", "0.05"),
         "sot": Server("--step-delay", "0.02")}
    try:
        for v in s.values():
            v.wait()
        yield s
    finally:
        for v in s.values():
            v.stop()


@pytest.fixture(scope="module")
def main(servers):
    return servers["main"]


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def post(server, path, body, headers=AUTH, raw=None):
    return httpx.post(server.url + path, content=raw if raw is not None else json.dumps(body),
                      headers={"Content-Type": "application/json", **headers}, timeout=60)


def sse_chunks(text):
    """Parse a whole SSE body; checks the framing and returns the JSON chunks (the [DONE] is checked here)."""
    events = text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]", text[-200:]
    out = []
    for ev in events[:-2]:
        assert ev.startswith("data: "), ev
        out.append(json.loads(ev[6:]))
    return out


def in_process(engine, name, req):
    steps = list(get(name).stream(engine, req))
    return "".join(s.text for s in steps), steps


def strategies_to_check():
    load_all()
    return ["ar"] + (["pld"] if "pld" in REGISTRY else [])


# ---------------------------------------------------------------------------------------------- basics
def test_health_models_and_auth(main):
    h = main.health()
    assert h["status"] == "ok" and h["model"] == "random-0" and h["context_length"] == 512
    assert httpx.get(main.url + "/v1/models", timeout=10).status_code == 401
    r = httpx.get(main.url + "/v1/models", headers=AUTH, timeout=10)
    assert r.status_code == 200
    assert r.json()["data"][0]["id"] == "random-0"
    r = post(main, "/v1/completions", {"prompt": PROMPT}, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error" and "token" in r.json()["error"]["message"]
    assert post(main, "/v1/completions", {"prompt": PROMPT}, headers={}).status_code == 401


@pytest.mark.parametrize("name", strategies_to_check())
def test_greedy_through_server_equals_in_process(main, tiny_engine, name):
    # completions, not streamed
    ref, steps = in_process(tiny_engine, name, Request(prompt=PROMPT, chat=False, max_new_tokens=40))
    r = post(main, "/v1/completions", {"model": "random-0", "prompt": PROMPT, "max_tokens": 40, "temperature": 0,
                                       "paradec": {"strategy": name}})
    assert r.status_code == 200, r.text
    j = r.json()
    assert j["object"] == "text_completion" and j["choices"][0]["text"] == ref
    assert j["usage"]["completion_tokens"] == sum(len(s.token_ids) for s in steps)
    assert j["usage"]["total_tokens"] == j["usage"]["prompt_tokens"] + j["usage"]["completion_tokens"]
    assert j["paradec"]["forward_passes"] == sum(s.forward_passes for s in steps)
    assert j["choices"][0]["finish_reason"] == ("length" if steps[-1].finish_reason == "length" else "stop")

    # chat, streamed, with usage: one chunk per step, each carrying that step's figures
    ref, steps = in_process(tiny_engine, name, Request(prompt=PROMPT, max_new_tokens=40))
    r = post(main, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 40,
                                            "temperature": 0, "stream": True,
                                            "stream_options": {"include_usage": True},
                                            "paradec": {"strategy": name}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = sse_chunks(r.text)
    content = [c for c in chunks if c["choices"]]
    assert len(content) == len(steps)
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == ref
    assert content[0]["choices"][0]["delta"]["role"] == "assistant"
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert [c["paradec"]["tokens"] for c in content] == [len(s.token_ids) for s in steps]
    assert [c["paradec"]["forward_passes"] for c in content] == [s.forward_passes for s in steps]
    assert [c["paradec"]["accepted"] for c in content] == [s.accepted for s in steps]
    assert [c["choices"][0]["finish_reason"] for c in content[:-1]] == [None] * (len(content) - 1)
    assert content[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == sum(
        len(s.token_ids) for s in steps)


def test_seeded_sampling_and_stop_through_server(main, tiny_engine):
    req = Request(prompt=PROMPT, max_new_tokens=30, temperature=0.9, top_p=0.95, seed=7)
    ref, _ = in_process(tiny_engine, "ar", req)
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 30, "temperature": 0.9,
            "top_p": 0.95, "seed": 7}
    assert post(main, "/v1/chat/completions", body).json()["choices"][0]["message"]["content"] == ref
    # a stop string taken from the middle of the greedy text cuts it there
    greedy, _ = in_process(tiny_engine, "ar", Request(prompt=PROMPT, max_new_tokens=30))
    stop = greedy[len(greedy) // 2:len(greedy) // 2 + 3]
    cut, _ = in_process(tiny_engine, "ar", Request(prompt=PROMPT, max_new_tokens=30, stop=[stop]))
    j = post(main, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 30,
                                            "temperature": 0, "stop": stop}).json()
    assert j["choices"][0]["message"]["content"] == cut and stop not in cut
    assert j["choices"][0]["finish_reason"] == "stop"


def test_openai_client_streams_unchanged(main, tiny_engine):
    import openai
    client = openai.OpenAI(base_url=main.url + "/v1", api_key=TOKEN, max_retries=0)
    ref, steps = in_process(tiny_engine, "ar", Request(prompt=PROMPT, max_new_tokens=24))
    stream = client.chat.completions.create(model="random-0", messages=[{"role": "user", "content": PROMPT}],
                                            max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"paradec": {"strategy": "ar"}})
    deltas, usage = [], None
    for chunk in stream:
        if chunk.choices:
            deltas.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    assert "".join(deltas) == ref
    assert usage.completion_tokens == sum(len(s.token_ids) for s in steps)
    comp = client.completions.create(model="random-0", prompt=PROMPT, max_tokens=24, temperature=0)
    assert comp.choices[0].text == in_process(tiny_engine, "ar",
                                              Request(prompt=PROMPT, chat=False, max_new_tokens=24))[0]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=main.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError, match="unknown strategy"):
        client.chat.completions.create(model="random-0", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"paradec": {"strategy": "no-such"}})


BAD = [
    ({"prompt": PROMPT, "paradec": {"strategy": "no-such"}}, 400, "unknown strategy 'no-such'"),
    ({"prompt": PROMPT, "paradec": {"max_context": -1}}, 400, "paradec.max_context must be a whole number"),
    ({"prompt": PROMPT, "max_tokens": 3, "paradec": {"max_context": 4}}, 400, "exceed the window of 4 tokens (max_context)"),
    ({"prompt": PROMPT, "max_tokens": -5}, 400, "max_tokens must be at least 1"),
    ({"prompt": PROMPT, "max_tokens": "ten"}, 400, "max_tokens must be a whole number"),
    (None, 400, "not valid JSON"),
    ({"prompt": "   "}, 400, "the prompt is empty"),
    ({"prompt": "word " * 600, "max_tokens": 5}, 400, "exceed the model's context of 512"),
    ({"prompt": PROMPT, "paradec": {"strategy": "ar", "params": {"k": 3}}}, 400, "unknown parameter(s) k"),
    ({"prompt": PROMPT, "temperature": -1}, 400, "temperature must be in"),
    ({"prompt": PROMPT, "n": 3}, 400, "n=3 is not supported"),
    ({"prompt": PROMPT, "model": "gpt-4"}, 404, "is not served here"),
    ([1, 2], 400, "must be a JSON object"),
]


def test_bad_requests_answer_4xx_and_the_server_keeps_serving(main):
    for body, status, msg in BAD:
        r = post(main, "/v1/completions", body, raw="{\"prompt\": \"x\"," if body is None else None)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert msg in err["message"], (msg, err)
        assert err["type"] in ("invalid_request_error", "not_found_error")
    r = post(main, "/v1/chat/completions", {"messages": [], "max_tokens": 3})
    assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    r = post(main, "/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}], "stream": True,
                                            "paradec": {"strategy": "no-such"}})
    assert r.status_code == 400 and "unknown strategy" in r.json()["error"]["message"]
    assert httpx.get(main.url + "/nope", timeout=10).status_code == 404
    assert main.health()["status"] == "ok"
    r = post(main, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


# ---------------------------------------------------------------------------------------------- queue
def _stream_request(server, max_tokens, results, key):
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "stream": True}
    try:
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
        results[key] = (r.status_code, r.text)
    except httpx.HTTPError as e:
        results[key] = (None, str(e))


def test_queue_limit_answers_429(servers):
    slow = servers["slow"]
    before = slow.health()["rejected"]
    results = {}
    threads = [threading.Thread(target=_stream_request, args=(slow, 30, results, i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    codes = sorted(code for code, _ in results.values())
    # 1 running + at most 1 waiting (--max-queue 1): of 4 simultaneous 1.5 s requests at least 2 are refused
    assert codes.count(429) >= 2 and codes.count(200) >= 1, codes
    for code, text in results.values():
        if code == 429:
            err = json.loads(text)["error"]
            assert err["code"] == "queue_full" and "busy" in err["message"] and "--max-queue 1" in err["message"]
        else:
            chunks = sse_chunks(text)
            assert sum(c["paradec"]["tokens"] for c in chunks) == 30
    h = slow.health()
    assert h["rejected"] - before == codes.count(429)
    assert h["running"] == 0 and h["waiting"] == 0
    assert post(slow, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}, headers={}).status_code == 200


def test_client_that_leaves_frees_the_engine(servers):
    slow = servers["slow"]
    before = slow.health()["cancelled"]
    body = {"prompt": PROMPT, "max_tokens": 400, "ignore_eos": True, "stream": True}    # 400 x 0.05 s = 20 s
    with httpx.stream("POST", slow.url + "/v1/completions", json=body, timeout=60) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen == 3:
                break
    t0 = time.time()
    r = post(slow, "/v1/completions", {"prompt": PROMPT, "max_tokens": 5}, headers={})
    assert r.status_code == 200 and time.time() - t0 < 10     # not behind the abandoned 20 s request
    assert slow.health()["cancelled"] == before + 1


# ---------------------------------------------------------------------------------------------- remote
def test_remote_engine_matches_in_process(main, tiny_engine):
    remote = RemoteEngine(main.url + "/v1", token=TOKEN)
    assert remote.model == "random-0" and remote.context_length == 512
    for name in strategies_to_check():
        req = Request(prompt=PROMPT, max_new_tokens=32)
        ref, steps = in_process(tiny_engine, name, req)
        got = list(remote.stream(name, Request(prompt=PROMPT, max_new_tokens=32)))
        assert "".join(s.text for s in got) == ref
        assert [len(s.token_ids) for s in got] == [len(s.token_ids) for s in steps]
        assert [s.forward_passes for s in got] == [s.forward_passes for s in steps]
        assert got[-1].finished and not any(s.finished for s in got[:-1]) and got[0].prefill
    raw = Request(prompt=PROMPT, chat=False, max_new_tokens=10)
    assert "".join(s.text for s in remote.stream("ar", raw)) == in_process(tiny_engine, "ar", raw)[0]
    with pytest.raises(RequestError, match="unknown strategy"):
        list(remote.stream("no-such", Request(prompt=PROMPT)))
    with pytest.raises(RequestError, match="context"):
        list(remote.stream("ar", Request(prompt="word " * 600, max_new_tokens=5)))


def test_remote_sot_sends_points_concurrently(servers, tiny_engine):
    sot = servers["sot"]
    assert sot.health()["max_in_flight"] == 0
    skeleton = "1. Open the file\n2. Loop over lines\n3. Close it"
    params = {"point_max_tokens": 10}
    got = list(RemoteEngine(sot.url).stream("sot", Request(prompt=PROMPT, max_new_tokens=60, skeleton=skeleton,
                                                           params=params)))
    assert sot.health()["max_in_flight"] >= 2          # the point requests overlapped on the server
    assert sorted({s.segment for s in got}) == [1, 2, 3]
    _, ref = in_process(tiny_engine, "sot", Request(prompt=PROMPT, max_new_tokens=60, skeleton=skeleton, params=params))
    assert got[-1].answer == ref[-1].answer
    assert got[-1].info["point_tokens"] == ref[-1].info["point_tokens"]
    assert got[-1].finished and not any(s.finished for s in got[:-1])


def test_remote_sot_with_a_skeleton_request(main, tiny_engine):
    got = list(RemoteEngine(main.url, token=TOKEN).stream("sot", Request(prompt=PROMPT, max_new_tokens=24)))
    _, ref = in_process(tiny_engine, "sot", Request(prompt=PROMPT, max_new_tokens=24))
    sk = [s for s in got if s.segment == 0]
    assert sk and sk[0].text.startswith("1.")
    assert sk[-1].info["skeleton"] == next(s for s in ref if "skeleton" in s.info).info["skeleton"]
    assert got[-1].answer == ref[-1].answer


# ---------------------------------------------------------------------------------------------- parsers
METRICS = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="meta-llama/Llama-3.1-8B"} 120.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="meta-llama/Llama-3.1-8B"} 30.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="other"} 999.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B"} 600.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B"} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B"} 330.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B"} 45.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="meta-llama/Llama-3.1-8B",position="0"} 100
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B",note="a \\"quoted\\", value"} 2 1700000000
"""


def test_prometheus_parser_and_spec_delta():
    m = parse_prometheus(METRICS)
    assert len(m["vllm:spec_decode_num_drafts_total"]) == 3
    labels, v = m["vllm:num_requests_running"][0]
    assert v == 2 and labels["note"] == 'a "quoted", value'
    pos = m["vllm:spec_decode_num_accepted_tokens_per_pos_total"][0]
    assert pos[0]["position"] == "0" and pos[1] == 100
    model = "meta-llama/Llama-3.1-8B"
    before = spec_counters(METRICS, model)
    assert before == {"drafts": 150.0, "draft_tokens": 750.0, "accepted_tokens": 375.0}
    assert spec_counters(METRICS)["drafts"] == 1149.0
    after = spec_counters(METRICS.replace("120.0", "130.0").replace("600.0", "650.0").replace("330.0", "360.0"),
                          model)
    d = spec_delta(before, after)
    assert d["drafts"] == 10 and d["draft_tokens"] == 50 and d["accepted_tokens"] == 30
    assert d["acceptance_rate"] == pytest.approx(0.6) and d["mean_acceptance_length"] == pytest.approx(4.0)
    # counters without the _total suffix (older exporters) are read too
    assert spec_counters("vllm:spec_decode_num_drafts 7\n")["drafts"] == 7


def test_sse_parser():
    lines = [": keep-alive", "data: {\"a\": 1}", "", "event: x", "data: line1", "data: line2", "", "data:[DONE]", ""]
    assert list(iter_sse(iter(lines))) == ['{"a": 1}', "line1\nline2", "[DONE]"]


# ---------------------------------------------------------------------------------------------- load script
def test_load_script_runs_bounded_and_checks_streams(main):
    out = subprocess.run([sys.executable, "evals/load_server.py", "--url", main.url, "--clients", "2",
                          "--seconds", "2", "--max-tokens", "8", "--token", TOKEN],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["ok"] >= 2 and res["bad"] == 0 and 0 < res["completion_tokens"] <= 8 * res["ok"]
    assert res["latency_p50_s"] > 0 and res["throughput_tok_s"] > 0
    for url in ("http://localhost:1", "http://10.0.0.1:8000", "https://127.0.0.1:8000"):
        out = subprocess.run([sys.executable, "evals/load_server.py", "--url", url, "--seconds", "1"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode != 0 and "refusing" in out.stderr
    out = subprocess.run([sys.executable, "evals/load_server.py", "--url", main.url, "--clients", "500"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--clients must be between 1 and 64" in out.stderr


def _cli(*args):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "paradec", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def test_cli_generate_and_bench_through_a_remote_engine(main, tiny_engine, tmp_path):
    """`--engine URL`: the CLI drives the server like an in-process engine; greedy text is the same."""
    p = _cli("generate", "--engine", main.url, "--engine-token", TOKEN, "--strategy", "pld", "--prompt",
             "def add(a, b):", "--raw", "--max-new-tokens", "24", "--ignore-eos", "--json")
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    ref = in_process(tiny_engine, "pld", Request(prompt="def add(a, b):", chat=False, max_new_tokens=24,
                                                 ignore_eos=True))
    assert got["text"] == ref[0]
    assert got["tokens"] == 24 and got["forward_passes"] >= 1
    db = tmp_path / "remote.db"
    p = _cli("bench", "--engine", main.url, "--engine-token", TOKEN, "--suite", "code", "--limit", "2",
             "--strategies", "ar,pld", "--max-new-tokens", "12", "--db", str(db), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["stored"] == 4
    pld = next(r for r in out["table"] if r["strategy"] == "pld" and r["category"] == "all")
    assert pld["lossless_mismatches"] == 0
    p = _cli("generate", "--engine", "http://127.0.0.1:9", "--prompt", "hi")
    assert p.returncode == 2 and "could not be reached" in p.stderr
