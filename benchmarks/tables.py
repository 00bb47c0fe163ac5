"""Benchmark results as tables: built once, rendered for the terminal (rich) or as Markdown.

One definition per phase keeps the printed tables and ``docs/benchmarks.md`` (written by
``python -m benchmarks.report results.json``) from drifting apart.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TableSpec:
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    left: frozenset[str] = frozenset({"backend"})  # columns aligned left; the rest are figures
    notes: list[str] = field(default_factory=list)  # printed under the table


def f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def ingest(results: list[dict[str, Any]]) -> list[TableSpec]:
    spec = TableSpec("ingest: lcm against the raw driver (same corpus, same machine, same run)",
                     ["backend", "per-turn lcm turns/s", "raw turns/s", "ratio", "lcm p50/p95 ms",
                      "tokenizer excluded: turns/s", "ratio", "bulk lcm msgs/s", "raw msgs/s", "ratio",
                      "peak RSS MB"],
                     notes=["goal: per-turn ingest at >= 50% of the raw driver's rate; 'tokenizer excluded' "
                            "is lcm with exact token counting swapped for chars/4 (the raw driver counts none)"])
    gap = TableSpec("ingest: where the per-turn gap to the raw driver goes (ratio to raw turns/s, same run)",
                    ["backend", "lcm", "tokenizer excluded", "index upkeep excluded", "both excluded"],
                    notes=["each pass on a fresh database; lcm's rate includes indexing what is still pending "
                           "at the end (SQLite indexes messages in batches, PostgreSQL stems them after the "
                           "turn); 'index upkeep excluded' takes the search indexes' work out (SQLite: the "
                           "batched FTS5 catch-up never runs; PostgreSQL: the stemmed catch-up never runs and "
                           "the exact GIN index is dropped); measurement only, lcm never runs that way"])
    for r in results:
        t, b = r["per_turn"], r["bulk"]
        spec.rows.append([r["backend"], f(t["lcm_turns_per_s"], 0), f(t["raw_turns_per_s"], 0), f"{t['ratio']:.0%}",
                          f"{f(t['lcm_ms']['p50'])} / {f(t['lcm_ms']['p95'])}",
                          f(t.get("no_tokenizer_turns_per_s"), 0), _pct(t.get("no_tokenizer_ratio")),
                          f(b["lcm_msgs_per_s"], 0),
                          f(b["raw_msgs_per_s"], 0), f"{b['ratio']:.0%}", f(r["peak_rss_mb"], 0)])
        if "own_path_ratio" in t:
            gap.rows.append([r["backend"], f"{t['ratio']:.0%}", _pct(t.get("no_tokenizer_ratio")),
                             _pct(t.get("no_index_upkeep_ratio")), _pct(t.get("own_path_ratio"))])
    return [spec, gap] if gap.rows else [spec]


def search(results: list[dict[str, Any]]) -> list[TableSpec]:
    specs = []
    for r in results:
        spec = TableSpec(
            f"lcm_grep against the raw FTS query, {r['backend']}, {r['messages']:,} messages "
            f"({r['store_bytes'] / 1_048_576:,.0f} MB, loaded at {r['messages'] / r['load_seconds']:,.0f} msg/s), ms",
            ["class", "scope", "sort", "lcm p50", "lcm p95", "raw p50", "raw p95", "p95 ratio", "avg hits"],
            left=frozenset({"class", "scope", "sort"}))
        for row in r["rows"]:
            lcm, raw = row["lcm"], row["raw"]
            spec.rows.append([row["class"], row["scope"], row["sort"], f(lcm["p50"]), f(lcm["p95"]), f(raw["p50"]),
                              f(raw["p95"]), f"{lcm['p95'] / raw['p95']:.2f}x" if raw["p95"] else "-",
                              f(row["hits"], 1)])
        rec = r["recall"]
        worst = max(row["lcm"]["p95"] for row in r["rows"])
        spec.notes.append(f"needle recall {rec['found']}/{rec['total']} "
                          f"({100.0 * rec['found'] / max(rec['total'], 1):.1f}%); worst lcm_grep p95 {worst:.1f} ms; "
                          f"peak RSS {r['peak_rss_mb']:.0f} MB (goal: p95 <= 50 ms at 1M, recall 100%)")
        specs.append(spec)
    return specs


def turn_overhead(results: list[dict[str, Any]]) -> list[TableSpec]:
    ops = ["ingest one turn", "should_compress", "compress (nothing to do)", "whole turn"]
    spec = TableSpec("per-turn overhead (ms, p50 / p95) as history grows", ["backend", "stored", *ops, "peak RSS MB"],
                     notes=["goal: flat in history size, <= 5 ms at 100k messages"])
    for r in results:
        spec.rows.append([r["backend"], f"{r['stored']:,}",
                          *(f"{f(r['ops'][op]['p50'])} / {f(r['ops'][op]['p95'])}" for op in ops),
                          f(r["peak_rss_mb"], 0)])
    return [spec]


def compaction(results: list[dict[str, Any]]) -> list[TableSpec]:
    spec = TableSpec("compaction with the extractive summarizer (LLM time excluded)",
                     ["backend", "messages", "compacted", "seconds", "msgs/s", "summaries", "DAG", "peak RSS MB"],
                     left=frozenset({"backend", "DAG"}))
    for r in results:
        spec.rows.append([r["backend"], f"{r['messages']:,}", f"{r['compacted']:,}", f(r["seconds"]),
                          f(r["msgs_per_s"], 0), str(r["leaves"] + r["condensed"]),
                          " ".join(f"{k}:{v}" for k, v in sorted(r["depths"].items())), f(r["peak_rss_mb"], 0)])
    return [spec]


def startup(results: list[dict[str, Any]]) -> list[TableSpec]:
    spec = TableSpec("start-up: a new process opens an existing store and serves the first turn (s)",
                     ["backend", "store MB", "messages", "import", "open", "first turn", "total in process",
                      "process wall", "child RSS MB"],
                     notes=["goal: under 1 s on a 1 GB store"])
    for r in results:
        spec.rows.append([r["backend"], f(r["store_bytes"] / 1_048_576, 0), f"{r['messages']:,}", f(r["import_s"], 3),
                          f(r["open_s"], 3), f(r["first_turn_s"], 3), f(r["total_s"], 3), f(r["process_wall_s"], 3),
                          f(r["peak_rss_mb"], 0)])
    return [spec]


def cache(results: list[dict[str, Any]]) -> list[TableSpec]:
    """lcm and Hermes' compressor side by side, per window and variant (idle gaps or not)."""
    specs = []
    for r in results:
        spec = TableSpec(
            f"prompt-cache cost, lcm against Hermes' ContextCompressor, {r['backend']}, "
            f"{r['rows'][0]['turns'] if r['rows'] else 0} turns (same transcript, same host loop, same run)",
            ["window", "gaps", "engine", "repeated prefix", "busted", "bursts", "turns/burst",
             "summarizer calls/100 turns", "summarizer input/100 turns", "largest prompt", "mean prompt",
             "cost (M token-eq)", "cost ratio", "recoverable"],
            left=frozenset({"window", "gaps", "engine"}),
            notes=["cost: cache-priced input, a prefix repeated within the cache TTL (300 s) at 0.1, the rest and "
                   "every summarizer input token at 1; 'gaps': a pause longer than the TTL before every 10th turn; "
                   "goals: cost ratio <= 1.2 (64k) and <= 1.0 (200k), repeated prefix >= 88% (64k), at most one "
                   "burst per 4 turns, largest prompt < 100% of the window, every message recoverable"])
        for row in r["rows"]:
            for engine in ("lcm", "hermes"):
                e = row[engine]
                tpb = e["turns_per_burst"]
                spec.rows.append([
                    f"{row['window'] // 1000}k", "idle" if row["idle"] else "-", engine,
                    _pct(e["repeated_share"]), str(e["busted"]), str(e["bursts"]), f(tpb, 1),
                    f(e["summarizer_calls_per_100"], 1), f(e["summarizer_input_per_100"], 0),
                    _pct(e["largest_prompt_share"]), f(e["mean_prompt_tokens"], 0), f(e["cost"] / 1e6, 2),
                    f"{row['cost_ratio']:.3f}" if engine == "lcm" else "1", _pct(e["recoverable_share"])])
        recall = [row for row in r["rows"] if "auto_recall" in row]
        if recall:
            spec.notes.append("auto-recall (lcm's block in the API copy of each user message, replayed as Hermes "
                              "replays pre_llm_call context): " + "; ".join(
                                  f"{row['window'] // 1000}k{' idle' if row['idle'] else ''} cost "
                                  f"{row['auto_recall']['cost_ratio_vs_lcm']:.3f}x lcm without it "
                                  f"({row['auto_recall']['cost_ratio_vs_hermes']:.3f}x Hermes), "
                                  f"{row['auto_recall']['block_tokens_per_turn']:.0f} tokens/turn, "
                                  f"{_pct(row['auto_recall']['turns_with_block'])} of turns"
                                  for row in recall))
        exact = all(row["lcm"]["stored_exactly"] and row.get("auto_recall", {}).get("stored_exactly", True)
                    for row in r["rows"])
        spec.notes.append(f"lcm stored every message byte-exact: {'yes' if exact else 'NO'}; cache-read share lcm "
                          "computed from the usage it was sent: "
                          + ", ".join(f"{row['window'] // 1000}k{' idle' if row['idle'] else ''} "
                                      f"{_pct(row['lcm']['reported_cache_read_share'])}" for row in r["rows"]))
        specs.append(spec)
        sweep = TableSpec(f"compaction target sweep, {r['backend']}: lcm at each LCM_COMPACTION_TARGET against the "
                          "same Hermes run (no idle gaps)",
                          ["window", "target", "cost ratio", "repeated prefix", "busted", "turns/burst",
                           "summarizer input/100 turns", "mean prompt", "largest prompt"],
                          left=frozenset({"window"}),
                          notes=["a lower target makes every request smaller and bursts rarer; a higher one keeps "
                                 "more verbatim text in the prompt"])
        for row in r["rows"]:
            for s in row.get("sweep", []):
                sweep.rows.append([f"{row['window'] // 1000}k", f"{s['target']:.2f}", f"{s['cost_ratio']:.3f}",
                                   _pct(s["repeated_share"]), str(s["busted"]), f(s["turns_per_burst"], 1),
                                   f(s["summarizer_input_per_100"], 0), f(s["mean_prompt_tokens"], 0),
                                   _pct(s["largest_prompt_share"])])
        if sweep.rows:
            specs.append(sweep)
    return specs


def recall_table(title: str, result: dict[str, Any], wanted: list[str], notes: list[str]) -> TableSpec:
    """One recall table: a row per mode, recall@5 / recall@10 per class (of ``wanted`` the ones
    measured), latency."""
    first = result["rows"][0]["classes"]
    keys = [k for k in wanted if k in first]
    spec = TableSpec(title, ["mode", *(f"{k} ({first[k]['questions']})" for k in keys), "p50 ms", "p95 ms"],
                     left=frozenset({"mode"}), notes=notes)
    for row in result["rows"]:
        c = row["classes"]
        spec.rows.append([row["mode"], *(f"{c[k]['recall@5']:.2f} / {c[k]['recall@10']:.2f}" for k in keys),
                          f(row["latency_ms"]["p50"], 1), f(row["latency_ms"]["p95"], 1)])
    return spec


def recall(results: list[dict[str, Any]]) -> list[TableSpec]:
    """Per backend and size: recall@5/@10 per question class and latency, per mode."""
    return [recall_table(
        f"recall of questions asked in plain words, {r['backend']}, {r['messages']:,} messages, "
        f"{r['questions']} questions (recall@5 / recall@10)", r, ["all", "named", "paraphrase", "temporal"],
        ["full_text: lcm_grep with mode=full_text (every word, then any content word by BM25); "
         "semantic: nearest vectors of the bundled local model (extra: semantic); hybrid: both "
         "fused by reciprocal rank (the default with embeddings on); all_words: every word required "
         "(lcm before issue 15); bm25s: a plain BM25 index over the same messages, same run"
         + (f"; embedding the {r['messages']:,} messages (lcm embed) took {r['embed_s']:.1f} s "
            f"({r['messages'] / r['embed_s']:,.0f} messages/s)" if r.get("embed_s") and r.get("vectors") != "stand-in"
            else "")
         + ("; STAND-IN VECTORS (random, under the model's name): semantic and hybrid recall mean nothing "
            "here, their latency is real" if r.get("vectors") == "stand-in" else "")]) for r in results]


def fleet(results: list[dict[str, Any]]) -> list[TableSpec]:
    """Per backend: throughput and latency against the number of agent processes."""
    specs = []
    for r in results:
        spec = TableSpec(
            f"fleet: N agent processes on one {r['backend']} database, {r['seconds']:.0f} s each "
            "(turns of ~640 tokens, extractive compaction, lcm_grep every 5th turn)",
            ["agents", "turns/s", "msgs/s", "turn p50 ms", "p95", "p99", "search p95 loaded", "search p95 alone",
             "errors", "raw commits/s", "lcm share"],
            left=frozenset({"agents"}),
            notes=["raw commits/s: N raw-driver processes committing one message-sized row per transaction for the "
                   "same time (the server's own ceiling for this write shape); lcm share: lcm turns/s (one "
                   "transaction of 4 messages each, plus compaction and search) over raw commits/s"])
        for row in r["rows"]:
            spec.rows.append([str(row["agents"]), f(row["turns_per_s"], 1), f(row["messages_per_s"], 0),
                              f(row["turn_ms"]["p50"], 1), f(row["turn_ms"]["p95"], 1), f(row["turn_ms"]["p99"], 1),
                              f(row["search_p95_ms"], 1), f(row["search_alone_p95_ms"], 1), str(row["errors"]),
                              f(row["raw_commits_per_s"], 0),
                              _pct(row["turns_per_s"] / row["raw_commits_per_s"]) if row["raw_commits_per_s"] else "-"])
        specs.append(spec)
    return specs


def ui(results: list[dict[str, Any]]) -> list[TableSpec]:
    """Per backend and size: each explorer page's p50 / p95 over HTTP."""
    specs = []
    for r in results:
        spec = TableSpec(f"lcm ui pages over HTTP, {r['backend']}, {r['messages']:,} messages in {r['sessions']} "
                         f"sessions (ms, {r['runs']} requests each)", ["page", "p50", "p95"],
                         left=frozenset({"page"}),
                         notes=[f"baseline: the raw driver's query for the same session's 50 newest rows, p50 "
                                f"{f(r['raw_session_page_ms']['p50'])} / p95 {f(r['raw_session_page_ms']['p95'])} ms "
                                "(no HTTP, no rendering)"])
        for page, ms in r["pages_ms"].items():
            spec.rows.append([page, f(ms["p50"]), f(ms["p95"])])
        specs.append(spec)
    return specs


def cli(results: list[dict[str, Any]]) -> list[TableSpec]:
    """Per backend: whole processes of the command line, with the interpreter as the baseline."""
    specs = []
    for r in results:
        commands = r["commands"]
        base = commands["python -c pass (interpreter)"]["p50"]
        spec = TableSpec(f"the command line's start-up, {r['backend']} (whole processes, s, {r['runs']} runs each)",
                         ["command", "p50", "p90", "fastest", "p50 over the interpreter"], left=frozenset({"command"}),
                         notes=["goal: lcm --version and lcm --help under 0.2 s"])
        for name, t in commands.items():
            spec.rows.append([name, f(t["p50"], 3), f(t["p90"], 3), f(t["min"], 3), f(t["p50"] - base, 3)])
        specs.append(spec)
    return specs


def locomo(results: list[dict[str, Any]]) -> list[TableSpec]:
    """Per backend: recall@5 / recall@10 on LoCoMo per mode, overall, per category and per conversation."""
    return [recall_table(
        f"LoCoMo recall, {r['backend']}: {r['questions']} questions over {r['messages']:,} turns of "
        f"{len(r['conversations'])} conversations (recall@5 / recall@10)", r,
        ["all", "single-hop", "multi-hop", "temporal", "open-domain", *r["conversations"]],
        ["each question as asked through lcm_grep (session_scope all, sort relevance); a hit is an evidence "
         "turn among the top k; bm25s: a plain BM25 index over the same turns, same run; stored as the "
         "held-back measurement stores them (one agent per conversation, one session per LoCoMo session)"])
        for r in results]


def locomo_prompt(results: list[dict[str, Any]]) -> list[TableSpec]:
    """Per backend: the share of questions whose evidence turn is verbatim in what the model
    receives, per category, and what the auto-recall block costs per user turn."""
    specs = []
    for r in results:
        classes = r["classes"]
        names = ["all", "single-hop", "multi-hop", "temporal", "open-domain"]
        spec = TableSpec(
            f"Evidence in the prompt, {r['backend']}: {classes['all']['questions']} LoCoMo questions, "
            f"{r['window']:,}-token window, {r['messages']:,} turns, {r['compactions']} compactions",
            ["what the model receives", *[f"{n} ({classes[n]['questions']})" for n in names if n in classes]],
            left=frozenset({"what the model receives"}),
            notes=[f"auto-recall block: {r['block_tokens_per_turn']:.0f} tokens per user turn on average over "
                   f"{r['user_turns']:,} replayed turns ({_pct(r['turns_with_block'])} of turns get one, "
                   f"{r['block_tokens_when_added']:.0f} tokens when they do); recall p50 "
                   f"{f(r['recall_latency_ms']['p50'], 1)} ms, p95 {f(r['recall_latency_ms']['p95'], 1)} ms; "
                   f"search {'hybrid (local model)' if r['semantic'] else 'full text'}",
                   "tail only: the first 3 and last 20 messages, what Hermes' compressor keeps verbatim "
                   "(its summary is prose: not counted)"])
        for key, label in (("tail", "tail only (Hermes' defaults)"), ("lcm", "lcm, no recall"),
                           ("recall_only", "the recall block alone"), ("lcm_recall", "lcm + auto-recall")):
            spec.rows.append([label, *[_pct(classes[n][key]) for n in names if n in classes]])
        specs.append(spec)
    return specs


def _skipped(what: str, result: dict[str, Any]) -> TableSpec:
    """A phase that did not run on this backend or machine, and why."""
    return TableSpec(f"{what}, {result['backend']}: skipped", ["why"], left=frozenset({"why"}),
                     rows=[[result["skipped"]]])


def server_cost(results: list[dict[str, Any]]) -> list[TableSpec]:
    """PostgreSQL: what the server spends per agent turn, per repeat, against the raw driver."""
    specs = []
    for r in results:
        if "skipped" in r:
            specs.append(_skipped("server cost per turn", r))
            continue
        per_core = r["agents_per_core"]
        median = r["lcm_cpu_ms_per_turn"]["median"]
        spec = TableSpec(
            f"server cost per agent turn, PostgreSQL, private cluster ({r['turns']} turns per pass, "
            f"{r['repeats']} interleaved repeats)",
            ["repeat", "lcm CPU ms/turn", "raw CPU ms/turn", "CPU ratio", "lcm WAL KiB/turn", "raw WAL KiB/turn",
             "lcm rows/turn", "raw rows/turn", "lcm statements/turn", "lcm turn p50 ms", "ingest statements/turn",
             "ingest p50 ms (raw)", "ingest vs raw"],
            left=frozenset({"repeat"}),
            notes=[f"CPU: every process of the cluster, from /proc; a turn stores 4 messages, compacts when the 16k "
                   f"window fills and searches every 5th turn (raw: the same 4 rows in one transaction, a full-text "
                   f"query every 5th turn). Median lcm CPU {median:.2f} ms/turn (range "
                   f"{r['lcm_cpu_ms_per_turn']['min']:.2f}-{r['lcm_cpu_ms_per_turn']['max']:.2f}); "
                   f"CPU ratio median {r['cpu_ratio']['median']:.1f}x.",
                   f"ingest vs raw: per-turn ingest alone (on_turn_complete) as a share of the raw driver's turns/s: "
                   f"median {r['ingest_ratio']['median']:.0%}, range {r['ingest_ratio']['min']:.0%}-"
                   f"{r['ingest_ratio']['max']:.0%}.",
                   (f"capacity: one server core = 1,000 ms of CPU per second; an agent taking a turn every "
                    f"{r['agent_turn_every_s']} s costs {median:.2f} / {r['agent_turn_every_s']} = "
                    f"{median / r['agent_turn_every_s']:.3f} ms/s, so one core carries {per_core:,.0f} such agents "
                    "(server CPU only; disk and memory not counted)") if per_core else ""])
        for i, p in enumerate(r["passes"], 1):
            lcm, raw = p["lcm"], p["raw"]
            spec.rows.append([str(i), f(lcm["cpu_ms_per_turn"]), f(raw["cpu_ms_per_turn"]),
                              f(lcm["cpu_ms_per_turn"] / raw["cpu_ms_per_turn"], 1) + "x" if raw["cpu_ms_per_turn"]
                              else "-",
                              f(lcm["wal_bytes_per_turn"] / 1024, 1), f(raw["wal_bytes_per_turn"] / 1024, 1),
                              f(lcm["rows_per_turn"], 1), f(raw["rows_per_turn"], 1), f(lcm["statements_per_turn"], 1),
                              f(lcm["turn_ms"]["p50"]), f(p["ingest"]["lcm_statements_per_turn"], 1),
                              f"{f(p['ingest']['lcm_p50_ms'])} ({f(p['ingest']['raw_p50_ms'])})",
                              _pct(p["ingest"]["ratio"])])
        specs.append(spec)
        for label, top_of in (("agent turns", r["passes"][-1]["lcm"]["top_statements"]),
                              ("ingest alone", r["passes"][-1]["ingest"]["lcm_top_statements"])):
            top = TableSpec(f"the server's costliest lcm statements, {label} (last repeat, pg_stat_statements)",
                            ["calls", "total ms", "statement"], left=frozenset({"statement"}))
            for st in top_of:
                top.rows.append([str(st["calls"]), f(st["ms"], 1), st["query"]])
            specs.append(top)
    return specs


def pooler(results: list[dict[str, Any]]) -> list[TableSpec]:
    """PostgreSQL through PgBouncer: many agent connections on a small server pool."""
    specs = []
    for r in results:
        if "skipped" in r:
            specs.append(_skipped("many connections", r))
            continue
        spec = TableSpec(
            f"many connections through PgBouncer (transaction mode, pool {r['pool_size']}): {r['agents']} agents in "
            f"{r['processes']} processes, {r['turns_per_agent']} turns each",
            ["agents", "client conns (peak)", "server conns (peak)", "turns/s", "turn p50 ms", "p95", "p99",
             "search p95", "longest wait ms", "errors", "lost", "stored twice"],
            left=frozenset({"agents"}),
            notes=["client conns: what PgBouncer held at once (SHOW POOLS, cl_active + cl_waiting); server conns: "
                   "what it opened to PostgreSQL; lost / stored twice: the server's rows against what the agents sent"])
        spec.rows.append([str(r["agents"]), str(r["peak_client_connections"]), str(r["peak_server_connections"]),
                          f(r["turns_per_s"], 1), f(r["turn_ms"]["p50"], 1), f(r["turn_ms"]["p95"], 1),
                          f(r["turn_p99_ms"], 1), f(r["search_ms"]["p95"], 1) if r["search_ms"] else "-",
                          f(r["max_client_wait_ms"], 1), str(r["errors"]), str(r["lost"]), str(r["stored_twice"])])
        specs.append(spec)
    return specs


def scale(results: list[dict[str, Any]]) -> list[TableSpec]:
    """Per backend: the ten-million-message store: how it was filled, its size, search per
    query class, turns, start-up, the doctor and status, the explorer's pages, forget."""
    specs = []
    for r in results:
        b, d = r["backend"], r["disk"]
        load, copy = r["load"], r.get("copy")
        how = (f"{d['messages']:,} messages in {r['sessions']:,} sessions of {r['agents']:,} agents; "
               f"{load['stored_this_run']:,} stored through lcm this run at {f(load.get('messages_per_s'), 0)}/s "
               f"({load['workers']} processes)")
        if copy:
            how += (f"; {copy['agents_copied']:,} agents copied from {copy['templates']} loaded ones in "
                    f"{f(copy['copy_seconds'], 0)} s, search index built in {f(copy['index_build_seconds'], 0)} s")
        size = TableSpec(f"scale, {b}: the store", ["what", "value"], left=frozenset({"what"}), notes=[how])
        size.rows += [["bytes on disk", f"{d['store_bytes'] / 2**30:,.2f} GiB"],
                      ["bytes per message", f(d["bytes_per_message"], 0)],
                      ["text per message (content + tool calls)", f(d["text_bytes_per_message"], 0)],
                      ["on disk / text", f"{f(d['ratio_to_text'], 2)}x"]]
        for table, parts in (d.get("tables") or {}).items():
            if sum(parts.values()) < 64 * 2**20:
                continue  # the small tables (sessions, summaries of the few compacted sessions)
            size.rows.append([f"  {table}: heap / TOAST / indexes MiB",
                              " / ".join(f"{parts[k] / 2**20:,.0f}" for k in ("heap", "toast", "indexes"))])
        specs.append(size)
        worst = max(x["lcm"]["p95"] for k in ("grep_small_agents", "grep_big_agent") for x in r.get(k, []))
        grep = TableSpec(f"scale, {b}: lcm_grep through the agent tool (ms)",
                         ["agent", "class", "scope", "sort", "runs", "p50", "p95", "hits"],
                         left=frozenset({"agent", "class", "scope", "sort"}),
                         notes=[f"needle recall {r['needle_recall']['found']}/{r['needle_recall']['total']} "
                                "(needles drawn across the store, each looked for agent-wide by its own agent); "
                                f"worst p95 {f(worst, 1)} ms "
                                "(goal: p95 <= 50 ms per class)"])
        for key, who in (("grep_small_agents", "10k-message agents"), ("grep_big_agent", "1M-message agent")):
            for x in r.get(key, []):
                grep.rows.append([who, x["class"], x["scope"], x["sort"], str(x["runs"]), f(x["lcm"]["p50"]),
                                  f(x["lcm"]["p95"]), f(x["hits"], 1)])
        specs.append(grep)
        turns = TableSpec(f"scale, {b}: turns under a 128k window (ms)",
                          ["session", "stored before", "ingest p50 / p95", "compress p50 / p95", "whole turn p50 / p95",
                           "compacting turns"], left=frozenset({"session"}),
                          notes=["goal: a turn <= 5 ms p50; the resumed session was compacted first (extractive), "
                                 "as a live one of its size is"])
        for t in r["turns"]:
            o = t["ops"]
            turns.rows.append([t["label"], f"{t['stored_before']:,}",
                               f"{f(o['ingest one turn']['p50'])} / {f(o['ingest one turn']['p95'])}",
                               f"{f(o['compress']['p50'])} / {f(o['compress']['p95'])}",
                               f"{f(o['whole turn']['p50'])} / {f(o['whole turn']['p95'])}",
                               f"{t['compacted_turns']} of {t['turns']}"])
        specs.append(turns)
        ops = TableSpec(f"scale, {b}: start-up, doctor, status, explorer, forget", ["what", "time"],
                        left=frozenset({"what"}),
                        notes=["start-up: a new process imports lcm, opens the store and serves the first turn "
                               "of a resumed session (goal <= 1 s); doctor/status: whole `lcm` processes"])
        starts = sorted(x["total_s"] for x in r["startup"])
        ops.rows.append(["start-up to first turn, median (min-max) s",
                         f"{f(starts[len(starts) // 2])} ({f(starts[0])}-{f(starts[-1])})"])
        ops.rows.append(["  of which: import / open / first turn s (median run)", " / ".join(
            f(sorted(x[k] for x in r["startup"])[len(starts) // 2]) for k in ("import_s", "open_s", "first_turn_s"))])
        ops.rows.append([f"lcm doctor ({r['doctor']['overall']}) s", f(r["doctor"]["seconds"])])
        if "doctor_after_scoping_s" in r:
            ops.rows.append(["lcm doctor, its index counts bounded too (warm) s", f(r["doctor_after_scoping_s"])])
        ops.rows.append(["lcm status s", f(r["status_seconds"])])
        for page, t in r["explorer_pages_ms"].items():
            ops.rows.append([f"explorer: {page}, p50 / p95 ms", f"{f(t['p50'], 1)} / {f(t['p95'], 1)}"])
        for fg in r.get("forget", []):
            line = (f"forget {fg['agent']} ({fg['messages']:,} messages) s", f(fg["forget_seconds"]))
            ops.rows.append(list(line))
            if "dead_tuples" in fg:
                ops.rows.append([f"  left behind: dead tuples / after VACUUM ({f(fg.get('vacuum_seconds'), 1)} s)",
                                 f"{fg['dead_tuples']:,} / {fg.get('after_vacuum', {}).get('dead_tuples', 0):,}"])
            if "free_bytes" in fg:
                ops.rows.append(["  left behind: free pages in the file (reused by later writes)",
                                 f"{fg['free_bytes'] / 2**20:,.0f} MiB"])
        specs.append(ops)
    return specs


def proxy(results: list[dict[str, Any]]) -> list[TableSpec]:
    latency = TableSpec("lcm proxy: latency (ms, p50 / p95) against the upstream direct, same run",
                        ["backend", "stored", "target", "request", "first streamed chunk",
                         "added p50 (request / chunk)"],
                        left=["target"], notes=["goal: <= 5 ms p50 added at 100k stored messages (a request that "
                                                "compacts nothing); auto-recall searches every request"])
    throughput = TableSpec("lcm proxy: throughput on PostgreSQL (requests/s, every client its own conversation)",
                           ["clients", "direct", "proxy", "proxy / direct", "errors (direct / proxy)"])
    for r in results:
        for size in r["sizes"]:
            for target, t in size["latency"].items():
                added = size["added_p50_ms"].get(target)
                latency.rows.append([r["backend"], f"{size['stored']:,}", target,
                                     f"{f(t['request']['p50'])} / {f(t['request']['p95'])}",
                                     f"{f(t['first_chunk']['p50'])} / {f(t['first_chunk']['p95'])}",
                                     f"{f(added['request'])} / {f(added['first_chunk'])}" if added else "-"])
        for t in r["throughput"]:
            direct, ours = t["direct"]["requests_per_s"], t["proxy"]["requests_per_s"]
            throughput.rows.append([str(t["clients"]), f(direct, 0), f(ours, 0), f(ours / direct if direct else 0),
                                    f"{t['direct']['errors']} / {t['proxy']['errors']}"])
            for name in ("direct", "proxy"):
                for error in t[name].get("first_errors", [])[:1]:
                    throughput.notes.append(f"{t['clients']} clients, {name}: {error}")
    return [latency] + ([throughput] if throughput.rows else [])


BUILDERS: dict[str, Callable[[list[dict[str, Any]]], list[TableSpec]]] = {
    "ingest": ingest, "search": search, "turn_overhead": turn_overhead, "compaction": compaction, "startup": startup,
    "cache": cache, "recall": recall, "fleet": fleet, "ui": ui, "cli": cli, "locomo": locomo,
    "locomo_prompt": locomo_prompt, "server_cost": server_cost, "pooler": pooler, "scale": scale, "proxy": proxy}


def markdown(spec: TableSpec) -> str:
    """A GitHub Markdown table with the title above and the notes below."""
    align = ["---" if c in spec.left else "---:" for c in spec.columns]
    lines = [f"**{spec.title}**", "", "| " + " | ".join(spec.columns) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in spec.rows]
    lines += [""] + [f"_{note}_" for note in spec.notes]
    return "\n".join(lines).rstrip() + "\n"
