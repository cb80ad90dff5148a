"""`python -m paradec serve`: an OpenAI-compatible HTTP server over one engine.

Endpoints: GET /health, GET /v1/models, GET /v1/strategies, POST /v1/completions, POST /v1/chat/completions.
Requests and responses follow OpenAI's shapes; `stream: true` answers with server-sent events
(`data: {...}` chunks, then `data: [DONE]`), and `stream_options: {include_usage: true}` adds a last chunk
with the usage. One extra request field selects the decoding method:

    "paradec": {"strategy": "pld", "params": {"max_ngram": 3}}      # default: {"strategy": "ar"}

and every chunk (and the non-streamed response) carries a `paradec` object with the step's figures:
tokens, forward_passes, draft_passes, drafted, accepted, segment (and, when the strategy sets them, stage,
planning, answer and info). Strategies with several output segments (`sot`: segment 0 = skeleton, b = point
b) stream their deltas interleaved as they are produced - place them by `paradec.segment`; the last chunk
carries the assembled answer as `paradec.answer`, the non-streamed response as its text.
Other extensions understood: `top_k`, `ignore_eos` (as in vLLM) and `continue_final_message` (a last
assistant message is a prefix the answer continues, as in vLLM).

Design: HTTP is FastAPI on uvicorn (robust HTTP/1.1 parsing, keep-alive, chunked streaming and
client-disconnect detection come with it); the model runs on ONE worker thread that owns the engine and
takes jobs first come, first served. Each job is a strategy generator; the worker pulls one Step at a
time and hands it to the request's asyncio queue, so a slow client never holds the engine while it reads,
and a client that goes away is noticed between steps (its generator is closed and the next job starts).
At most 1 + --max-queue requests are in flight: one running and up to --max-queue waiting; beyond that
the server answers 429 at once instead of letting waits grow without bound.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import hmac
import json
import logging
import math
import os
import secrets
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request as HTTPRequest   # module level: FastAPI resolves handler annotations by name

log = logging.getLogger("paradec.server")

DEFAULT_MAX_TOKENS = {"completions": 16, "chat": 256}   # OpenAI's completions default; a bounded chat default
MAX_BODY_BYTES = 4 * 1024 * 1024                         # a request body larger than this is answered 413
RETRY_AFTER_S = 1                                        # the Retry-After a 429 carries
UNSUPPORTED = {"n": 1, "best_of": 1}                     # fields we accept only at these values


# ---------------------------------------------------------------------------------------------- errors
class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "code", "param"}}."""

    TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
             405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
             500: "server_error", 503: "server_error"}

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.TYPES.get(self.status, "invalid_request_error"),
                          "code": self.code, "param": self.param}}


# ---------------------------------------------------------------------------------------------- worker
@dataclass(eq=False)
class Job:
    """One request's run: the worker puts ("step", Step)... then ("end", None) or ("error", ApiError) in `events`."""
    strategy: Any
    request: Any
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    checked_at: float = 0.0     # when the server last checked that the client is still connected

    def emit(self, kind: str, payload=None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:   # the event loop is gone (server shutting down)
            self.cancelled.set()


class Scheduler:
    """One worker thread that owns the engine; a bounded first-come-first-served queue of jobs in front of it."""

    def __init__(self, engine, max_queue: int = 16, step_delay: float = 0.0):
        from .race import engine_lock
        self.engine = engine
        self.lock = engine_lock(engine)       # the same lock the race runner takes: one model user at a time
        self.max_queue = max_queue
        self.step_delay = step_delay          # test-only throttle between steps (--step-delay)
        self.jobs: collections.deque[Job] = collections.deque()
        self.cv = threading.Condition()
        self.running = 0
        self.max_in_flight = 0
        self.counts = collections.Counter()   # served, rejected, failed, cancelled
        self.thread = threading.Thread(target=self._loop, name="paradec-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> bool:
        with self.cv:
            if len(self.jobs) + self.running >= 1 + self.max_queue:
                self.counts["rejected"] += 1
                return False
            self.jobs.append(job)
            self.max_in_flight = max(self.max_in_flight, len(self.jobs) + self.running)
            self.cv.notify()
        return True

    def cancel(self, job: Job) -> None:
        job.cancelled.set()
        with self.cv:
            try:
                self.jobs.remove(job)          # still waiting: free its place now
                self.counts["cancelled"] += 1
            except ValueError:
                pass

    def status(self) -> dict:
        with self.cv:
            return {"running": self.running, "waiting": len(self.jobs), "max_queue": self.max_queue,
                    "max_in_flight": self.max_in_flight, **{k: self.counts[k] for k in
                                                            ("served", "rejected", "failed", "cancelled")}}

    def _loop(self) -> None:
        while True:
            with self.cv:
                while not self.jobs:
                    self.cv.wait()
                job = self.jobs.popleft()
                self.running = 1
            try:
                self._run(job)
            finally:
                with self.cv:
                    self.running = 0

    def _run(self, job: Job) -> None:
        from .strategies import RequestError
        gen = None
        try:
            gen = job.strategy.stream(self.engine, job.request)
            while not job.cancelled.is_set():
                with self.lock:
                    step = next(gen, None)
                if step is None:
                    break
                job.emit("step", step)
                if step.finished:
                    break
                if self.step_delay:
                    time.sleep(self.step_delay)
            with self.cv:
                self.counts["cancelled" if job.cancelled.is_set() else "served"] += 1
            job.emit("end")
        except RequestError as e:
            with self.cv:
                self.counts["failed"] += 1
            job.emit("error", ApiError(400, str(e)))
        except Exception as e:  # noqa: BLE001 - a failing strategy must not take the server down
            log.error("strategy %s failed:\n%s", getattr(job.strategy, "name", "?"), traceback.format_exc())
            with self.cv:
                self.counts["failed"] += 1
            job.emit("error", ApiError(500, f"the {getattr(job.strategy, 'name', '?')} strategy failed: "
                                            f"{type(e).__name__}: {e}", code="strategy_error"))
        finally:
            if gen is not None:
                try:
                    with self.lock:
                        gen.close()
                except Exception:  # noqa: BLE001
                    pass


# ---------------------------------------------------------------------------------------------- parsing
def _get_int(body: dict, name: str, default):
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(400, f"{name} must be a whole number, got {v!r}", param=name)
    if v < 1:
        raise ApiError(400, f"{name} must be at least 1, got {v}", param=name)
    return v


def _get_num(body: dict, name: str, default: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ApiError(400, f"{name} must be a finite number, got {v!r}", param=name)
    return float(v)


def _get_bool(body: dict, name: str, default: bool = False) -> bool:
    v = body.get(name)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(400, f"{name} must be true or false, got {v!r}", param=name)
    return v


def _no_constants(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:20]} is out of range")
    return v


def _text_content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):   # [{"type": "text", "text": "..."}] parts
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ApiError(400, f"{where}: only text content parts are supported", param="messages")
            parts.append(p["text"])
        return "".join(parts)
    raise ApiError(400, f"{where}: content must be a string or a list of text parts", param="messages")


def build_request(body: dict, kind: str, engine):
    """OpenAI body -> (strategy name, paradec Request, stream?, include_usage?). Raises ApiError(400)."""
    from .strategies import Request
    for k, ok in UNSUPPORTED.items():
        if body.get(k) not in (None, ok):
            raise ApiError(400, f"{k}={body[k]!r} is not supported by this server (only {k}={ok})", param=k)
    if body.get("logprobs") not in (None, False, 0) or body.get("echo") or body.get("tools") or body.get("suffix"):
        raise ApiError(400, "logprobs, echo, suffix and tools are not supported by this server")
    if kind == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list):
            raise ApiError(400, "prompt must be one string (batches and token-id prompts are not supported)",
                           param="prompt")
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt is required and must be a string", param="prompt")
        req = Request(prompt=prompt, chat=False)
    else:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ApiError(400, "messages is required and must be a non-empty list", param="messages")
        messages = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ApiError(400, f"messages[{i}] must be an object with a role and a content", param="messages")
            messages.append({"role": m["role"], "content": _text_content(m.get("content"), f"messages[{i}]")})
        prefix = ""
        if _get_bool(body, "continue_final_message") and messages[-1]["role"] == "assistant":
            prefix = messages.pop()["content"]      # vLLM's way to pre-fill the assistant turn
            if not messages:
                raise ApiError(400, "continue_final_message needs a message before the assistant's",
                               param="messages")
        req = Request(messages=messages, chat=True, assistant_prefix=prefix)

    max_tokens = _get_int(body, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = _get_int(body, "max_tokens", None)
    req.temperature = _get_num(body, "temperature", 1.0)
    req.top_p = _get_num(body, "top_p", 1.0)
    top_k = body.get("top_k")                       # vLLM's extension; -1 or 0 = off
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise ApiError(400, f"top_k must be a whole number, got {top_k!r}", param="top_k")
        req.top_k = max(0, top_k)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ApiError(400, f"seed must be a whole number, got {seed!r}", param="seed")
    req.seed = secrets.randbelow(2**31) if seed is None else seed
    stop = body.get("stop")
    req.stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
    req.ignore_eos = _get_bool(body, "ignore_eos")

    pd = body.get("paradec") or {}
    if not isinstance(pd, dict):
        raise ApiError(400, "paradec must be an object like {\"strategy\": \"ar\", \"params\": {}}", param="paradec")
    name = pd.get("strategy", "ar")
    if not isinstance(name, str):
        raise ApiError(400, f"paradec.strategy must be a string, got {name!r}", param="paradec.strategy")
    params = pd.get("params") or {}
    if not isinstance(params, dict):
        raise ApiError(400, "paradec.params must be an object", param="paradec.params")
    req.params = dict(params)   # only the strategy's own parameters: `prepare` refuses any other name
    mc = pd.get("max_context", 0)
    if isinstance(mc, bool) or not isinstance(mc, int) or mc < 0:
        raise ApiError(400, f"paradec.max_context must be a whole number of tokens >= 0 (0 = the model's context), "
                            f"got {mc!r}", param="paradec.max_context")
    req.max_context = mc

    if max_tokens is None:   # unasked: fill what the context leaves, up to the default
        ids = req.prompt_ids(engine)
        max_tokens = max(1, min(DEFAULT_MAX_TOKENS[kind], req.context(engine) - len(ids)))
    req.max_new_tokens = max_tokens

    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, f"stream must be true or false, got {stream!r}", param="stream")
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    return name, req, stream, _get_bool(so, "include_usage") and stream


_AVAILABLE_LOCK = threading.Lock()   # lazy loads behind `available` (drafts, adapters) happen one at a time


def availability(strategy, engine) -> tuple[bool, str]:
    """strategy.available(engine), serialised across request threads; a failing check is 'unavailable', never a 500."""
    with _AVAILABLE_LOCK:
        try:
            return strategy.available(engine)
        except Exception as e:  # noqa: BLE001
            log.error("availability of %s failed:\n%s", strategy.name, traceback.format_exc())
            return False, f"could not be prepared on this server ({type(e).__name__})"


def prepare(name: str, req, engine):
    """Check everything that can be checked before queueing: strategy, its params, availability, prompt fit.
    The prompt is encoded here once (or reused from `build_request`); the strategy's run reuses it too."""
    from .strategies import RequestError, get
    try:
        strategy = get(name)
        strategy.resolve_params(req, engine)
        ok, why = availability(strategy, engine)
        if not ok:
            raise RequestError(f"strategy {name!r} is not available with this model: {why}")
        # pcw, focus: they read prompts longer than the context and check the length themselves
        prompt_ids = req.validate(engine, long_ok=strategy.accepts_long_prompts)
    except RequestError as e:
        raise ApiError(400, str(e)) from None
    return strategy, len(prompt_ids)


def _finish(reason: str | None) -> str:
    return "length" if reason == "length" else "stop"


def _step_figures(step) -> dict:
    d = {"tokens": len(step.token_ids), "forward_passes": step.forward_passes, "draft_passes": step.draft_passes,
         "drafted": step.drafted, "accepted": step.accepted, "segment": step.segment}
    if step.finish_reason:
        d["finish_reason"] = step.finish_reason
    if step.stage:
        d["stage"] = step.stage
    if step.planning:
        d["planning"] = True
    if step.answer is not None:
        d["answer"] = step.answer
    if step.info:
        d["info"] = json.loads(json.dumps(step.info, default=str))
    return d


# ---------------------------------------------------------------------------------------------- app
def create_app(engine, *, token: str | None = None, max_queue: int = 16, step_delay: float = 0.0,
               served_name: str | None = None):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from .strategies import REGISTRY, load_all

    model_name = served_name or engine.name
    engine.extras.setdefault("draft_choices", {})   # clients choose among the operator's drafts, never a path
    started = int(time.time())
    sched = Scheduler(engine, max_queue=max_queue, step_delay=step_delay)
    app = FastAPI(title="paradec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler = sched

    @app.exception_handler(ApiError)
    async def _api_error(_, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(Exception)
    async def _any_error(_, e: Exception):   # never a plain-text traceback to a client
        log.error("request failed:\n%s", "".join(traceback.format_exception(e)))
        return JSONResponse(ApiError(500, "internal server error").body(), status_code=500)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_, e):
        return JSONResponse(ApiError(e.status_code, str(e.detail)).body(), status_code=e.status_code)

    def check_auth(http: HTTPRequest) -> None:
        if not token:
            return
        got = http.headers.get("authorization", "")
        scheme, _, value = got.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <token>' with the "
                                "server's token (--token / PARADEC_TOKEN)", code="invalid_api_key")

    async def next_event(job: Job, http: HTTPRequest, every: float = 0.2):
        """The job's next event; cancels the job when the client has gone away. The connection is checked at
        least every `every` seconds whether or not steps keep arriving (a non-streamed request's client may
        leave while its steps flow)."""
        while True:
            now = time.monotonic()
            if now - job.checked_at >= every:
                job.checked_at = now
                if await http.is_disconnected():
                    sched.cancel(job)
                    raise ApiError(499, "client disconnected")
            try:
                return await asyncio.wait_for(job.events.get(), every)
            except asyncio.TimeoutError:
                pass

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "device": str(engine.device),
                "context_length": engine.context_length, **sched.status()}

    @app.get("/v1/models")
    async def models(http: HTTPRequest):
        check_auth(http)
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": started,
                                            "owned_by": "paradec", "max_model_len": engine.context_length}]}

    @app.get("/v1/strategies")
    async def strategies(http: HTTPRequest):
        check_auth(http)
        load_all()
        out = []
        for name in sorted(REGISTRY):
            s = REGISTRY[name]()
            ok, why = await run_in_threadpool(availability, s, engine)
            out.append({"name": name, "title": s.title, "lossless": s.lossless, "available": ok, "why": why,
                        "params": {k: {"default": p.default, "help": p.help} for k, p in s.params.items()}})
        return {"object": "list", "data": out}

    async def read_body(http: HTTPRequest) -> bytes:
        too_big = ApiError(413, f"the request body is larger than {MAX_BODY_BYTES:,} bytes", code="body_too_large")
        try:
            if int(http.headers.get("content-length") or 0) > MAX_BODY_BYTES:
                raise too_big
        except ValueError:
            raise ApiError(400, "bad Content-Length header") from None
        chunks, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise too_big
            chunks.append(chunk)
        return b"".join(chunks)

    async def handle(http: HTTPRequest, kind: str):
        check_auth(http)
        raw = await read_body(http)
        try:
            body = json.loads(raw, parse_constant=_no_constants, parse_float=_finite_float)   # NaN / Infinity are not JSON
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if body.get("model") not in (None, model_name, engine.name):
            raise ApiError(404, f"model {body['model']!r} is not served here; this server serves {model_name!r}",
                           code="model_not_found", param="model")
        name, req, stream, include_usage = await run_in_threadpool(build_request, body, kind, engine)
        strategy, prompt_tokens = await run_in_threadpool(prepare, name, req, engine)
        job = Job(strategy, req, asyncio.get_running_loop())
        if not sched.submit(job):
            st = sched.status()
            raise ApiError(429, f"the server is busy: {st['running']} request running and {st['waiting']} waiting "
                                f"(limit --max-queue {sched.max_queue}); retry later", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        rid = ("cmpl-" if kind == "completions" else "chatcmpl-") + secrets.token_hex(12)
        created = int(time.time())
        try:
            first = await next_event(job, http)
        except BaseException:
            sched.cancel(job)
            raise
        if first[0] == "error":
            raise first[1]

        if kind == "completions":
            obj = "text_completion"

            def choice(text, fr):
                return {"index": 0, "text": text, "logprobs": None, "finish_reason": fr}
        else:
            obj = "chat.completion.chunk" if stream else "chat.completion"

            def choice(text, fr, first_chunk=False):
                if stream:
                    delta = {"role": "assistant", "content": text} if first_chunk else {"content": text}
                    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": fr}
                return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                        "finish_reason": fr}

        def usage(n):
            return {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}

        if not stream:
            steps, ev = [], first
            try:
                while ev[0] == "step":
                    steps.append(ev[1])
                    ev = await next_event(job, http)
            finally:
                sched.cancel(job)
            if ev[0] == "error":
                raise ev[1]
            segs: dict[int, str] = {}
            for s in steps:
                segs[s.segment] = segs.get(s.segment, "") + s.text
            # multi-segment strategies (sot) assemble their answer in the last step's `answer`; else segments in order
            answer = steps[-1].answer if steps else None
            text = answer if isinstance(answer, str) else "".join(segs[k] for k in sorted(segs))
            n = sum(len(s.token_ids) for s in steps)
            reason = next((s.finish_reason for s in reversed(steps) if s.finish_reason), None)
            summary = {"strategy": name, "seed": req.seed, "steps": len(steps),
                       "forward_passes": sum(s.forward_passes for s in steps),
                       "draft_passes": sum(s.draft_passes for s in steps),
                       "drafted": sum(s.drafted for s in steps), "accepted": sum(s.accepted for s in steps),
                       "finish_reason": reason}
            if len(segs) > 1:
                summary["segments"] = [segs[k] for k in sorted(segs)]
            return {"id": rid, "object": obj, "created": created, "model": model_name,
                    "choices": [choice(text, _finish(reason))], "usage": usage(n), "paradec": summary}

        async def events():
            n, is_first = 0, True
            ev = first
            try:
                while True:
                    if ev[0] == "error":   # after the 200 header: an OpenAI-style error event, then [DONE]
                        yield f"data: {json.dumps(ev[1].body())}\n\n"
                        break
                    if ev[0] == "end":
                        break
                    step = ev[1]
                    n += len(step.token_ids)
                    fr = _finish(step.finish_reason) if step.finished else None
                    c = (choice(step.text, fr, first_chunk=is_first) if kind == "chat" else choice(step.text, fr))
                    chunk = {"id": rid, "object": obj, "created": created, "model": model_name, "choices": [c],
                             "paradec": _step_figures(step)}
                    if include_usage:
                        chunk["usage"] = None
                    is_first = False
                    yield f"data: {json.dumps(chunk)}\n\n"
                    ev = await job.events.get()
                if include_usage:
                    yield f"data: {json.dumps({'id': rid, 'object': obj, 'created': created, 'model': model_name, 'choices': [], 'usage': usage(n)})}\n\n"  # noqa: E501
                yield "data: [DONE]\n\n"
            finally:
                sched.cancel(job)   # a no-op when it finished; frees the engine when the client left

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        return await handle(http, "completions")

    @app.post("/v1/chat/completions")
    async def chat(http: HTTPRequest):
        return await handle(http, "chat")

    return app


# ---------------------------------------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--model", help="local model folder, hub id, or paradec-tiny (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:1, mps")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA and on CPUs with native bf16 matrix support, fp32 otherwise), float32, bfloat16, float16")
    p.add_argument("--trust-remote-code", action="store_true", help="allow model code from the model folder")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (default: $PARADEC_TOKEN)")
    p.add_argument("--max-queue", type=int, default=16,
                   help="requests allowed to wait behind the running one; more get 429 (default 16)")
    p.add_argument("--draft", action="append", default=[], metavar="NAME=PATH",
                   help="a draft model clients may pick for sps by NAME (repeatable; PATH alone: named after its "
                        "folder); the first is the default draft. Clients can load nothing else")
    p.add_argument("--served-model-name", default=None, help="model id to report (default: the model's name)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    # test-only: a random tiny engine (no model files needed) and a pause between steps to make requests slow
    p.add_argument("--random-tiny", type=int, nargs="?", const=0, default=None, help=argparse.SUPPRESS)
    p.add_argument("--step-delay", type=float, default=0.0, help=argparse.SUPPRESS)
    return p


def add_serve_parser(subparsers):
    """`python -m paradec serve ...`: add the subcommand to the CLI's subparsers."""
    s = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server over one engine",
                              description=__doc__.split("\n\n")[0])
    add_arguments(s)
    s.set_defaults(func=serve_main)
    return s


def serve_main(args) -> int:
    import uvicorn

    from .engine import Engine, ModelError
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    if args.max_queue < 0:
        print("error: --max-queue must be 0 or more", file=sys.stderr)
        return 2
    token = args.token if args.token is not None else os.environ.get("PARADEC_TOKEN") or None
    try:
        if args.random_tiny is not None:
            from .testing import random_tiny_engine
            engine = random_tiny_engine(args.random_tiny)
        else:
            engine = Engine.load(args.model, device=args.device, dtype=args.dtype,
                                 trust_remote_code=args.trust_remote_code)
        from .strategies import preload
        from .strategies.speculative import configure_drafts
        configure_drafts(engine, args.draft)
        preload(engine)             # drafts loaded and pass costs timed here, once, not on a request's thread
    except ModelError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.host not in ("127.0.0.1", "localhost", "::1") and not token:
        print(f"warning: binding {args.host} without a token: anyone who can reach this port can use the model; "
              "set --token or PARADEC_TOKEN", file=sys.stderr)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = create_app(engine, token=token, max_queue=args.max_queue, step_delay=args.step_delay,
                     served_name=args.served_model_name)
    print(f"paradec: serving {args.served_model_name or engine.name} on {engine.device} at "
          f"http://{args.host}:{args.port}/v1 ({'token required' if token else 'no token'}, "
          f"max queue {args.max_queue})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                access_log=args.log_level in ("info", "debug"))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m paradec serve", description=__doc__.split("\n\n")[0])
    return serve_main(add_arguments(p).parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
