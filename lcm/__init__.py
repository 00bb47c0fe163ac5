"""lcm: Lossless Context Management for LLM agents.

Every message is stored verbatim and exactly once; older messages are compacted into a summary
DAG; each turn's prompt is assembled from the highest summaries plus a verbatim fresh tail; and
tools let the agent drill back to the exact original text. Storage runs on SQLite (embedded
default) or PostgreSQL (shared), behind one repository interface (``lcm.store.Store``).
"""

__version__ = "0.1.0"
