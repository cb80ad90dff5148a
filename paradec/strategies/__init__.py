"""Decoding strategies, one file each, registered by name in `base.REGISTRY`."""
import importlib

from .base import (REGISTRY, Output, Param, Request, RequestError, Run, Step, Strategy, get,  # noqa: F401
                   length_check_engine, register)

MODULES = ["autoregressive", "hf_generate", "speculative", "eagle", "prompt_lookup", "lookahead", "skeleton",
           "ptp", "lexical_units", "lexical_units_verified", "parallel_context", "ape",
           "focus_llm"]


def load_all() -> dict:
    for m in MODULES:
        try:
            importlib.import_module(f"{__name__}.{m}")
        except ModuleNotFoundError as e:   # a strategy file not written yet
            if e.name != f"{__name__}.{m}":
                raise
    # one canonical order whatever imported what first: the UI and its API list strategies positionally

    def key(item):
        mod = item[1].__module__.rsplit(".", 1)[-1]
        return (MODULES.index(mod) if mod in MODULES else len(MODULES), item[0])
    ordered = sorted(REGISTRY.items(), key=key)
    if list(REGISTRY) != [n for n, _ in ordered]:
        REGISTRY.clear()
        REGISTRY.update(ordered)
    return REGISTRY


def preload(engine) -> None:
    """Load the engine's drafts and measure the pass costs `sps`, `eagle` and `lud-verified` read, now: before any
    request thread (a cost timed while other lanes run reads them wrong, and the first request would wait for it)."""
    from .eagle import preload as eagle_costs
    from .lexical_units_verified import preload as lud_costs
    from .speculative import preload_drafts
    preload_drafts(engine)
    eagle_costs(engine)
    lud_costs(engine)
