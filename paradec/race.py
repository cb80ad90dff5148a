"""Run strategies on one engine: all at once (race) or one after another (benchmark).

Race: one worker thread advances the strategies one step at a time. Each step is timed by itself with the
device synchronised before and after, and added to that strategy's own compute clock. The next step always
goes to the running strategy whose clock is furthest behind, so the columns advance at their true relative
speed while they share the engine, and every strategy's figures are what it would take alone. Consumers
(the UI, the CLI, the server) read events from a thread-safe queue while they are produced, and can stop
any strategy, or all, between steps.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from .metrics import Figures, TimedStep, figures, speedup
from .quality import first_divergence
from .strategies import Request, Step, get

_ENGINE_LOCKS: dict[int, threading.Lock] = {}


def engine_lock(engine) -> threading.Lock:
    """One lock per engine: two races (two browser sessions) never run model work at the same time."""
    return _ENGINE_LOCKS.setdefault(id(engine), threading.Lock())


def timed_steps(engine, stream: Iterator[Step]) -> Iterator[tuple[Step, float]]:
    """Time each `next()` of a strategy stream by itself, device synchronised before and after."""
    while True:
        engine.sync()
        t0 = time.perf_counter()
        try:
            step = next(stream)
        except StopIteration:
            return
        engine.sync()
        yield step, time.perf_counter() - t0


def strategy_stream(engine, name: str, request: Request) -> tuple[bool, Iterator[Step]]:
    """(lossless, step stream) of a strategy on an in-process engine, or on a remote one (paradec.remote)."""
    if getattr(engine, "remote", False):
        return engine.lossless(name), engine.stream(name, request)
    strat = get(name)
    return strat.lossless, strat.stream(engine, request)


@dataclass
class Lane:
    """One strategy's run: its steps, tokens, text per segment and its own compute clock."""
    name: str
    params: dict = field(default_factory=dict)
    clock: float = 0.0
    steps: list[TimedStep] = field(default_factory=list)
    groups: list[dict] = field(default_factory=list)     # per step with tokens: segment, ids, text, t
    seg_ids: dict[int, list[int]] = field(default_factory=dict)
    planning_segments: set = field(default_factory=set)
    segments: dict[int, str] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    stage: str = ""                # the stage of the last step that named one (SoT: skeleton, expand, fallback)
    answer: str | None = None      # the strategy's assembled answer, when its last step gave one (SoT)
    status: str = "waiting"        # waiting | running | done | stopped | error
    finish_reason: str | None = None
    error: str | None = None
    lossless: bool = True

    def record(self, step: Step, dt: float) -> TimedStep:
        self.clock += dt
        planning = step.planning
        ts = TimedStep(self.clock, dt, len(step.token_ids), step.segment, step.forward_passes, step.draft_passes,
                       step.drafted, step.accepted, planning=planning,
                       draft_s=float(step.info.get("draft_s", 0.0)) if step.info else 0.0)
        self.steps.append(ts)
        if planning:
            self.planning_segments.add(step.segment)
        if step.token_ids or step.text:
            self.seg_ids.setdefault(step.segment, []).extend(step.token_ids)
            self.segments[step.segment] = self.segments.get(step.segment, "") + step.text
            self.groups.append({"segment": step.segment, "ids": list(step.token_ids), "text": step.text,
                                "t": self.clock})
        if step.info:
            self.info.update(step.info)
        if step.stage:
            self.stage = step.stage
        if step.answer is not None:
            self.answer = step.answer
        if step.finished and step.finish_reason:
            self.finish_reason = step.finish_reason
        return ts

    @property
    def token_ids(self) -> list[int]:
        """The answer's token ids: non-planning segments in order."""
        return [t for k in sorted(self.seg_ids) if k not in self.planning_segments for t in self.seg_ids[k]]

    @property
    def text(self) -> str:
        if self.answer is not None:
            return self.answer
        return "\n".join(self.segments[k] for k in sorted(self.segments) if k not in self.planning_segments)

    def figures(self) -> Figures:
        return figures(self.steps)

    def result(self) -> dict:
        f = self.figures()
        return {"strategy": self.name, "text": self.text, "token_ids": list(self.token_ids), "status": self.status,
                "finish_reason": self.finish_reason, "error": self.error, **f.as_dict(with_itl=True)}


def run_alone(engine, name: str, request: Request, params: dict | None = None, on_step=None,
              stream: tuple[bool, Iterator[Step]] | None = None) -> Lane:
    """Run one strategy by itself (benchmark mode), timing every step. `stream`: (lossless, steps) of a
    decoder that is not a registered strategy (the long-context eval's truncated baseline), timed the same way."""
    lane = Lane(name, dict(params or {}))
    req = _with_params(request, lane.params)
    lane.status = "running"
    try:
        with engine_lock(engine):
            lane.lossless, stream = stream or strategy_stream(engine, name, req)
            for step, dt in timed_steps(engine, stream):
                lane.record(step, dt)
                if on_step:
                    on_step(lane, step)
        lane.status = "done"
    except Exception as e:  # noqa: BLE001 - a failing strategy is a result, not a crash
        lane.status, lane.error = "error", f"{type(e).__name__}: {e}"
    return lane


def _with_params(request: Request, params: dict) -> Request:
    """The lane's own copy of the request (so every lane encodes its prompt in its own timed first step)."""
    from dataclasses import replace
    return replace(request, params={**request.params, **(params or {})})


class Race:
    """Several strategies on one prompt at the same time on one engine.

    `start()` runs them in a worker thread; `events()` yields dict events as they happen:
    {"type": "step", "lane": name, "text": new text, "ids": [...], "segment": k, "figures": {...}},
    {"type": "end", "lane": name, "status": ...}, and finally {"type": "done"}.
    """

    def __init__(self, engine, request: Request, strategies: list, params: dict | None = None):
        self.engine = engine
        self.request = request
        params = params or {}
        self.lanes: dict[str, Lane] = {}
        for s in strategies:
            name, p = (s, params.get(s, {})) if isinstance(s, str) else s
            self.lanes[name] = Lane(name, dict(p))
        self._queue: queue.Queue = queue.Queue()
        self._stop_all = threading.Event()
        self._stop: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.started_at: float | None = None
        self.finished = threading.Event()

    # ---------------------------------------------------------------- control
    def start(self) -> "Race":
        self._thread = threading.Thread(target=self._run, name="paradec-race", daemon=True)
        self._thread.start()
        return self

    def stop(self, name: str | None = None) -> None:
        if name is None:
            self._stop_all.set()
        else:
            with self._lock:
                self._stop.add(name)

    @property
    def stopping(self) -> bool:
        """Whether `stop()` (all lanes) was asked."""
        return self._stop_all.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self.finished.wait(timeout)

    def events(self, timeout: float | None = None) -> Iterator[dict]:
        while True:
            ev = self._queue.get(timeout=timeout)
            yield ev
            if ev["type"] == "done":
                return

    def run(self) -> dict[str, Lane]:
        """Run to the end in the calling thread (CLI, tests)."""
        self._run()
        return self.lanes

    # ---------------------------------------------------------------- worker
    def _run(self) -> None:
        self.started_at = time.time()
        gens = {}
        try:
            with engine_lock(self.engine):
                for name, lane in self.lanes.items():
                    try:
                        lane.lossless, stream = strategy_stream(self.engine, name,
                                                                _with_params(self.request, lane.params))
                        gens[name] = timed_steps(self.engine, stream)
                        lane.status = "running"
                    except Exception as e:  # noqa: BLE001
                        self._end(lane, "error", f"{type(e).__name__}: {e}")
                while gens:
                    if self._stop_all.is_set():
                        for name in list(gens):
                            self._end(self.lanes[name], "stopped")
                            gens.pop(name).close()
                        break
                    with self._lock:
                        for name in [n for n in gens if n in self._stop]:
                            self._end(self.lanes[name], "stopped")
                            gens.pop(name).close()
                    if not gens:
                        break
                    name = min(gens, key=lambda n: self.lanes[n].clock)   # furthest behind goes next
                    lane = self.lanes[name]
                    try:
                        step, dt = next(gens[name])
                    except StopIteration:
                        gens.pop(name)
                        self._end(lane, "done")
                        continue
                    except Exception as e:  # noqa: BLE001
                        gens.pop(name)
                        self._end(lane, "error", f"{type(e).__name__}: {e}")
                        continue
                    with self._lock:
                        lane.record(step, dt)
                    self._queue.put({"type": "step", "lane": name, "text": step.text, "ids": list(step.token_ids),
                                     "segment": step.segment, "info": dict(step.info),
                                     "figures": lane.figures().as_dict()})
        finally:
            self.finished.set()
            self._queue.put({"type": "done"})

    def _end(self, lane: Lane, status: str, error: str | None = None) -> None:
        with self._lock:
            lane.status, lane.error = status, error
        self._queue.put({"type": "end", "lane": lane.name, "status": status, "error": error,
                         "figures": lane.figures().as_dict()})

    # ---------------------------------------------------------------- views
    def snapshot(self) -> dict[str, dict]:
        """Per-strategy live figures (thread-safe), with speed-up and the lossless check against `ar`."""
        with self._lock:
            out = {n: {**l.result(), "groups": list(l.groups), "segments": dict(l.segments), "info": dict(l.info),
                       "stage": l.stage, "lossless_strategy": l.lossless}
                   for n, l in self.lanes.items()}
        ar = out.get("ar")
        for n, d in out.items():
            d["speedup"] = None
            d["diverges_at"] = None
            if ar and n != "ar":
                d["speedup"] = speedup([d["tokens_per_s"]], [ar["tokens_per_s"]])
                if ar["status"] == "done" and d["status"] == "done":
                    d["diverges_at"] = first_divergence(d["token_ids"], ar["token_ids"])
        return out

    def replay_schedule(self) -> list[tuple[float, str, int]]:
        """(time on the strategy's own clock, lane, group index) for every token group, in time order."""
        sched = [(g["t"], n, i) for n, l in self.lanes.items() for i, g in enumerate(l.groups)]
        return sorted(sched)
