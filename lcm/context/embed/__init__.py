"""Embeddings: the embedders (a bundled local model, an OpenAI-compatible endpoint) and the
backfill that gives every stored message and summary its vector, in the background or on
demand (``lcm embed``)."""

from lcm.context.embed.embedder import embedder_for
from lcm.context.embed.indexer import BackfillResult, BackgroundIndexer, backfill
from lcm.context.embed.protocol import Embedder, EmbeddingError

__all__ = ["BackfillResult", "BackgroundIndexer", "Embedder", "EmbeddingError", "backfill", "embedder_for"]
