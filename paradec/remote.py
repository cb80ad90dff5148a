"""A remote engine: paradec strategies over any OpenAI-compatible server (ours, vLLM, SGLang, TGI).

`RemoteEngine(url).stream(strategy, request)` yields paradec `Step`s built from the server's stream, one per
SSE chunk that carries text or tokens; timing them is the caller's business, as for local strategies.

Strategies:
  * `ar`        - a plain streaming request (no paradec extension sent, so it works on any server);
  * `vllm-spec` - the same request against a vLLM server running speculative decoding; the drafted and
                  accepted counts come from vLLM's Prometheus counters at /metrics, read before and after the
                  request (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`, `..._num_accepted_tokens`).
                  The difference counts every request the server ran meanwhile: measure on an otherwise idle
                  server;
  * `sot`       - Skeleton-of-Thought done the remote way: one skeleton request, then one request per point,
                  all sent at once from threads, so the server (or a pool of them) expands points in parallel.
                  Prompts, parsing, budgets and seeds are those of the in-process `sot` strategy;
  * any other name is passed to a paradec server as `paradec: {strategy, params}`.

Token counts: exact from our server's per-chunk `paradec` field; else from cumulative usage when the server
reports it in every chunk (vLLM/SGLang `continuous_usage_stats`); else one token per non-empty chunk. Remote
token ids are unknown: a Step holds one placeholder id (-1) per token, so `len(step.token_ids)` counts tokens.
"""
from __future__ import annotations

import dataclasses
import json
import queue
import re
import threading
from typing import Iterator
from urllib.parse import urlsplit

import httpx

from .strategies.base import Request, RequestError, Step

SPEC_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts", "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                 "accepted_tokens": "vllm:spec_decode_num_accepted_tokens"}


class VllmSpec:
    """`vllm-spec`, the one remote-only strategy: vLLM's own speculative decoding, server side. Described like a
    paradec strategy (name, title, lossless); lossless by construction: vLLM verifies every draft with the target."""
    name = "vllm-spec"
    title = "vLLM speculative decoding (server side)"
    lossless = True


# the strategies a RemoteEngine runs itself, whatever the server lists: name -> (title, why it may not work)
CLIENT_SIDE = {"ar": ("Autoregressive (server streaming)", ""),
               "sot": ("Skeleton-of-Thought (parallel requests)", ""),
               VllmSpec.name: (VllmSpec.title, "needs a vLLM server started with --speculative-config")}


class RemoteError(RuntimeError):
    """The remote server failed or answered something that is not a well-formed OpenAI response."""


# ---------------------------------------------------------------------------------------------- metrics
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_prometheus(text: str) -> dict[str, list[tuple[dict, float]]]:
    """Prometheus text exposition format -> {metric name: [(labels, value), ...]}. Comments are skipped."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        name, labels_s, value = m.groups()
        labels = {}
        if labels_s:
            pos = 0
            while pos < len(labels_s):
                lm = _LABEL.match(labels_s, pos)
                if not lm:
                    break
                labels[lm.group(1)] = (lm.group(2).replace('\\"', '"').replace("\\n", "\n")
                                       .replace("\\\\", "\\"))
                pos = lm.end()
        try:
            v = float(value)
        except ValueError:
            continue
        out.setdefault(name, []).append((labels, v))
    return out


def spec_counters(text: str, model: str | None = None) -> dict[str, float]:
    """vLLM's speculative-decoding counters summed over label sets (only `model_name=model` when given).

    Counters may be exposed with the `_total` suffix (prometheus_client adds it) or without.
    """
    samples = parse_prometheus(text)
    out = {}
    for key, name in SPEC_COUNTERS.items():
        rows = samples.get(name + "_total", []) or samples.get(name, [])
        out[key] = sum(v for labels, v in rows if model is None or labels.get("model_name", model) == model)
    return out


def spec_delta(before: dict, after: dict) -> dict:
    """Counter differences plus the derived acceptance figures (ALGORITHMS.md's shared definitions)."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in SPEC_COUNTERS}
    d["acceptance_rate"] = d["accepted_tokens"] / d["draft_tokens"] if d["draft_tokens"] else None
    # tokens per verification step: the accepted drafts plus the one token every step yields itself
    d["mean_acceptance_length"] = 1 + d["accepted_tokens"] / d["drafts"] if d["drafts"] else None
    return d


# ---------------------------------------------------------------------------------------------- SSE
def iter_sse(lines: Iterator[str]) -> Iterator[str]:
    """Data payloads of a server-sent event stream (multi-line data joined by newlines)."""
    data: list[str] = []
    for line in lines:
        line = line.rstrip("\r")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


def _finish(openai_reason, paradec_reason=None) -> str:
    return paradec_reason or ("length" if openai_reason == "length" else "stop")


# ---------------------------------------------------------------------------------------------- client
class RemoteEngine:
    """A client for one model on an OpenAI-compatible server."""

    remote = True
    extras: dict = {}

    def sync(self) -> None:
        """Timings of a remote engine are client-side: nothing to synchronise."""

    def __init__(self, url: str, token: str | None = None, model: str | None = None, timeout: float = 600.0,
                 continuous_usage: bool = True):
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"not an http(s) server address: {url!r}")
        path = parts.path.rstrip("/")
        path = path[:-3] if path.endswith("/v1") else path
        self.base = f"{parts.scheme}://{parts.netloc}{path}"
        self.api = self.base + "/v1"
        self.token = token
        self.timeout = timeout
        self.continuous_usage = continuous_usage
        self._model = model
        self.context_length: int | None = None
        self.last_usage: dict | None = None

    # -------------------------------------------------------------- plumbing
    def _headers(self) -> dict:
        h = {"Accept": "application/json"}
        if self.token:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    def _client(self) -> httpx.Client:
        return httpx.Client(timeout=httpx.Timeout(self.timeout, connect=10.0), headers=self._headers())

    @staticmethod
    def _raise_for(resp: httpx.Response) -> None:
        if resp.status_code < 400:
            return
        try:
            resp.read()
            err = resp.json().get("error")
            msg = err.get("message") if isinstance(err, dict) else str(err or resp.text)
        except Exception:  # noqa: BLE001 - a non-JSON error body
            msg = resp.text[:500]
        if resp.status_code in (400, 404, 422):
            raise RequestError(f"the server refused the request ({resp.status_code}): {msg}")
        raise RemoteError(f"{resp.request.method} {resp.request.url} -> {resp.status_code}: {msg}")

    def _get(self, path: str) -> httpx.Response:
        with self._client() as c:
            r = c.get(self.base + path)
            self._raise_for(r)
            return r

    @property
    def model(self) -> str:
        if self._model is None:
            data = self._get("/v1/models").json().get("data") or []
            if not data:
                raise RemoteError(f"{self.api}/models lists no model")
            self._model = data[0]["id"]
            self.context_length = data[0].get("max_model_len") or self.context_length
        return self._model

    @property
    def name(self) -> str:
        return f"{self.model} @ {self.base}"

    def health(self) -> dict:
        return self._get("/health").json()

    def catalogue(self) -> list[dict]:
        """Strategies this engine runs: a paradec server's own list, else the ones any OpenAI server can do."""
        try:
            data = self._get("/v1/strategies").json()["data"]
        except (RemoteError, RequestError, httpx.HTTPError, KeyError, ValueError):
            data = [self._entry("ar")]
        names = {d["name"] for d in data}
        return data + [self._entry(n) for n in CLIENT_SIDE if n not in names]

    @classmethod
    def _entry(cls, name: str) -> dict:
        title, why = CLIENT_SIDE[name]
        return {"name": name, "title": title, "lossless": cls.lossless(name), "available": True, "why": why}

    @staticmethod
    def lossless(name: str) -> bool:
        """Whether `name` run on a server gives the tokens `ar` gives: its strategy's own `lossless` flag (a
        paradec strategy's, or `VllmSpec`'s); names of no known strategy are not known to be lossless."""
        from .strategies import REGISTRY, load_all
        load_all()
        return bool(getattr({**REGISTRY, VllmSpec.name: VllmSpec}.get(name), "lossless", False))

    def metrics_text(self) -> str:
        return self._get("/metrics").text

    def describe(self) -> dict:
        return {"model": self.model, "device": f"remote {self.base}", "dtype": "remote",
                "context_length": self.context_length, "parameters": 0}

    @property
    def device(self) -> str:
        return f"remote {self.base}"

    # -------------------------------------------------------------- requests
    def body(self, request: Request, paradec: dict | None = None) -> tuple[str, dict]:
        """(endpoint path, JSON body) of a streaming request for `request`."""
        body: dict = {"model": self.model, "max_tokens": request.max_new_tokens, "temperature": request.temperature,
                      "top_p": request.top_p, "seed": request.seed, "stream": True,
                      "stream_options": {"include_usage": True}}
        if self.continuous_usage:
            body["stream_options"]["continuous_usage_stats"] = True
        if request.stop:
            body["stop"] = list(request.stop)
        if request.top_k:
            body["top_k"] = request.top_k
        if request.ignore_eos:
            body["ignore_eos"] = True
        if request.max_context:      # the window travels in paradec's extension (another server ignores it)
            paradec = {**(paradec or {"strategy": "ar"}), "max_context": request.max_context}
        if paradec:
            body["paradec"] = paradec
        if request.messages or request.chat:
            msgs = [dict(m) for m in request.messages] if request.messages else [
                {"role": "user", "content": request.prompt}]
            if request.assistant_prefix:
                msgs.append({"role": "assistant", "content": request.assistant_prefix})
                body.update(continue_final_message=True, add_generation_prompt=False)
            body["messages"] = msgs
            return "/v1/chat/completions", body
        body["prompt"] = request.prompt + request.assistant_prefix
        return "/v1/completions", body

    def stream(self, strategy, request: Request, cancel: threading.Event | None = None) -> Iterator[Step]:
        """Steps of `strategy` (a name) for `request`; the last one has finished=True."""
        name = getattr(strategy, "name", strategy)
        request.validate()
        if name == "ar":
            return self._plain(request, None, cancel)
        if name == VllmSpec.name:
            return self._vllm_spec(request, cancel)
        if name == "sot":
            return self._sot(request, cancel)
        return self._plain(request, {"strategy": name, "params": dict(request.params)}, cancel)

    def _plain(self, request: Request, paradec: dict | None, cancel: threading.Event | None = None,
               segment: int = 0) -> Iterator[Step]:
        path, body = self.body(request, paradec)
        first, counted, prev_usage_tokens, finished = True, 0, 0, False
        with self._client() as c, c.stream("POST", self.base + path, json=body) as resp:
            self._raise_for(resp)
            done = False
            for data in iter_sse(resp.iter_lines()):
                if cancel is not None and cancel.is_set():
                    return
                if data.strip() == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError as e:
                    raise RemoteError(f"the server sent a chunk that is not JSON: {data[:200]!r}") from e
                if isinstance(chunk, dict) and chunk.get("error"):
                    err = chunk["error"]
                    raise RemoteError(f"the server failed mid-stream: "
                                      f"{err.get('message') if isinstance(err, dict) else err}")
                usage = chunk.get("usage") or None
                if usage:
                    self.last_usage = usage
                choices = chunk.get("choices") or []
                if not choices:
                    continue          # the closing usage chunk
                ch = choices[0]
                text = ch.get("text")
                if text is None:
                    text = (ch.get("delta") or {}).get("content") or ""
                fr = ch.get("finish_reason")
                pd = chunk.get("paradec")
                if isinstance(pd, dict):
                    n = int(pd.get("tokens", 0))
                    fields = dict(forward_passes=int(pd.get("forward_passes", 0)),
                                  draft_passes=int(pd.get("draft_passes", 0)), drafted=int(pd.get("drafted", 0)),
                                  accepted=int(pd.get("accepted", 0)),
                                  segment=segment + int(pd.get("segment", 0)))
                    info = {"remote": True, **({"info": pd["info"]} if pd.get("info") else {})}
                    reason = pd.get("finish_reason")
                    answer = pd.get("answer")
                    fields.update(stage=str(pd.get("stage") or ""), planning=pd.get("planning") is True,
                                  answer=answer if isinstance(answer, str) else None)
                else:
                    if usage and usage.get("completion_tokens") is not None:
                        n = int(usage["completion_tokens"]) - prev_usage_tokens
                        prev_usage_tokens = int(usage["completion_tokens"])
                    else:
                        n = 1 if text else 0
                    # one chunk = one server step (several tokens when the server speculates)
                    fields = dict(forward_passes=1 if n else 0, segment=segment)
                    info, reason = {"remote": True}, None
                if not text and not n and fr is None:
                    continue          # the role-only first chat chunk
                counted += n
                step = Step(token_ids=[-1] * n, text=text, prefill=first, finished=fr is not None,
                            finish_reason=_finish(fr, reason) if fr is not None else None, info=info, **fields)
                first = False
                finished = finished or step.finished
                yield step
            if not done:
                raise RemoteError("the stream ended before data: [DONE] (connection dropped?)")
            if not finished:
                raise RemoteError("the stream ended without a finish_reason")

    def _vllm_spec(self, request: Request, cancel=None) -> Iterator[Step]:
        model = self.model
        before = spec_counters(self.metrics_text(), model)
        held = None
        for st in self._plain(request, None, cancel):
            if held is not None:
                yield held
            held = st
        after = spec_counters(self.metrics_text(), model)
        d = spec_delta(before, after)
        if held is not None:
            held.drafted += int(d["draft_tokens"])
            held.accepted += int(d["accepted_tokens"])
            held.info["spec_decode"] = d
            yield held

    def _sot(self, request: Request, cancel=None) -> Iterator[Step]:
        from .strategies.skeleton import (SkeletonOfThought, fallback_reason, fallback_steps, finish_answer,
                                          given_points, point_plan, point_seed, point_stop, render_skeleton,
                                          skeleton_prefix, skeleton_steps, split_question, template_for)
        p = SkeletonOfThought().resolve_params(request)
        tpl = template_for(p, self)
        history, question = split_question(request)
        plain = dataclasses.replace(request, stop=[], assistant_prefix="", params={}, chat=True)
        cancel = cancel or threading.Event()

        forced = request.skeleton
        if forced is not None:
            points, source = given_points(forced, p["max_points"]), "given skeleton"
        else:
            sk_req = dataclasses.replace(plain, messages=tpl.skeleton_messages(history, question), prompt="",
                                         assistant_prefix=skeleton_prefix(),
                                         max_new_tokens=p["skeleton_max_tokens"])
            points = yield from skeleton_steps(self._plain(sk_req, None, cancel), p["max_points"], end_stage=True)
            source = "skeleton"

        if len(points) < 2:
            ar_req = dataclasses.replace(request, params={}, skeleton=None)
            yield from fallback_steps(self._plain(ar_req, None, cancel, segment=1), fallback_reason(source, points))
            return

        skeleton = render_skeleton(points)
        points, budgets, headers = point_plan(points, request, p, tpl)
        q: queue.Queue = queue.Queue()

        def run_point(b: int) -> None:
            req = dataclasses.replace(plain, messages=tpl.expansion_messages(history, question, skeleton, b),
                                      prompt="", assistant_prefix=headers[b - 1], max_new_tokens=budgets[b - 1],
                                      seed=point_seed(request.seed, b), stop=point_stop(request, b))
            try:
                for st in self._plain(req, None, cancel, segment=b):
                    q.put(("step", b, st))
                q.put(("end", b, None))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                q.put(("error", b, e))

        threads = [threading.Thread(target=run_point, args=(b,), daemon=True, name=f"sot-point-{b}")
                   for b in range(1, len(points) + 1)]
        for t in threads:          # every point request goes out at once
            t.start()
        texts = {b: "" for b in range(1, len(points) + 1)}
        reasons: dict[int, str | None] = {}
        tokens = {b: 0 for b in texts}
        started: set[int] = set()
        held, live = None, len(threads)
        try:
            while live:
                kind, b, st = q.get()
                if kind == "error":
                    raise st
                if kind == "end":
                    live -= 1
                    continue
                st.segment = b
                if b not in started:
                    st.text = headers[b - 1] + st.text
                    started.add(b)
                if st.finished:
                    reasons[b] = st.finish_reason
                st.finished, st.finish_reason = False, None
                texts[b] += st.text
                tokens[b] += len(st.token_ids)
                if held is not None:
                    yield held
                held = st
        finally:
            if live:               # the caller stopped early or a point failed: stop the other point streams
                cancel.set()
        held.finished, held.finish_reason = True, "stop"
        yield finish_answer(held, points, [texts[b] if b in started else headers[b - 1] for b in texts],
                            [tokens[b] for b in texts], [reasons.get(b) for b in texts])
