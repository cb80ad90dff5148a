"""Decoding strategies, one file each, registered by name in `base.REGISTRY`."""
import importlib

from .base import REGISTRY, Output, Param, Request, RequestError, Step, Strategy, get, register  # noqa: F401

MODULES = ["autoregressive", "hf_generate", "speculative", "prompt_lookup", "lookahead", "skeleton",
           "ptp", "lexical_units", "parallel_context"]


def load_all() -> dict:
    for m in MODULES:
        try:
            importlib.import_module(f"{__name__}.{m}")
        except ModuleNotFoundError as e:   # a strategy file not written yet
            if e.name != f"{__name__}.{m}":
                raise
    return REGISTRY
