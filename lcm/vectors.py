"""Embedding vectors as lcm stores and compares them: unit-length float32, little-endian bytes.

Every vector is normalised when it is made, so cosine similarity is a dot product wherever it
is computed (numpy over an agent's candidates, or a database extension). numpy comes with the
``[semantic]`` extra and is imported only when vectors are used: a store without embeddings
never loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lcm.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Matrix = npt.NDArray[np.float32]

#: The most text of one message or summary that is embedded: its beginning carries its topic,
#: and averaging or truncating models gain nothing from more.
EMBED_CHARS = 4_000
#: Why vectors cannot be used at all.
NEED_NUMPY = "embeddings need numpy: pip install numpy (it comes with lcm's semantic extra), or set LCM_EMBEDDINGS=off"


def numpy() -> Any:
    """The numpy module, or a ConfigError that says how to get it."""
    try:
        import numpy as np
    except ImportError:
        raise ConfigError(NEED_NUMPY) from None
    return np


def unit_rows(rows: Any) -> Matrix:
    """``rows`` (n x d numbers) as float32 rows of length one (a zero row stays zero)."""
    np = numpy()
    matrix = np.asarray(rows, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"expected a 2-d array of vectors, got shape {matrix.shape}")
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: Matrix = (matrix / norms).astype(np.float32, copy=False)
    return out


def to_blob(vector: Any) -> bytes:
    """One vector as the bytes stored in ``lcm_vectors.vector`` (float32, little-endian)."""
    np = numpy()
    return bytes(np.asarray(vector, dtype="<f4").tobytes())


def from_blobs(blobs: list[bytes], dims: int) -> Matrix:
    """Stored vectors back as an n x ``dims`` float32 matrix."""
    np = numpy()
    if not blobs:
        return np.zeros((0, dims), dtype=np.float32)  # type: ignore[no-any-return]
    joined = np.frombuffer(b"".join(blobs), dtype="<f4")
    return joined.reshape(len(blobs), dims).astype(np.float32, copy=False)  # type: ignore[no-any-return]


def embed_text(text: str | None) -> str:
    """What of a row's text is embedded (its first ``EMBED_CHARS`` characters)."""
    return (text or "")[:EMBED_CHARS]
