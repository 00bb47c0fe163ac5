"""``lcm embed``: give every stored message and summary its vector (semantic and hybrid search).

A running engine embeds new rows in the background; this command fills in a store that was
imported, written with embeddings off, or embedded by another model. The database is the
queue: interrupted, it resumes where it stopped; run again, it embeds nothing twice.
"""

from __future__ import annotations

import time

import click

from lcm.cli.common import emit_json, json_option, progress_bar, resumable, say, url_option
from lcm.cli.stores import open_store
from lcm.config import LcmConfig, install_command
from lcm.context.embed import backfill, embedder_for
from lcm.errors import ConfigError


@click.command("embed")
@url_option
@click.option("--agent", default=None, metavar="NAME", help="Only this agent's rows (default: every agent).")
@json_option
@click.option("--batch", default=256, show_default=True, type=click.IntRange(1, 5000),
              help="Rows embedded and written per transaction.")
@click.option("--prune", is_flag=True, help="Then delete the vectors of other (earlier) embedding models.")
def embed_command(url: str | None, agent: str | None, as_json: bool, batch: int, prune: bool) -> None:
    """Embed every message and summary that has no vector of the configured model yet
    (LCM_EMBEDDINGS; resumable, idempotent)."""
    config = LcmConfig.from_env()
    embedder = embedder_for(config)
    if embedder is None:
        raise ConfigError(f"embeddings are off: set LCM_EMBEDDINGS=local ({install_command('semantic')}) "
                          "or LCM_EMBEDDINGS=openai with LCM_EMBEDDING_BASE_URL and LCM_EMBEDDING_MODEL")
    store = open_store(url)
    before = store.vectors.coverage(embedder.model, agent=agent)
    started = time.perf_counter()
    with progress_bar(not as_json and before.pending > 0) as bar:
        progress = None
        if bar is not None:
            task = bar.add_task(f"embed with {embedder.model}", total=before.pending, unit="rows")
            progress = lambda n: bar.advance(task, n)  # noqa: E731 - one call site
        with resumable("embed", "every vector written so far is kept"):
            done = backfill(store.vectors, embedder, agent=agent, batch=batch, progress=progress)
    seconds = time.perf_counter() - started
    pruned = store.vectors.prune(embedder.model, agent=agent) if prune else 0
    after = store.vectors.coverage(embedder.model, agent=agent)
    if as_json:
        emit_json({"model": embedder.model, "agent": agent, "embedded": {"messages": done.messages,
                   "summaries": done.summaries}, "seconds": round(seconds, 3), "pruned": pruned,
                   "coverage": after.as_dict()})
        return
    rate = f" ({done.embedded / seconds:,.0f}/s)" if done.embedded and seconds > 0 else ""
    say(f"embedded {done.messages} messages and {done.summaries} summaries with {embedder.model} "
        f"in {seconds:.1f} s{rate}; coverage {after.share:.0%}")
    if pruned:
        say(f"deleted {pruned} vectors of other models")
    elif after.other_models:
        say("vectors of other models are kept but never searched: "
            + ", ".join(f"{m} ({n})" for m, n in after.other_models.items()) + "; lcm embed --prune deletes them")
