"""The ``openai`` embedder: ``POST {LCM_EMBEDDING_BASE_URL}/embeddings`` on any
OpenAI-compatible server (OpenAI, Azure's compatible route, vLLM, llama.cpp, Ollama, LiteLLM).

Each call has a wall-clock bound (a server that drips bytes cannot hold a search), inputs go
in batches, and the answer is checked (one vector per input, all of one size) before anything
is stored.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from lcm.context.embed.protocol import EmbeddingError
from lcm.context.summarize.routes import RouteError, bounded_call, post_json, sendable
from lcm.vectors import embed_text, numpy, unit_rows

if TYPE_CHECKING:
    from lcm.vectors import Matrix

#: Inputs per request (OpenAI accepts up to 2048; smaller batches fail and retry cheaply).
BATCH = 128


class OpenAIEmbedder:
    """Embeds through an OpenAI-compatible ``/embeddings`` endpoint."""

    #: Nobody calibrated the endpoint's model here: no floor unless LCM_SEMANTIC_FLOOR sets one.
    floor = 0.0

    def __init__(self, base_url: str, model: str, api_key: str | None, *, dimensions: int = 0,
                 timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        self.model_name = model
        self.api_key = api_key
        self.dimensions = dimensions
        self.timeout = timeout
        # Vectors from one model at another size are another space: the size is in the name.
        self.model = f"openai:{model}" + (f"@{dimensions}" if dimensions else "")

    def embed(self, texts: Sequence[str], *, timeout: float | None = None) -> Matrix:
        np = numpy()
        if not texts:
            return np.zeros((0, max(self.dimensions, 1)), dtype=np.float32)  # type: ignore[no-any-return]
        parts = [self._batch(list(texts[i:i + BATCH]), timeout or self.timeout)
                 for i in range(0, len(texts), BATCH)]
        sizes = {p.shape[1] for p in parts}
        if len(sizes) != 1:
            raise EmbeddingError(f"the endpoint returned vectors of different sizes {sorted(sizes)}")
        return unit_rows(np.concatenate(parts))

    def _batch(self, texts: list[str], timeout: float) -> Matrix:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body: dict[str, Any] = {"model": self.model_name, "encoding_format": "float",
                                "input": [sendable(embed_text(t)) or " " for t in texts]}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        url = f"{self.base_url}/embeddings"
        try:
            status, raw = bounded_call(lambda: post_json(url, body, headers, timeout), timeout, url)
        except RouteError as exc:
            raise EmbeddingError(f"embedding endpoint {url}: {str(exc).removeprefix(url + ': ')}") from exc
        text = raw.decode("utf-8", "replace")
        if status in (401, 403):
            raise EmbeddingError(f"embedding endpoint {url}: HTTP {status}, the API key was refused "
                                 "(check LCM_EMBEDDING_API_KEY)")
        if status >= 400:
            raise EmbeddingError(f"embedding endpoint {url}: HTTP {status}: {text[:200]}")
        try:
            data = sorted(json.loads(text)["data"], key=lambda d: d.get("index", 0))
            rows = [d["embedding"] for d in data]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EmbeddingError(f"embedding endpoint {url}: unreadable answer: {text[:200]}") from exc
        if len(rows) != len(texts):
            raise EmbeddingError(f"embedding endpoint {url}: {len(rows)} vectors for {len(texts)} inputs")
        try:
            matrix = unit_rows(rows)
        except ValueError as exc:
            raise EmbeddingError(f"embedding endpoint {url}: vectors of uneven or invalid size") from exc
        if self.dimensions and matrix.shape[1] != self.dimensions:
            raise EmbeddingError(f"embedding endpoint {url}: asked for {self.dimensions} dimensions, "
                                 f"got {matrix.shape[1]}")
        return matrix
