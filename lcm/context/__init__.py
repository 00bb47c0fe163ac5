"""The host-neutral engine core: store each message once, compact into the summary DAG,
assemble the context, all through the storage ports.

``session`` (``ContextSession``: what an adapter drives), ``ingest`` (exactly-once alignment),
``compactor`` (passes), ``assembly`` (the context handed back), ``planning`` and ``budget``
(pure decisions), ``framing`` (what the summarizer reads), ``summarize`` (the summarizer),
``ports`` (the Protocols a store satisfies). Never imports ``lcm.store`` or SQLAlchemy.
"""
