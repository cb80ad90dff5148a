"""The strategy contract: Request in, Steps out.

A strategy has a name, its parameters (defaults and validation) and `stream(engine, request)`, a generator
whose every `next()` does one unit of model work - one target forward pass plus whatever drafting belongs
to it - and yields a `Step`. Strategies never time themselves: the race runner times each `next()`.

`stream` does the set-up every strategy shares once (`Strategy.begin`: validate the request, encode its prompt,
resolve the parameters, the u stream, the `Output`, a KV cache) and hands the resulting `Run` to the
strategy's own `steps(run)`. Everything that controls a run is a typed field: of the `Request` (a given SoT
`skeleton`), of the `Step` (`stage`, `planning`, `answer`); `params` holds only the strategy's own parameters.
"""
from __future__ import annotations

import math
import weakref
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..sampling import SamplingParams, UStream

MAX_NEW_TOKENS_LIMIT = 4096
MAX_PROMPT_CHARS = 200_000


# Request.prompt_ids' memo, beside the requests rather than in them (a request's fields stay its own): id(request)
# -> (engine, what the ids were encoded from, ids); an entry goes when its request does.
_ENCODED: dict[int, tuple] = {}


class RequestError(ValueError):
    """A request parameter or prompt is invalid; the message says which and why."""


@dataclass
class Request:
    prompt: str = ""
    messages: list[dict] | None = None      # a chat conversation instead of a single prompt
    chat: bool = True                        # apply the chat template to `prompt` when the model has one
    assistant_prefix: str = ""               # text the assistant turn starts with (SoT pre-fills "1.")
    max_new_tokens: int = 128
    temperature: float = 0.0                 # 0 = greedy
    top_k: int = 0                           # 0 = off
    top_p: float = 1.0
    seed: int = 0
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    params: dict[str, Any] = field(default_factory=dict)   # the strategy's own parameters (Strategy.params)
    skeleton: str | list[str] | None = None  # SoT: a given skeleton (its text or its points), no skeleton pass;
    #                                          set in process only (tests, replays), never from a client
    max_context: int = 0                     # the context window in tokens (0 = the model's own): a smaller one
    #                                          evaluates a long-context method beyond its window on a model whose
    #                                          real context is larger (every limit below reads `context`)

    def context(self, engine) -> int:
        """The window this request runs in: `max_context` when set, else the model's context length."""
        return min(engine.context_length, self.max_context) if self.max_context else engine.context_length

    def context_phrase(self, engine) -> str:
        """How a message names that window: "the model's context of N tokens" or "the window of N tokens
        (max_context)"."""
        return window_phrase(engine, self.context(engine))

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p)

    def prompt_ids(self, engine) -> list[int]:
        """The prompt's token ids on `engine` (chat template applied as the request says). Encoded once per
        request object: the server's default max_tokens, its length check and the strategy all ask for them.
        A copy (`dataclasses.replace`) encodes again, so every lane of a race pays its own encoding."""
        source = (self.prompt, None if self.messages is None else [dict(m) for m in self.messages], self.chat,
                  self.assistant_prefix)
        memo = _ENCODED.get(id(self))
        if memo is None or memo[0] is not engine or memo[1] != source:
            if memo is None:
                weakref.finalize(self, _ENCODED.pop, id(self), None)
            memo = _ENCODED[id(self)] = (engine, source, list(engine.encode(self)))
        return list(memo[2])

    def validate(self, engine=None, long_ok: bool = False) -> list[int] | None:
        """Check every field; with an engine also encode the prompt and check it fits (unless `long_ok`: the
        strategy reads prompts longer than the context and checks them itself). Returns the prompt ids."""
        if self.messages is not None:
            if not isinstance(self.messages, list) or not self.messages or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in self.messages):
                raise RequestError("messages must be a non-empty list of {role, content} objects")
            text = "".join(m["content"] for m in self.messages)
        else:
            text = self.prompt
        if not isinstance(text, str) or not text.strip():
            raise RequestError("the prompt is empty")
        if len(text) > MAX_PROMPT_CHARS:
            raise RequestError(f"the prompt is {len(text):,} characters; the limit is {MAX_PROMPT_CHARS:,}")
        _check_int("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS_LIMIT)
        _check_num("temperature", self.temperature, 0.0, 10.0)
        _check_int("top_k", self.top_k, 0, 1_000_000)
        _check_num("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check_int("seed", self.seed, 0, 2**63 - 1)
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise RequestError("stop must be a list of non-empty strings")
        _check_int("max_context", self.max_context, 0, 10_000_000)
        if self.skeleton is not None and not isinstance(self.skeleton, str) and not (
                isinstance(self.skeleton, list) and all(isinstance(x, str) for x in self.skeleton)):
            raise RequestError("skeleton must be a text or a list of points")
        if engine is None:
            return None
        if self.max_context and engine.context_length and self.max_context > engine.context_length:
            raise RequestError(f"max_context is {self.max_context} but the model's context is "
                               f"{engine.context_length} tokens; give at most that (0 = the model's own)")
        if self.max_context and self.max_context <= self.max_new_tokens:
            raise RequestError(f"max_context ({self.max_context}) must be larger than max_new_tokens "
                               f"({self.max_new_tokens})")
        ids = self.prompt_ids(engine)
        if len(ids) + self.max_new_tokens > self.context(engine) and not long_ok:
            raise RequestError(
                f"the prompt is {len(ids)} tokens and max_new_tokens is {self.max_new_tokens}: together they "
                f"exceed {self.context_phrase(engine)}; shorten the prompt or lower max_new_tokens")
        return ids


def window_phrase(engine, C: int) -> str:
    """A window of C positions as messages name it: the model's context, or a smaller max_context window."""
    return f"the window of {C} tokens (max_context)" if C < engine.context_length else \
        f"the model's context of {C} tokens"


def _check_int(name, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, int):
        raise RequestError(f"{name} must be a whole number, got {v!r}")
    if not lo <= v <= hi:
        raise RequestError(f"{name} must be between {lo} and {hi}, got {v}")


def _check_num(name, v, lo, hi, low_open=False):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise RequestError(f"{name} must be a number, got {v!r}")
    if v > hi or v < lo or (low_open and v <= lo):
        raise RequestError(f"{name} must be in {'(' if low_open else '['}{lo}, {hi}], got {v}")


@dataclass
class Step:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    segment: int = 0                  # output segment (SoT: one per point; 0 otherwise)
    forward_passes: int = 0           # target-sized model calls in this step
    draft_passes: int = 0             # separate draft-model calls in this step
    drafted: int = 0                  # tokens proposed in this step
    accepted: int = 0                 # of those, accepted
    prefill: bool = False             # the step included the prompt prefill
    finished: bool = False
    finish_reason: str | None = None  # eos | length | stop | stopped | fallback...
    stage: str = ""                   # the part of a multi-stage strategy that made the step (SoT: skeleton,
    #                                   expand-prefix, expand, fallback); "" for single-stage strategies
    planning: bool = False            # the step's tokens plan the answer and are not part of it (SoT's skeleton)
    answer: str | None = None         # on the last Step: the answer, when it is not the segments' text in order
    info: dict = field(default_factory=dict)   # anything else worth showing (SoT skeleton, notes)


@dataclass
class Param:
    default: Any
    kind: type = int
    low: float | None = None
    high: float | None = None
    help: str = ""
    choices: tuple | None = None


@dataclass
class Run:
    """What a strategy's `steps` starts from: the set-up `Strategy.begin` does once for every strategy."""
    engine: Any
    request: Request
    params: dict                  # the resolved parameters (Strategy.resolve_params)
    ids: list[int] | None         # the prompt's token ids (None for a strategy that builds its own prompts)
    us: UStream | None            # the request's u stream (None when greedy)
    out: Output                   # the output: stopping rules and text
    cache: Any                    # an empty KV cache
    held: ExitStack = field(default_factory=ExitStack)   # what the run holds until it ends (`hold`)

    @property
    def sampling(self) -> SamplingParams:
        return self.request.sampling

    def hold(self, cm):
        """Enter the context manager `cm` for the rest of the run (it exits when the run ends, however it ends:
        finished, failed, or closed by a cancelled client); returns what it gives. Adapters' hooks are held so."""
        return self.held.enter_context(cm)


class Strategy:
    name: str = ""
    title: str = ""
    lossless: bool = True
    params: dict[str, Param] = {}
    accepts_long_prompts: bool = False   # reads prompts longer than the model's context (checks them itself)
    encodes_prompt: bool = True          # False: builds its own prompts from the request (SoT); not encoded

    def available(self, engine) -> tuple[bool, str]:
        """(usable with this engine, why not + the command that makes it usable)."""
        return True, ""

    def resolve_params(self, request: Request, engine=None) -> dict:
        """The request's parameters, checked, over the defaults (the engine's model profile may override a
        parameter's default, e.g. the SoT prompt style)."""
        out = {}
        profile = getattr(engine, "profile", None)
        defaults = profile.defaults_for(self.name) if profile is not None else {}
        unknown = set(request.params) - set(self.params)
        if unknown:
            raise RequestError(f"{self.name}: unknown parameter(s) {', '.join(sorted(unknown))}; "
                               f"known: {', '.join(self.params) or 'none'}")
        for k, p in self.params.items():
            v = request.params.get(k, defaults.get(k, p.default))
            if p.kind is bool:
                if not isinstance(v, bool):
                    raise RequestError(f"{self.name}: {k} must be true or false, got {v!r}")
            elif p.kind is str:
                if not isinstance(v, str) or (p.choices and v not in p.choices):
                    raise RequestError(f"{self.name}: {k} must be "
                                       f"{f'one of {p.choices}' if p.choices else 'a string'}, got {v!r}")
            else:
                if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                        or (p.kind is int and v != int(v))):
                    raise RequestError(f"{self.name}: {k} must be a {'whole number' if p.kind is int else 'number'}, "
                                       f"got {v!r}")
                v = p.kind(v)
                if (p.low is not None and v < p.low) or (p.high is not None and v > p.high):
                    raise RequestError(f"{self.name}: {k} must be between {p.low} and {p.high}, got {v}")
            out[k] = v
        return out

    def begin(self, engine, request: Request) -> Run:
        """The shared set-up: validate the request (and encode and length-check its prompt), resolve the
        parameters, and make the u stream, the Output and a KV cache."""
        if self.encodes_prompt:
            ids = request.validate(engine, long_ok=self.accepts_long_prompts)
        else:
            ids = request.validate()
        params = self.resolve_params(request, engine)
        return Run(engine, request, params, ids, u_stream(request), Output(engine, request),
                   engine.new_cache(prompt=len(ids)) if ids else engine.new_cache())

    def stream(self, engine, request: Request) -> Iterator[Step]:
        """The Steps of one run (a generator: the set-up happens on the first `next()`, inside the timed region
        like the rest of the work)."""
        run = self.begin(engine, request)
        with run.held:
            yield from self.steps(run)

    def steps(self, run: Run) -> Iterator[Step]:
        raise NotImplementedError


class Output:
    """One output segment: accepts tokens, applies EOS / max_new_tokens / stop strings, streams text.

    Every strategy feeds its accepted tokens through `add`, which returns the Step fields for them, so
    stopping rules and incremental detokenization exist once.
    """

    def __init__(self, engine, request: Request, budget: int | None = None):
        self.engine = engine
        self.request = request
        self.budget = request.max_new_tokens if budget is None else budget
        self.ids: list[int] = []
        self.text = ""              # text emitted so far
        self.done = False
        self.finish_reason: str | None = None
        # incremental detokenisation: text is decoded from `_prefix` on, and what ids[_prefix:_read] decoded to
        # is already in `self.text`; so each call decodes a short tail, never the whole output
        self._prefix = 0
        self._read = 0

    def _tail_text(self) -> str | None:
        """The text of the tokens after `_read`, or None while they end inside a UTF-8 sequence."""
        dec = self.engine.decode
        before = dec(self.ids[self._prefix:self._read])
        tail = dec(self.ids[self._prefix:])
        if tail.endswith("\ufffd") and not self.done:
            return None
        if not tail.startswith(before):     # a tokenizer whose decode is not concatenative here: decode it all
            full = dec(self.ids)
            new = full[len(self.text):] if full.startswith(self.text) else ""
        else:
            new = tail[len(before):]
        # keep a few tokens of left context so the next tail decodes the same way the whole would
        self._prefix, self._read = max(0, len(self.ids) - 4), len(self.ids)
        return new

    def add(self, new_ids) -> tuple[list[int], str]:
        """Append tokens (stopping where a rule says); returns (ids kept, new text)."""
        kept = []
        for t in map(int, new_ids):
            if self.done:
                break
            if t in self.engine.eos_ids and not self.request.ignore_eos:
                self.done, self.finish_reason = True, "eos"
                break
            kept.append(t)
            self.ids.append(t)
            if len(self.ids) >= self.budget:
                self.done, self.finish_reason = True, "length"
        new = self._tail_text() if len(self.ids) > self._read else ""
        if new is None:                     # an incomplete UTF-8 sequence: wait for more bytes
            return kept, ""
        if self.request.stop and new:
            full = self.text + new
            cut = min((i for i in (full.find(s, max(0, len(self.text) - len(s) + 1)) for s in self.request.stop)
                       if i >= 0), default=-1)
            if cut >= 0:
                self.done, self.finish_reason = True, "stop"
                new = full[len(self.text):cut] if cut >= len(self.text) else ""
                self.text = full[:cut]
                return kept, new
        self.text += new
        return kept, new

    def step(self, new_ids, **fields) -> Step:
        kept, text = self.add(new_ids)
        return Step(token_ids=kept, text=text, finished=self.done, finish_reason=self.finish_reason, **fields)


REGISTRY: dict[str, Callable[[], Strategy]] = {}


def register(cls):
    REGISTRY[cls.name] = cls
    return cls


def get(name: str) -> Strategy:
    from . import load_all
    load_all()
    if name not in REGISTRY:
        raise RequestError(f"unknown strategy {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]()


def trained_availability(what: str, load, fits, hint: str) -> tuple[bool, str]:
    """`Strategy.available` for a strategy that needs trained parameters: `load()` gives them or None,
    `fits(them)` says whether they belong to this model; `hint` is the command that trains them."""
    try:
        obj = load()
    except Exception as e:  # noqa: BLE001 - a broken parameters file: say why
        return False, f"{what} could not be loaded ({e}); {hint}"
    if obj is None:
        return False, hint
    if not fits(obj):
        return False, f"{what}: trained for another model; {hint}"
    return True, ""


def length_check_engine(engine, names):
    """The engine to check a prompt's length against before a run of `names`, or None when one of them reads
    prompts longer than the context (`pcw`, `focus`): those check it themselves, and any other strategy in the
    run fails in its own lane with the usual message. Remote engines check on the server."""
    if getattr(engine, "remote", False):
        return None
    from . import load_all
    load_all()
    names = [names] if isinstance(names, str) else list(names)
    return None if any(getattr(REGISTRY.get(n), "accepts_long_prompts", False) for n in names) else engine


def u_stream(request: Request) -> UStream | None:
    return None if request.sampling.greedy else UStream(request.seed)
