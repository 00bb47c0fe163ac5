"""The benchmarks at their smallest size, so they never rot: every phase runs on the backends
available and reports sane results (recall, counts). No timing is asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def test_every_benchmark_runs_at_smoke_size(tmp_path):
    backend = "both" if os.environ.get("LCM_TEST_POSTGRES_URL") else "sqlite"
    if backend == "sqlite" and os.environ.get("LCM_REQUIRE_HERMES"):  # CI: PostgreSQL is always there
        pytest.fail("LCM_TEST_POSTGRES_URL is not set in CI")
    out = tmp_path / "results.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--smoke", "--backend", backend, "--json", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    for title in ("ingest", "lcm_grep against the raw FTS query", "per-turn overhead", "compaction", "start-up",
                  "prompt-cache cost", "recall of questions asked in plain words", "lcm proxy: latency"):
        assert title in done.stdout, title
    results = json.loads(out.read_text())["results"]
    backends = {"sqlite", "postgresql"} if backend == "both" else {"sqlite"}
    for phase in ("ingest", "search", "turn_overhead", "compaction", "startup", "cache", "recall", "fleet", "ui"):
        assert {r["backend"] for r in results[phase]} == backends, phase
        assert all(r["peak_rss_mb"] > 0 for r in results[phase])
    for r in results["fleet"]:  # every agent process ran turns and searches, without an error
        assert [row["agents"] for row in r["rows"]] == [1, 2]
        assert all(row["turns"] > 0 and row["errors"] == 0 and row["search_p95_ms"] for row in r["rows"])
        assert all(row["raw_commits_per_s"] > 0 for row in r["rows"])
    plot = subprocess.run([sys.executable, "-m", "benchmarks.plot", str(out), str(tmp_path / "fleet.png")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0 and (tmp_path / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", plot.stderr
    for r in results["search"]:
        assert r["recall"]["found"] == r["recall"]["total"] > 0  # every needle found
    for r in results["ingest"]:
        assert r["per_turn"]["lcm_turns_per_s"] > 0 and r["bulk"]["raw_msgs_per_s"] > 0
        # the gap taken apart: each pass ran on its own database and stored every turn
        assert all(r["per_turn"][k] > 0 for k in ("no_tokenizer_turns_per_s", "no_index_upkeep_turns_per_s",
                                                   "own_path_turns_per_s"))
    assert "where the per-turn gap to the raw driver goes" in done.stdout
    for r in results["compaction"]:
        assert r["compacted"] > 0.9 * r["messages"] and r["depths"].get("d0")
    if os.environ.get("LCM_LOCOMO_DIR"):  # real conversations (.ci/run sets it when the data is there)
        for r in results["locomo"]:  # one conversation at smoke size
            assert r["questions"] > 50 and {row["mode"] for row in r["rows"]} >= {"full_text", "bm25s"}
            full_text = next(row for row in r["rows"] if row["mode"] == "full_text")
            assert full_text["classes"]["all"]["recall@10"] > 0.5
        for r in results["locomo_prompt"]:  # auto-recall puts evidence in front of the model
            everything = r["classes"]["all"]
            assert everything["questions"] > 50 and everything["lcm_recall"] > everything["lcm"]
            assert 0 < r["block_tokens_per_turn"] <= 300
        assert "Evidence in the prompt" in done.stdout
    else:
        assert "locomo skipped: LCM_LOCOMO_DIR is not set" in done.stdout
    for r in results["startup"]:
        assert r["messages"] > 0 and r["first_turn_s"] > 0
    for r in results["server_cost"] + results["pooler"]:  # PostgreSQL questions: SQLite says it skipped
        assert (r["backend"] == "sqlite") == ("skipped" in r), r
    for r in (r for r in results["server_cost"] if "skipped" not in r):  # the server's own counters moved
        for p in r["passes"]:
            assert p["lcm"]["cpu_ms_per_turn"] > 0
            assert p["lcm"]["wal_bytes_per_turn"] > p["raw"]["wal_bytes_per_turn"] > 0
            assert p["lcm"]["rows_per_turn"] >= 4 and p["lcm"]["statements_per_turn"] >= 1
            assert p["ingest"]["lcm_turns_per_s"] > 0 and p["ingest"]["raw_turns_per_s"] > 0
    for r in (r for r in results["pooler"] if "skipped" not in r):  # every agent connected; nothing lost
        assert r["agents_reporting"] == r["agents"] and r["peak_client_connections"] >= r["agents"]
        assert r["errors"] == 0 and r["lost"] == 0 and r["stored_twice"] == 0
        assert r["messages_stored"] == r["messages_sent"] == 4 * r["agents"] * r["turns_per_agent"]
    for r in results["scale"]:  # the ten-million-message store at its smallest: loaded, copied, measured
        assert r["load"]["messages_total"] == 3 * 400 + 2_000 and r["copy"]["agents_copied"] == 3
        assert r["disk"]["messages"] == 6 * 400 + 2_000 and r["disk"]["bytes_per_message"] > 0
        assert r["needle_recall"]["found"] == r["needle_recall"]["total"] == 5  # copies' needles too
        assert {x["class"] for x in r["grep_small_agents"] + r["grep_big_agent"]} == {
            "needle", "rare word", "two mid words", "most common"}
        assert [t["stored_before"] > 0 for t in r["turns"]] == [True, False, False]
        assert r["startup"] and r["doctor"]["overall"] in ("healthy", "warnings")
        small, big = r["forget"]  # every message of the agent, the turns measured on it included
        assert small["messages"] >= 400 and big["agent"] == "agent-big" and big["messages"] >= 2_000
    for r in results["proxy"]:  # lcm proxy against the upstream direct: every target answered
        for size in r["sizes"]:
            # the [semantic] row: the dev install has the local model, and the smoke size is small
            assert set(size["latency"]) == {"direct", "proxy", "proxy, no auto-recall", "proxy, [semantic]",
                                            "proxy, no auto-recall, moving cache marks"}
            assert all(t["request"]["p50"] > 0 and t["first_chunk"]["p50"] > 0 for t in size["latency"].values())
        assert [t["clients"] for t in r["throughput"]] == ([1, 2] if r["backend"] == "postgresql" else [])
        assert all(t["proxy"]["requests_per_s"] > 0 and t["proxy"]["errors"] == 0 for t in r["throughput"])
    for r in results["cache"]:  # lcm and Hermes' compressor on one transcript, with and without idle gaps
        assert [(row["window"], row["idle"]) for row in r["rows"]] == [(64_000, False), (64_000, True)]
        for row in r["rows"]:
            lcm, hermes = row["lcm"], row["hermes"]
            assert lcm["stored_exactly"] and lcm["recoverable_share"] == 1.0
            assert lcm["bursts"] >= 1 and hermes["bursts"] >= 1  # both engines compacted
            assert lcm["largest_prompt_share"] < 1.0 and hermes["largest_prompt_share"] < 1.0
            assert 0 < lcm["repeated_share"] < 1 and row["cost_ratio"] > 0
            assert lcm["reported_cache_read_share"] > 0  # lcm read the cache counters of the usage
    for r in results["recall"]:  # questions in plain words: lcm_grep finds answers all-words search cannot
        modes = {row["mode"]: row["classes"]["all"] for row in r["rows"]}
        # A sample of the corpus's questions at this size, every kind of question in it.
        assert r["questions"] == 100 and set(modes) == {"full_text", "semantic", "hybrid", "all_words", "bm25s"}
        assert all({"named", "paraphrase", "temporal"} < set(row["classes"]) for row in r["rows"])
        assert modes["full_text"]["recall@10"] > modes["all_words"]["recall@10"]
        assert modes["full_text"]["recall@10"] > 0.5 * modes["bm25s"]["recall@10"] > 0
        # Meaning finds what the words cannot (the paraphrased questions); fusion keeps most of it.
        assert modes["semantic"]["recall@10"] > modes["full_text"]["recall@10"]
        assert modes["hybrid"]["recall@10"] > modes["full_text"]["recall@10"]

    # The same results as Markdown (how docs/benchmarks.md gets its tables).
    report = subprocess.run([sys.executable, "-m", "benchmarks.report", str(out)], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-3000:]
    for title in ("ingest", "lcm_grep against the raw FTS query", "per-turn overhead", "compaction", "start-up",
                  "prompt-cache cost", "recall of questions asked in plain words", "lcm proxy: latency"):
        assert f"**{title}" in report.stdout, title
    rows = [line for line in report.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert sum(line.startswith(f"| {b} |") for line in rows for b in backends) >= 4 * len(backends)

    # Before/after comparison of every phase (here a run against itself).
    compared = subprocess.run([sys.executable, "-m", "benchmarks.report", "--compare", str(out), str(out)],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert compared.returncode == 0, compared.stderr[-3000:]
    assert compared.stdout.count("**lcm_grep before and after") == len(backends)
    for title in ("ingest, before and after", "whole turn", "compaction and start-up"):
        assert f"**{title}" in compared.stdout, title
    rows = [line for line in compared.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert sum(line.startswith(f"| {b} | start-up in process") for line in rows for b in backends) == len(backends)
    assert sum(line.startswith("| needle |") for line in compared.stdout.splitlines()) == 4 * len(backends)
    for r in results["ingest"]:
        assert r["per_turn"]["no_tokenizer_turns_per_s"] > 0
