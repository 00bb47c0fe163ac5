"""``lcm migrate --to URL``: a whole store copied between SQLite and PostgreSQL (both ways),
verified, resumable after an interruption, incremental after the source grew, refusing a
foreign target unless merging, and refusing a conflicting session without writing anything.

The source is built by the engine as a host would drive it: compaction into a DAG (leaves and
condensed nodes), a large tool result (a compressed payload), a system prompt, a session
continued under a new key (an alias), summaries carried into a new session, lcm's generated
digests, and vectors. The proof of a lossless copy is ``lcm export`` of both sides, byte for
byte, plus the same answers from the recall tools.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from lcm.config import LcmConfig
from lcm.engine import LcmEngine
from lcm.store import Store
from lcm.store import sync as sync_module
from tests.conftest import SMALL_ENGINE
from tests.support.conversation import SYSTEM, host_step, turn

BIG = "".join(f"line {i}: ok\n" for i in range(8_000)) + " the deploy log ends with quokka-42"


def engine_on(url: str, **kw: Any) -> LcmEngine:
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, **{**SMALL_ENGINE, **kw}))
    engine.update_model("test-model", 3000)
    return engine


def build_source(url: str, agent: str = "default", turns: int = 30) -> LcmEngine:
    Store.open(url, upgrade=True)
    engine = engine_on(url, agent_id=agent, new_session_retain_depth=-1)
    engine.on_session_start("s1", platform="cli")
    transcript: list[dict[str, Any]] = [SYSTEM]
    big = [{"role": "user", "content": "show the deploy log"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_big", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
           {"role": "tool", "tool_call_id": "call_big", "content": BIG},
           {"role": "assistant", "content": "The log ends with quokka-42."}]
    for new in [big, *(turn(i) for i in range(turns))]:
        transcript = host_step(engine, transcript, new)
    assert engine.compression_count > 0
    # Hermes rotates the key at a compaction boundary: the same session, now also "s1b".
    engine.on_session_start("s1b", boundary_reason="compression", old_session_id="s1")
    engine.on_session_reset()
    engine.on_session_start("s2", platform="telegram")
    host_step(engine, [SYSTEM], turn(99))
    store = engine.store
    for kind in ("message", "summary"):  # vectors, as an embedder would have left them
        items = store.vectors.pending("test:m", kind=kind, limit=5000)
        store.vectors.put("test:m", items, np.eye(len(items), 16, dtype=np.float32))
    return engine


def export(lcm, url: str, agent: str = "default") -> str:
    code, out, err = lcm("export", "--url", url, "--agent", agent)
    assert code == 0, err
    return out


def table_counts(url: str) -> dict[str, int]:
    store = Store.open(url)
    with store.engine.connect() as conn:
        return {t: conn.execute(text(f"SELECT count(*) FROM {t}")).scalar() for t in (
            "lcm_agents", "lcm_sessions", "lcm_session_aliases", "lcm_messages", "lcm_summaries",
            "lcm_summary_sources", "lcm_carried_summaries", "lcm_system_prompts", "lcm_generated",
            "lcm_vectors", "lcm_payloads")}


def covered_sessions(url: str) -> set[tuple[str, str | None, int | None]]:
    """(digest, session key, seq) of what each generated message stands in for."""
    store = Store.open(url)
    with store.engine.connect() as conn:
        return set(conn.execute(text(
            "SELECT g.digest, s.session_key, g.through_seq FROM lcm_generated g "
            "LEFT JOIN lcm_sessions s ON s.id = g.session_id")).all())


@pytest.fixture(params=["sqlite-to-postgresql", "postgresql-to-sqlite"])
def two_urls(request, sqlite_url, pg_url) -> tuple[str, str]:
    return (sqlite_url, pg_url) if request.param == "sqlite-to-postgresql" else (pg_url, sqlite_url)


def test_a_whole_store_moves_losslessly_and_verified(two_urls, lcm):
    source_url, target_url = two_urls
    source = build_source(source_url)
    code, out, err = lcm("migrate", "--url", source_url, "--to", target_url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["verified"] is True and report["mismatched_sessions"] == []
    assert all(c["source"] == c["target"] for c in report["counts"].values())
    counts = table_counts(target_url)
    assert counts == table_counts(source_url)
    assert counts["lcm_payloads"] >= 1
    assert counts["lcm_session_aliases"] == 1 and counts["lcm_system_prompts"] >= 1 and counts["lcm_vectors"] > 0
    assert report["counts"]["lcm_summary_sources"]["target"] > 0 and report["counts"]["lcm_generated"]["target"] > 0
    # Lossless: the export of both sides is the same, byte for byte.
    assert export(lcm, target_url) == export(lcm, source_url)
    # And the agent sees the same history through its tools on the new database.
    target = engine_on(target_url)
    target.on_session_start("s1b")  # the alias came along
    for engine in (source, target):
        engine.on_session_start("s1b")
    calls = [("lcm_grep", {"query": "quokka", "session_scope": "all"}), ("lcm_describe", {}),
             ("lcm_status", {})]
    for name, args in calls:
        mine = json.loads(source.handle_tool_call(name, args))
        theirs = json.loads(target.handle_tool_call(name, args))
        if name == "lcm_status":
            keep = ("stored_messages", "nodes_by_depth", "raw_messages", "raw_tokens", "session_ids", "system_prompt")
            mine, theirs = ({k: d[k] for k in keep} for d in (mine, theirs))
        else:  # ids differ between databases; everything else is the same
            mine, theirs = (json.loads(json.dumps(d).replace('"store_id"', '"id"')) for d in (mine, theirs))
            for d in (mine, theirs):
                for hit in d.get("results", []):
                    hit.pop("id", None)
                    hit.pop("node_id", None)
                for depth in d.get("depths", {}).values():
                    for node in depth["nodes"]:
                        node.pop("node_id")
                        node.pop("condensed_into")
        assert mine == theirs, name
    big = json.loads(target.handle_tool_call("lcm_grep", {"query": "quokka", "session_scope": "all",
                                                          "role": "tool"}))["results"][0]
    whole = json.loads(target.handle_tool_call("lcm_expand", {"store_id": big["store_id"],
                                                              "content_offset": len(BIG) - 10}))
    assert whole["item"]["message"]["content"] == BIG[-10:]
    # What lcm's summaries stand in for names the same session and message on both sides.
    assert covered_sessions(target_url) == covered_sessions(source_url)
    assert any(key for _, key, _ in covered_sessions(target_url))
    # Vectors came along (their model and their items).
    store = Store.open(target_url)
    assert store.vectors.coverage("test:m").pending == 0
    doctor = {c.name: c.status for c in store.health.checks(deep=True)}
    assert "fail" not in doctor.values(), doctor


def test_an_interrupted_migration_resumes_and_a_grown_source_copies_only_what_is_new(sqlite_url, pg_url, lcm,
                                                                                    monkeypatch):
    source = build_source(sqlite_url)
    real = sync_module.StoreSync._copy_session
    copied: list[str] = []

    def crash_on_second(self, src, plan, report, progress):
        if copied:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the run
        copied.append(plan.key)
        real(self, src, plan, report, progress)

    monkeypatch.setattr(sync_module.StoreSync, "_copy_session", crash_on_second)
    code, _, err = lcm("migrate", "--url", sqlite_url, "--to", pg_url)
    assert code == 130 and "run the same command again" in err
    assert table_counts(pg_url)["lcm_sessions"] == 1  # the first session, whole
    monkeypatch.setattr(sync_module.StoreSync, "_copy_session", real)
    code, out, err = lcm("migrate", "--url", sqlite_url, "--to", pg_url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["verified"] and report["sessions_copied"] == report["sessions"] - 1
    assert table_counts(pg_url) == table_counts(sqlite_url)

    # The source keeps working: more turns, another compaction; the next run copies only those.
    source.on_session_start("s1b")
    transcript: list[dict[str, Any]] = [SYSTEM]
    for i in range(200, 212):
        transcript = host_step(source, transcript, turn(i))
    code, out, err = lcm("migrate", "--url", sqlite_url, "--to", pg_url, "--json")
    assert code == 0, err
    again = json.loads(out)
    assert again["verified"] and 0 < again["messages_copied"] <= 12 * 4 and again["sessions_copied"] == 1
    assert export(lcm, pg_url) == export(lcm, sqlite_url)
    code, out, _ = lcm("migrate", "--url", sqlite_url, "--to", pg_url, "--json")
    assert json.loads(out)["messages_copied"] == 0 and json.loads(out)["verified"]  # nothing left to do


def test_a_foreign_target_is_refused_unless_merging_and_a_conflict_writes_nothing(sqlite_url, pg_url, lcm,
                                                                                tmp_path):
    build_source(sqlite_url, agent="alice")
    other = f"sqlite:///{tmp_path / 'other.db'}"
    build_source(other, agent="bob", turns=6)
    code, out, err = lcm("migrate", "--url", other, "--to", pg_url)
    assert code == 0, err
    before = table_counts(pg_url)
    code, _, err = lcm("migrate", "--url", sqlite_url, "--to", pg_url, "--dry-run")
    assert code == 1 and "--merge" in err and "bob/s1" in err
    assert table_counts(pg_url) == before
    code, out, err = lcm("migrate", "--url", sqlite_url, "--to", pg_url, "--merge", "--json")
    assert code == 0, err
    merged = json.loads(out)
    assert merged["verified"] and merged["counts"]["lcm_sessions"] == {"source": 2, "target": 2}
    assert table_counts(pg_url)["lcm_sessions"] == before["lcm_sessions"] + 2
    assert export(lcm, pg_url, "alice") == export(lcm, sqlite_url, "alice")
    assert export(lcm, pg_url, "bob") == export(lcm, other, "bob")

    # Another conversation under an existing agent and key: refused, and nothing written.
    clash = f"sqlite:///{tmp_path / 'clash.db'}"
    Store.open(clash, upgrade=True)
    engine = engine_on(clash, agent_id="bob")
    engine.on_session_start("s2")
    host_step(engine, [SYSTEM], [{"role": "user", "content": "a different first message"}])
    settled = table_counts(pg_url)
    code, _, err = lcm("migrate", "--url", clash, "--to", pg_url, "--merge")
    assert code == 1 and "bob/s2" in err and "nothing was copied" in err
    assert "lcm export --agent A --session KEY" in err and "lcm forget" in err  # advice with commands that exist
    assert table_counts(pg_url) == settled


def test_dry_run_says_what_would_move_and_touches_nothing(sqlite_url, pg_url, lcm):
    build_source(sqlite_url)
    code, out, err = lcm("migrate", "--url", sqlite_url, "--to", pg_url, "--dry-run", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["dry_run"] and plan["messages_copied"] == table_counts(sqlite_url)["lcm_messages"]
    assert table_counts(pg_url)["lcm_messages"] == 0
    code, out, _ = lcm("migrate", "--url", sqlite_url, "--to", sqlite_url)
    assert code == 1
    code, out, err = lcm("migrate", "--url", sqlite_url, "--to", pg_url)
    assert code == 0 and "verified: every table's count and each session's content digest match" in out
