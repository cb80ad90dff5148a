"""Bounded load test of a paradec (or any OpenAI-compatible) server on this machine.

    python evals/load_server.py --url http://127.0.0.1:8000 --clients 16 --seconds 60 [--token T]

N client threads each send greedy streaming chat requests one after another until T seconds have passed
(requests in flight then finish; each has a timeout). Every stream is checked: HTTP 200, every chunk valid
JSON of one id and object `chat.completion.chunk`, exactly one finish_reason, a usage chunk, `data: [DONE]`
at the end, the concatenated deltas equal to the server's non-streamed answer to the same request (fetched
once per prompt before the load starts: greedy decoding makes it the reference), and - on a paradec
server - the per-chunk `paradec.tokens` summing to usage.completion_tokens.

Prints one JSON line: requests, ok, bad, rejected (429), completion tokens, throughput (completion tokens/s
over the wall time), requests/s, and p50/p99 of end-to-end latency and time to first token (seconds).
Exit status 0 when no stream was malformed and at least one succeeded. Only 127.0.0.1 is accepted as host:
this is a load generator and must never be pointed at someone else's server.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from paradec.metrics import percentile  # noqa: E402

PROMPTS = [
    "How do I read a file line by line in Python?",
    "What does the json module do?",
    "Explain list comprehensions.",
    "How do I sort a dictionary by value?",
    "What is a context manager?",
    "Write a function that reverses a string.",
    "What is the difference between a tuple and a list?",
    "How do I start a thread?",
]
LIMITS = {"clients": (1, 64), "seconds": (1, 600), "max_tokens": (1, 1024)}


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname != "127.0.0.1":
        raise SystemExit(f"refusing {url!r}: this load test only targets http://127.0.0.1:PORT (this machine)")
    path = parts.path.rstrip("/")
    path = path[:-3] if path.endswith("/v1") else path
    return f"http://127.0.0.1:{parts.port or 80}{path}"


def body(model: str, prompt: str, max_tokens: int, strategy: str, stream: bool) -> dict:
    b = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
         "temperature": 0, "seed": 0, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    if strategy != "ar":
        b["paradec"] = {"strategy": strategy}
    return b


def one_stream(client: httpx.Client, base: str, payload: dict, reference: str, timeout: float) -> dict:
    """One streaming request, checked. -> {ok, rejected, error, latency, ttft, tokens}."""
    t0 = time.perf_counter()
    ttft, text, ids, finishes, usage, done, pd_tokens, any_pd = None, "", set(), 0, None, False, 0, False
    with client.stream("POST", base + "/v1/chat/completions", json=payload, timeout=timeout) as r:
        if r.status_code == 429:
            r.read()
            return {"ok": False, "rejected": True, "error": "429"}
        if r.status_code != 200:
            r.read()
            return {"ok": False, "error": f"HTTP {r.status_code}: {r.text[:200]}"}
        for line in r.iter_lines():
            if not line:
                continue
            if done:
                return {"ok": False, "error": f"data after [DONE]: {line[:80]!r}"}
            if not line.startswith("data: "):
                return {"ok": False, "error": f"not an SSE data line: {line[:80]!r}"}
            data = line[6:]
            if data == "[DONE]":
                done = True
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                return {"ok": False, "error": f"chunk is not JSON: {data[:80]!r}"}
            if chunk.get("error"):
                return {"ok": False, "error": f"error event: {chunk['error']}"}
            if chunk.get("object") != "chat.completion.chunk":
                return {"ok": False, "error": f"wrong object {chunk.get('object')!r}"}
            ids.add(chunk.get("id"))
            if chunk.get("usage"):
                usage = chunk["usage"]
            if isinstance(chunk.get("paradec"), dict):
                any_pd = True
                pd_tokens += int(chunk["paradec"].get("tokens", 0))
            for ch in chunk.get("choices") or []:
                delta = (ch.get("delta") or {}).get("content") or ""
                if delta and ttft is None:
                    ttft = time.perf_counter() - t0
                text += delta
                if ch.get("finish_reason") is not None:
                    finishes += 1
    latency = time.perf_counter() - t0
    problems = []
    if not done:
        problems.append("no [DONE]")
    if len(ids) != 1:
        problems.append(f"{len(ids)} different ids")
    if finishes != 1:
        problems.append(f"{finishes} finish_reasons")
    if usage is None:
        problems.append("no usage chunk")
    elif any_pd and pd_tokens != usage.get("completion_tokens"):
        problems.append(f"paradec tokens {pd_tokens} != usage {usage.get('completion_tokens')}")
    if text != reference:
        problems.append(f"streamed text differs from the non-streamed answer ({text[:40]!r} vs {reference[:40]!r})")
    if problems:
        return {"ok": False, "error": "; ".join(problems)}
    return {"ok": True, "latency": latency, "ttft": ttft if ttft is not None else latency,
            "tokens": int(usage.get("completion_tokens") or 0)}


def run(url: str, clients: int = 16, seconds: float = 60, max_tokens: int = 64, token: str | None = None,
        strategy: str = "ar", model: str | None = None) -> dict:
    for name, v in (("clients", clients), ("seconds", seconds), ("max_tokens", max_tokens)):
        lo, hi = LIMITS[name]
        if not lo <= v <= hi:
            raise SystemExit(f"--{name.replace('_', '-')} must be between {lo} and {hi}, got {v}")
    base = check_url(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = 120.0
    with httpx.Client(headers=headers, timeout=timeout) as c:
        try:
            c.get(base + "/health").raise_for_status()
        except httpx.HTTPError as e:
            raise SystemExit(f"no server answers at {base}/health: {e}") from None
        if model is None:
            r = c.get(base + "/v1/models")
            r.raise_for_status()
            model = r.json()["data"][0]["id"]
        references = {}
        for p in PROMPTS:          # greedy: the non-streamed answer is what every stream must reproduce
            r = c.post(base + "/v1/chat/completions", json=body(model, p, max_tokens, strategy, False))
            r.raise_for_status()
            references[p] = r.json()["choices"][0]["message"]["content"]

    results: list[dict] = []
    lock = threading.Lock()
    start = time.perf_counter()
    deadline = start + seconds

    def client_loop(i: int) -> None:
        k = i
        with httpx.Client(headers=headers, timeout=timeout) as c:
            while time.perf_counter() < deadline:
                p = PROMPTS[k % len(PROMPTS)]
                k += 1
                try:
                    res = one_stream(c, base, body(model, p, max_tokens, strategy, True), references[p], timeout)
                except httpx.HTTPError as e:
                    res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                if res.get("rejected"):
                    time.sleep(0.2)     # back off before retrying
                with lock:
                    results.append(res)

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + timeout + 10)
    elapsed = time.perf_counter() - start
    ok = [r for r in results if r["ok"]]
    rejected = [r for r in results if r.get("rejected")]
    bad = [r for r in results if not r["ok"] and not r.get("rejected")]
    tokens = sum(r["tokens"] for r in ok)
    lat, ttft = [r["latency"] for r in ok], [r["ttft"] for r in ok]

    def rnd(x):
        return None if x is None else round(x, 4)
    return {"url": base, "model": model, "strategy": strategy, "clients": clients, "seconds": seconds,
            "max_tokens": max_tokens, "elapsed_s": round(elapsed, 3), "requests": len(results), "ok": len(ok),
            "bad": len(bad), "rejected": len(rejected), "errors": sorted({r["error"] for r in bad})[:5],
            "completion_tokens": tokens, "throughput_tok_s": round(tokens / elapsed, 2),
            "requests_per_s": round(len(ok) / elapsed, 3),
            "latency_p50_s": rnd(percentile(lat, 50)), "latency_p99_s": rnd(percentile(lat, 99)),
            "ttft_p50_s": rnd(percentile(ttft, 50)), "ttft_p99_s": rnd(percentile(ttft, 99))}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (127.0.0.1 only)")
    p.add_argument("--clients", type=int, default=16, help="concurrent streaming clients (1-64)")
    p.add_argument("--seconds", type=float, default=60, help="how long to keep starting requests (1-600)")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request (1-1024)")
    p.add_argument("--token", default=None, help="bearer token, if the server wants one")
    p.add_argument("--strategy", default="ar", help="paradec strategy (a paradec server only; default ar)")
    p.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    a = p.parse_args(argv)
    out = run(a.url, a.clients, a.seconds, a.max_tokens, a.token, a.strategy, a.model)
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] and not out["bad"] else 1


if __name__ == "__main__":
    sys.exit(main())
