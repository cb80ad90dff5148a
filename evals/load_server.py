"""Bounded load test of a paradec (or any OpenAI-compatible) server on this machine.

    python evals/load_server.py --url http://127.0.0.1:8000 --clients 16 --seconds 60 [--token T] [--strategy all]

N client threads each send greedy streaming chat requests one after another until T seconds have passed
(requests in flight then finish; each has a timeout). `--strategy` is one strategy, a comma list, or `all`
(every strategy the server's /v1/strategies reports available): the requests then rotate through them, so
every strategy is in the mix at once. Every stream is checked: HTTP 200, every chunk valid
JSON of one id and object `chat.completion.chunk`, exactly one finish_reason, a usage chunk, `data: [DONE]`
at the end, the concatenated deltas equal to the server's non-streamed answer to the same request (fetched
once per prompt and strategy before the load starts: greedy decoding makes it the reference; for strategies
with several output segments, such as sot, each segment's deltas against the answer's `paradec.segments`),
and - on a paradec server - the per-chunk `paradec.tokens` summing to usage.completion_tokens.

Prints one JSON line: requests, ok, bad, rejected (429), server_errors (5xx or an error event), lost (a stream
cut off, truncated or different from the reference), completion tokens, throughput (completion tokens/s over
the wall time), requests/s, p50/p99 of end-to-end latency and time to first token (seconds), and the same
counts per strategy.
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


def reference_of(answer: dict):
    """The non-streamed answer as the stream must reproduce it: its text, or its segments when it has several."""
    segs = (answer.get("paradec") or {}).get("segments")
    return segs if isinstance(segs, list) and len(segs) > 1 else answer["choices"][0]["message"]["content"]


def body(model: str, prompt: str, max_tokens: int, strategy: str, stream: bool) -> dict:
    b = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
         "temperature": 0, "seed": 0, "stream": stream}
    if stream:
        b["stream_options"] = {"include_usage": True}
    if strategy != "ar":
        b["paradec"] = {"strategy": strategy}
    return b


def one_stream(client: httpx.Client, base: str, payload: dict, reference, timeout: float) -> dict:
    """One streaming request, checked. -> {ok, rejected, server_error, error, latency, ttft, tokens}."""
    t0 = time.perf_counter()
    ttft, text, ids, finishes, usage, done, pd_tokens, any_pd = None, "", set(), 0, None, False, 0, False
    segs: dict[int, str] = {}
    with client.stream("POST", base + "/v1/chat/completions", json=payload, timeout=timeout) as r:
        if r.status_code == 429:
            r.read()
            return {"ok": False, "rejected": True, "error": "429"}
        if r.status_code != 200:
            r.read()
            return {"ok": False, "server_error": r.status_code >= 500,
                    "error": f"HTTP {r.status_code}: {r.text[:200]}"}
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
                return {"ok": False, "server_error": True, "error": f"error event: {chunk['error']}"}
            if chunk.get("object") != "chat.completion.chunk":
                return {"ok": False, "error": f"wrong object {chunk.get('object')!r}"}
            ids.add(chunk.get("id"))
            if chunk.get("usage"):
                usage = chunk["usage"]
            seg = 0
            if isinstance(chunk.get("paradec"), dict):
                any_pd = True
                pd_tokens += int(chunk["paradec"].get("tokens", 0))
                seg = int(chunk["paradec"].get("segment") or 0)
            for ch in chunk.get("choices") or []:
                delta = (ch.get("delta") or {}).get("content") or ""
                if delta and ttft is None:
                    ttft = time.perf_counter() - t0
                text += delta
                segs[seg] = segs.get(seg, "") + delta
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
    got = [segs[k] for k in sorted(segs)] if isinstance(reference, list) else text
    if got != reference:
        problems.append(f"streamed text differs from the non-streamed answer ({str(got)[:40]!r} vs "
                        f"{str(reference)[:40]!r})")
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
        if strategy == "all":
            r = c.get(base + "/v1/strategies")
            r.raise_for_status()
            names = [s["name"] for s in r.json()["data"] if s.get("available")]
        else:
            names = [s.strip() for s in strategy.split(",") if s.strip()]
        references = {}
        for name in names:
            for p in PROMPTS:      # greedy: the non-streamed answer is what every stream must reproduce
                r = c.post(base + "/v1/chat/completions", json=body(model, p, max_tokens, name, False))
                r.raise_for_status()
                references[(p, name)] = reference_of(r.json())

    results: list[dict] = []
    lock = threading.Lock()
    start = time.perf_counter()
    deadline = start + seconds

    def client_loop(i: int) -> None:
        k = i
        with httpx.Client(headers=headers, timeout=timeout) as c:
            while time.perf_counter() < deadline:
                p, name = PROMPTS[k % len(PROMPTS)], names[(k // len(PROMPTS) + i) % len(names)]
                k += 1
                try:
                    res = one_stream(c, base, body(model, p, max_tokens, name, True), references[(p, name)],
                                     timeout)
                except httpx.HTTPError as e:      # the connection broke: a lost stream
                    res = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                res["strategy"] = name
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
    per = {n: {"ok": sum(r["ok"] for r in results if r["strategy"] == n),
               "rejected": sum(bool(r.get("rejected")) for r in results if r["strategy"] == n),
               "bad": sum(1 for r in bad if r["strategy"] == n)} for n in names}
    return {"url": base, "model": model, "strategy": strategy, "strategies": names, "clients": clients,
            "seconds": seconds,
            "max_tokens": max_tokens, "elapsed_s": round(elapsed, 3), "requests": len(results), "ok": len(ok),
            "bad": len(bad), "rejected": len(rejected), "server_errors": sum(bool(r.get("server_error")) for r in bad),
            "lost": sum(not r.get("server_error") for r in bad), "per_strategy": per,
            "errors": sorted({r["error"] for r in bad})[:5],
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
    p.add_argument("--strategy", default="ar", help="paradec strategy, a comma list, or 'all' (every available one; "
                                                    "a paradec server only; default ar)")
    p.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    a = p.parse_args(argv)
    out = run(a.url, a.clients, a.seconds, a.max_tokens, a.token, a.strategy, a.model)
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] and not out["bad"] else 1


if __name__ == "__main__":
    sys.exit(main())
