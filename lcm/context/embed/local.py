"""The local embedder: WordLlama's ``l2_supercat`` static model (256 dimensions), whose weights
and tokenizer ship inside the ``wordllama`` wheel (``pip install 'lossless-context[semantic]'``).

Chosen by measurement (docs/benchmarks.md, recall): it needs no model hub at run time (the
ONNX MiniLM/bge packages and model2vec/fastembed all download weights on first use, which
fails offline), loads in ~0.2 s, embeds 13-18k messages a second on one core, and on the
recall benchmark's paraphrased questions finds what full text cannot. A static model averages
token vectors: it knows synonyms, not sentence structure.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lcm.context.embed.protocol import EmbeddingError
from lcm.vectors import embed_text, numpy, unit_rows

if TYPE_CHECKING:
    from lcm.vectors import Matrix

MODEL_CONFIG = "l2_supercat"
MODEL_DIMS = 256
#: Texts per call to the model (its own batching; bounded memory for a backfill).
BATCH = 256


class WordLlamaEmbedder:
    """Embeds with the WordLlama model bundled in its package, loaded once on first use."""

    model = f"local:wordllama-{MODEL_CONFIG}-{MODEL_DIMS}"

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    import wordllama
                    from wordllama import WordLlama
                except ImportError as exc:
                    raise EmbeddingError("LCM_EMBEDDINGS=local needs the [semantic] extra: "
                                         "pip install 'lossless-context[semantic]'") from exc
                # The package's own directory is the cache: its wheel holds weights/ and
                # tokenizers/ there, and downloads are off (a missing file is an error, never
                # a request to a model hub).
                package_dir = Path(wordllama.__file__).parent
                try:
                    self._model = WordLlama.load(MODEL_CONFIG, dim=MODEL_DIMS, cache_dir=package_dir,
                                                 disable_download=True)
                except (FileNotFoundError, ValueError, OSError) as exc:
                    raise EmbeddingError(f"the local embedding model did not load ({exc}); "
                                         "reinstall with pip install 'lossless-context[semantic]'") from exc
            return self._model

    def embed(self, texts: Sequence[str], *, timeout: float | None = None) -> Matrix:
        model = self._loaded()
        if not texts:
            np = numpy()
            return np.zeros((0, MODEL_DIMS), dtype=np.float32)  # type: ignore[no-any-return]
        rows = model.embed([embed_text(t) or " " for t in texts], norm=False, batch_size=BATCH)
        return unit_rows(rows)
