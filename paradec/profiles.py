"""Model profiles: what differs between models, resolved once.

Everything the rest of paradec needs to know about a particular model - its context length, the tokens that end
a turn, the Skeleton-of-Thought prompt style, the default strategy parameters and where its draft model lives -
comes from `profile_for(model, tokenizer, path)`. Nothing else in the code checks a model's name.

A model is recognised by its folder name (the shipped and provisioned models) or, failing that, gets the generic
profile built from its own config: context = `max_position_embeddings`, stop tokens = the generation config's
EOS plus the chat-turn end tokens its tokenizer defines, the SoT paper's prompt wording.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "models"

# chat-turn end tokens of common model families: each one that is a special token of the tokenizer stops
TURN_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")


@dataclass(frozen=True)
class Profile:
    key: str                               # "qwen2.5-coder-0.5b-instruct", "paradec-tiny", or "generic"
    context_length: int = 2048
    stop_tokens: tuple[str, ...] = ()      # token strings that end generation besides the config's EOS
    sot_template: str = "generic"          # Skeleton-of-Thought prompt wording (strategies/skeleton.TEMPLATES)
    draft: Path | None = None              # the draft model `sps` / `hf-assisted` use by default
    adapters: Path | None = None           # where its shipped trained parameters live (ptp/, ...); None: the model folder
    strategy_defaults: dict = field(default_factory=dict)   # strategy -> {param: default}
    chars_per_token: float = 3.6           # English prose and Python source, for sizing long prompts

    def defaults_for(self, strategy: str) -> dict:
        return dict(self.strategy_defaults.get(strategy, {}))


KNOWN = {
    "paradec-tiny": Profile("paradec-tiny", context_length=512, sot_template="paradec-tiny",
                            draft=MODELS / "paradec-tiny-draft", chars_per_token=3.0),
    "paradec-tiny-draft": Profile("paradec-tiny-draft", context_length=512, sot_template="paradec-tiny",
                                  chars_per_token=3.0),
    # Qwen2.5-Coder-0.5B-Instruct: 32K native context; `<|im_end|>` ends a chat turn, `<|endoftext|>` a document.
    # Its draft is distilled here (`python -m paradec train draft --model ...`; paradec/draft.py), shipped in
    # data/drafts/ because the provisioned model folder is not part of the repository.
    "qwen2.5-coder-0.5b-instruct": Profile("qwen2.5-coder-0.5b-instruct", context_length=32768,
                                           stop_tokens=("<|im_end|>", "<|endoftext|>"), sot_template="generic",
                                           draft=ROOT / "data" / "drafts" / "qwen2.5-coder-0.5b-instruct",
                                           adapters=ROOT / "data" / "adapters" / "qwen2.5-coder-0.5b-instruct",
                                           chars_per_token=3.6),
}


def _key(path: str | None, model) -> str | None:
    names = []
    if path:
        names.append(Path(str(path)).name.lower())
    names.append(str(getattr(getattr(model, "config", None), "_name_or_path", "") or "").rstrip("/").split("/")[-1].lower())
    for n in names:
        if n in KNOWN:
            return n
    return None


def profile_for(model, tokenizer, path: str | None = None) -> Profile:
    """The profile of a loaded model (by folder name, else generic from its config and tokenizer)."""
    key = _key(path, model)
    cfg = getattr(model, "config", None)
    ctx = int(getattr(cfg, "max_position_embeddings", 0) or 2048)
    if key is not None:
        prof = KNOWN[key]
        return replace(prof, context_length=min(prof.context_length, ctx) if ctx else prof.context_length)
    specials = set(getattr(tokenizer, "all_special_tokens", []) or [])
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    stops = tuple(t for t in TURN_END_TOKENS if t in specials or (t in vocab and t.startswith("<|")))
    return Profile("generic", context_length=ctx, stop_tokens=stops)


def stop_ids(profile: Profile, tokenizer) -> set[int]:
    """Token ids of the profile's stop tokens that the tokenizer knows."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    return {int(vocab[t]) for t in profile.stop_tokens if t in vocab}
