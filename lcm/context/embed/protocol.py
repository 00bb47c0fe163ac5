"""What an embedder is (``Embedder``) and how it fails (``EmbeddingError``): below the factory
(``embedder``) and the two kinds it makes (``local``, ``remote``), so imports inside the
package run one way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from lcm.errors import LcmError

if TYPE_CHECKING:
    from lcm.vectors import Matrix


class EmbeddingError(LcmError):
    """An embedder failed (endpoint down, refused, timed out, unreadable answer, model missing)."""


class Embedder(Protocol):
    """Something that turns texts into unit-length float32 vectors."""

    @property
    def model(self) -> str:
        """The name recorded with every vector it makes: vectors of two models never mix."""

    @property
    def floor(self) -> float:
        """The cosine below which a text means nothing close to the query: calibrated per model
        (docs/recall.md); 0 for a model nobody calibrated."""

    def embed(self, texts: Sequence[str], *, timeout: float | None = None) -> Matrix:
        """One unit-length row per text; raises EmbeddingError."""
