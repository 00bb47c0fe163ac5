"""``lcm forget``: erase messages for good, and every summary and vector derived from them
(``lcm.store.forget``), then summarize what remains again."""

from __future__ import annotations

import click

from lcm.cli.common import agent_option, emit_json, json_option, say, stderr, url_option
from lcm.cli.stores import context_on, open_store
from lcm.cli.times import TIME, TIME_HELP
from lcm.errors import ConfigError
from lcm.store.forget import ForgetPlan, ForgetSelector

DEFAULT_CONTEXT = 128_000
#: Forced compaction rounds per session when summarizing again, at most.
MAX_REBUILD_ROUNDS = 1000


@click.command("forget")
@url_option
@agent_option
@json_option
@click.option("--session", "sessions", multiple=True, metavar="ID", help="Only this session (repeatable).")
@click.option("--since", "time_from", type=TIME, help="Only messages at or after this time: " + TIME_HELP)
@click.option("--until", "time_to", type=TIME, help="Only messages at or before this time (same forms).")
@click.option("--match", metavar="TEXT",
              help="Only messages (and summaries, system prompts) containing this text, any case.")
@click.option("--regex", metavar="RE",
              help="Only messages (and summaries, system prompts) matching this Python regular expression.")
@click.option("--all-of-agent", "everything", is_flag=True, help="Everything the agent stored.")
@click.option("--dry-run", is_flag=True, help="Only show what would be erased.")
@click.option("--yes", is_flag=True, help="Erase without asking.")
@click.option("--vacuum", is_flag=True,
              help="Then rewrite the database (SQLite VACUUM; PostgreSQL VACUUM FULL, which locks each table) so no "
                   "free page keeps a copy.")
@click.option("--context-length", type=click.IntRange(1_000), default=DEFAULT_CONTEXT, show_default=True,
              help="The model window to summarize what remains for.")
def forget_command(url: str | None, agent: str, as_json: bool, sessions: tuple[str, ...], time_from: float | None,
                   time_to: float | None, match: str | None, regex: str | None, everything: bool, dry_run: bool,
                   yes: bool, vacuum: bool, context_length: int) -> None:
    """Erase messages for good: from the messages, the search index, the vectors and every
    summary that covers them (summaries are then rebuilt from what remains). Shows what would
    go first; every condition given must hold."""
    selector = ForgetSelector(
        agent=agent, session_keys=sessions, everything=everything, match=match, regex=regex,
        time_from=time_from, time_to=time_to)
    store = open_store(url)
    plan = store.forget.plan(selector)
    if dry_run or not plan.sessions:
        _show_plan(plan, as_json=as_json, dry_run=True)
        return
    if not yes:
        if as_json or not stderr.is_terminal:
            _show_plan(plan, as_json=as_json, dry_run=True)
            raise ConfigError("nothing erased: pass --yes to erase what is listed (or --dry-run to only list it)")
        _show_plan(plan, as_json=False, dry_run=True)
        click.confirm("erase all of this for good?", abort=True)
    goals = {item.session_key: item.covered_before - sum(1 for q in item.message_seqs if q <= item.covered_before)
             for item in plan.sessions}
    touched = set(store.forget.apply(plan, vacuum=vacuum))
    rebuilt: dict[str, int] = {}
    context = context_on(store, agent, context_length=context_length)
    for item in plan.sessions:
        if item.session_pk not in touched:
            continue
        session = context.attach(item.session_key)
        made = 0
        for _ in range(MAX_REBUILD_ROUNDS):  # summarize again up to where the summaries reached
            if session.covered_seq >= goals[item.session_key]:
                break
            outcome = context.compact_stored(force=True)
            if not outcome.get("passes"):
                break
            made += int(outcome.get("leaves", 0)) + int(outcome.get("condensed", 0))
            session = context.store.sessions.get(session.id)
        rebuilt[item.session_key] = made
    if as_json:
        emit_json({**plan.as_dict(), "erased": True, "vacuumed": vacuum, "summaries_rebuilt": rebuilt})
        return
    say(f"erased {plan.messages} messages, {plan.summaries} summaries and their vectors in "
        f"{len(plan.sessions)} session(s); summarized again: {sum(rebuilt.values())} summaries")
    if not vacuum:
        say("the freed space is zeroed on SQLite; lcm forget --vacuum (or VACUUM) also compacts the file")


def _show_plan(plan: ForgetPlan, *, as_json: bool, dry_run: bool) -> None:
    if as_json:
        emit_json({**plan.as_dict(), "erased": False, "dry_run": dry_run})
        return
    if not plan.sessions:
        say("nothing matches: nothing would be erased")
        return
    for item in plan.sessions:
        say(f"session {item.session_key}: {len(item.message_ids)} messages, {item.summaries} summaries "
            f"(from message {item.first_seq} on, rebuilt from what remains), "
            f"{len(item.system_prompts)} system prompt versions")
    say(f"would erase {plan.messages} messages and {plan.summaries} summaries in {len(plan.sessions)} session(s)")
