"""The demo transcript: a long, multi-session agent conversation written for ``lcm demo``.

An on-call engineer and a coding agent chase a ledger-drift bug in a service called ``ledgerd``
over three sessions (a terminal, a phone chat, a postmortem). It has what real agent transcripts
have — tool calls and long tool results (logs, code, test runs, diffs), short chat turns, long
explanations — and a few distinctive facts in the first turns that the demo later finds and
expands byte-exactly after they have been compacted away.

The shipped file (``transcript.jsonl`` next to this module) is this generator's output; a test
checks they agree. Regenerate with ``python -m lcm.demo.generate > lcm/demo/transcript.jsonl``.
Deterministic: a fixed seed, no clock.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator
from typing import Any

SEED = 20260302
DAY = 86_400
START = 1_772_442_000  # 2026-03-02T09:00:00Z

#: The facts the demo looks for (each stated once, early in the first session).
BRIDGE_CODE = "7719-0424"
FACT_MESSAGE = (
    "Before we start: I'm on call for ledgerd this week. For the record, the incident bridge "
    f"code is {BRIDGE_CODE}, staging Postgres is pg-staging-3.internal:6432 (read-only role "
    "ledger_ro), and if we need to escalate, the ledger owner is Dana Okafor.")
DRIFT_LINE = "ERR_LEDGER_DRIFT account=88-4410 delta=-0.03 EUR batch=20260301-2"
DEMO_QUERY = "incident bridge code"

MODULES = ["reconcile/drift.py", "reconcile/batch.py", "reconcile/rounding.py", "ledger/accounts.py",
           "ledger/postings.py", "ledger/currency.py", "api/handlers.py", "api/schemas.py",
           "jobs/nightly.py", "jobs/scheduler.py", "storage/pg.py", "storage/migrations.py"]
FUNCS = ["apply_fx", "round_half_even", "sum_postings", "load_batch", "close_period", "post_entry",
         "check_drift", "normalize_amount", "fetch_rates", "settle_account", "split_fee", "replay_batch"]
NOUNS = ["posting", "batch", "account", "rate table", "fee split", "settlement", "ledger period",
         "currency pair", "rounding mode", "journal entry"]
VERBS = ["rounds", "aggregates", "caches", "re-reads", "validates", "serializes", "retries", "locks"]
ACCOUNTS = ["12-0087", "31-7702", "45-1190", "88-4410", "90-0031", "66-2048"]


class _Writer:
    def __init__(self, rng: random.Random, start: float):
        self.rng, self.t, self.calls = rng, start, 0
        self.session = ""
        self.platform = ""

    def _stamp(self, spread: tuple[int, int] = (8, 75)) -> float:
        self.t += self.rng.randint(*spread)
        return float(self.t)

    def line(self, message: dict[str, Any], spread: tuple[int, int] = (8, 75)) -> dict[str, Any]:
        return {"session_id": self.session, "platform": self.platform, "timestamp": self._stamp(spread),
                "message": message}

    def user(self, text: str) -> dict[str, Any]:
        return self.line({"role": "user", "content": text}, (40, 600))

    def say(self, text: str) -> dict[str, Any]:
        return self.line({"role": "assistant", "content": text})

    def call(self, tool: str, args: dict[str, Any], output: str, note: str | None = None) -> list[dict[str, Any]]:
        self.calls += 1
        call_id = f"call_{self.calls:04d}"
        return [self.line({"role": "assistant", "content": note, "tool_calls": [
                    {"id": call_id, "type": "function",
                     "function": {"name": tool, "arguments": json.dumps(args)}}]}),
                self.line({"role": "tool", "tool_call_id": call_id, "name": tool, "content": output}, (1, 30))]


# --------------------------------------------------------------------------- tool outputs


def _log(rng: random.Random, lines: int, planted: str | None = None) -> str:
    out = []
    at = rng.randint(0, lines - 1)
    for i in range(lines):
        ts = f"2026-03-01T02:{(i // 60) % 60:02d}:{i % 60:02d}Z"
        acct = rng.choice(ACCOUNTS)
        kind = rng.random()
        if planted and i == at:
            out.append(f"{ts} ledger-reconcile[4121]: {planted}")
        elif kind < 0.7:
            out.append(f"{ts} ledger-reconcile[4121]: INFO batch=20260301-{rng.randint(1, 4)} "
                       f"account={acct} postings={rng.randint(3, 400)} ok")
        elif kind < 0.9:
            out.append(f"{ts} ledger-reconcile[4121]: DEBUG fx {rng.choice(['EUR/USD', 'GBP/EUR', 'USD/JPY'])} "
                       f"rate={rng.uniform(0.5, 160):.6f} cached={rng.choice(['yes', 'no'])}")
        else:
            out.append(f"{ts} ledger-reconcile[4121]: WARN slow query {rng.randint(200, 4000)}ms "
                       f"on postings (account={acct})")
    return "\n".join(out)


def _code(rng: random.Random, module: str, funcs: int) -> str:
    lines = [f'"""{module}: {rng.choice(NOUNS)} handling for ledgerd."""', "",
             "from decimal import Decimal, ROUND_HALF_EVEN", "import logging", "",
             "log = logging.getLogger(__name__)", ""]
    for name in rng.sample(FUNCS, funcs):
        arg = rng.choice(["amount", "batch", "account", "rate", "postings"])
        lines += ["", f"def {name}({arg}, *, strict=False):",
                  f'    """{name.replace("_", " ").capitalize()}: {rng.choice(VERBS)} the {rng.choice(NOUNS)}."""']
        for _ in range(rng.randint(3, 9)):
            lines.append(rng.choice([
                f"    total = sum(p.amount for p in {arg})",
                f"    value = float({arg}) * {rng.uniform(0.8, 1.2):.4f}",
                f"    value = Decimal(str({arg})).quantize(Decimal('0.01'), ROUND_HALF_EVEN)",
                f"    if strict and not {arg}:",
                f"        raise ValueError('empty {rng.choice(NOUNS)}')",
                f"    log.debug('{name} %s', {arg})",
                f"    cache[{arg!r}] = value",
                "    return value",
            ]))
    return "\n".join(lines)


def _tests(rng: random.Random, module: str, fail: bool) -> str:
    names = [f"tests/{module.split('/')[0]}/test_{f}.py::test_{f}_{k}"
             for f in rng.sample(FUNCS, 4) for k in ("basic", "rounding", "empty", "large")]
    out = ["============================= test session starts ==============================",
           "platform linux -- Python 3.11.9, pytest-8.3.4", f"collected {len(names)} items", ""]
    failed = rng.sample(names, 2) if fail else []
    for n in names:
        out.append(f"{n} {'FAILED' if n in failed else 'PASSED'}")
    for n in failed:
        out += ["", f"___ {n.split('::')[1]} ___", f"    assert result == Decimal('{rng.randint(1, 999)}.{rng.randint(10, 99)}')",
                f"E   AssertionError: assert Decimal('{rng.randint(1, 999)}.{rng.randint(10, 99)}') == Decimal('...')"]
    out.append(f"=== {len(failed)} failed, {len(names) - len(failed)} passed in {rng.uniform(0.4, 9):.2f}s ===")
    return "\n".join(out)


def _grep(rng: random.Random, word: str) -> str:
    return "\n".join(f"{rng.choice(MODULES)}:{rng.randint(5, 400)}:    {rng.choice(FUNCS)}({word})"
                     for _ in range(rng.randint(3, 12)))


def _diff(rng: random.Random, module: str) -> str:
    func = rng.choice(FUNCS)
    return "\n".join([f"--- a/{module}", f"+++ b/{module}", f"@@ -{rng.randint(10, 90)},7 +{rng.randint(10, 90)},8 @@ def {func}(",
                      "-    value = float(amount) * rate",
                      "+    value = (Decimal(str(amount)) * Decimal(str(rate))).quantize(",
                      "+        Decimal('0.01'), ROUND_HALF_EVEN)",
                      "     return value"])


# --------------------------------------------------------------------------- turns


def _explain(rng: random.Random, sentences: int) -> str:
    parts = []
    for _ in range(sentences):
        parts.append(rng.choice([
            f"The {rng.choice(NOUNS)} code {rng.choice(VERBS)} the {rng.choice(NOUNS)} before {rng.choice(FUNCS)} runs.",
            f"{rng.choice(FUNCS)} still uses float arithmetic, which explains a drift of a few cents per {rng.choice(NOUNS)}.",
            f"I checked {rng.choice(MODULES)}; the {rng.choice(NOUNS)} path looks correct there.",
            f"Account {rng.choice(ACCOUNTS)} shows the same pattern, so this is not a one-off.",
            f"The fix is to keep amounts as Decimal end to end and round once, half-even, at {rng.choice(FUNCS)}.",
            f"Tests for {rng.choice(MODULES)} cover the {rng.choice(NOUNS)} case but not the {rng.choice(NOUNS)} one.",
        ]))
    return " ".join(parts)


def _work_turn(w: _Writer, rng: random.Random) -> list[dict[str, Any]]:
    module = rng.choice(MODULES)
    kind = rng.random()
    out: list[dict[str, Any]] = []
    if w.platform == "telegram":
        out.append(w.user(rng.choice([f"any news on {rng.choice(ACCOUNTS)}?", "ok, what's next",
                                      f"can you rerun the {module.split('/')[0]} tests", "👍 go ahead",
                                      f"is {rng.choice(FUNCS)} safe to deploy?", "status?"])))
    else:
        out.append(w.user(rng.choice([
            f"Can you look at {module} and tell me how it handles the {rng.choice(NOUNS)}?",
            f"Run the tests for {module.split('/')[0]} please.",
            f"Where else do we call {rng.choice(FUNCS)}?",
            f"Patch {module} to use Decimal in {rng.choice(FUNCS)}.",
            f"Why would the {rng.choice(NOUNS)} be off for account {rng.choice(ACCOUNTS)}?",
            f"Let's check the reconcile log again for batch 20260301-{rng.randint(1, 4)}.",
        ])))
    if kind < 0.25:
        out += w.call("read_file", {"path": module}, _code(rng, module, rng.randint(2, 5)))
    elif kind < 0.45:
        out += w.call("shell", {"cmd": f"pytest -q tests/{module.split('/')[0]}"}, _tests(rng, module, rng.random() < 0.4))
    elif kind < 0.6:
        word = rng.choice(FUNCS)
        out += w.call("shell", {"cmd": f"grep -rn {word} ."}, _grep(rng, word))
    elif kind < 0.75:
        diff = _diff(rng, module)
        out += w.call("apply_patch", {"patch": diff}, f"Applied patch to {module} (1 hunk).")
        out += w.call("shell", {"cmd": f"pytest -q tests/{module.split('/')[0]}"}, _tests(rng, module, False))
    elif kind < 0.85:
        out += w.call("shell", {"cmd": "journalctl -u ledger-reconcile --since -1d | tail -n 80"},
                      _log(rng, rng.randint(30, 80)))
    out.append(w.say(_explain(rng, rng.randint(1, 3) if w.platform == "telegram" else rng.randint(2, 7))))
    return out


def _day_one(w: _Writer, rng: random.Random, turns: int) -> Iterator[dict[str, Any]]:
    yield w.user(FACT_MESSAGE)
    yield w.say("Noted: bridge code, staging database and escalation contact. I'll keep them in mind "
                "and won't paste credentials into logs.")
    yield w.user("The nightly reconcile job failed again. Can you look at the logs?")
    yield from w.call("shell", {"cmd": "journalctl -u ledger-reconcile --since yesterday | tail -n 200"},
                      _log(rng, 200, planted=DRIFT_LINE))
    yield w.say("One error in last night's run: ERR_LEDGER_DRIFT on account 88-4410, 3 cents short in "
                "batch 20260301-2. Everything else reconciled. Drift of a few cents usually means "
                "float rounding somewhere on the FX path.")
    yield w.user("Find where the drift check lives.")
    yield from w.call("shell", {"cmd": "grep -rn LEDGER_DRIFT ."}, "reconcile/drift.py:41:    raise DriftError('ERR_LEDGER_DRIFT', account, delta)\n"
                      "docs/runbook.md:88:ERR_LEDGER_DRIFT: see reconcile/drift.py")
    yield from w.call("read_file", {"path": "reconcile/drift.py"}, _code(rng, "reconcile/drift.py", 4))
    yield w.say(_explain(rng, 5))
    for _ in range(turns):
        yield from _work_turn(w, rng)


def lines() -> list[dict[str, Any]]:
    """Every line of the demo transcript, in order."""
    rng = random.Random(SEED)
    w = _Writer(rng, START)
    out: list[dict[str, Any]] = []
    w.session, w.platform = "ledgerd-oncall-day1", "cli"
    out.extend(_day_one(w, rng, 46))
    w.session, w.platform, w.t = "ledgerd-oncall-day2", "telegram", START + DAY
    out.append(w.user("morning — deploy window moved to Thursday 14:00 UTC, FYI"))
    out.append(w.say("Thanks, noted: deploy window Thursday 14:00 UTC."))
    for _ in range(30):
        out.extend(_work_turn(w, rng))
    w.session, w.platform, w.t = "ledgerd-postmortem", "cli", START + 3 * DAY
    out.append(w.user("Let's write the postmortem for the ledger drift. Start with a timeline."))
    out.append(w.say(_explain(rng, 6)))
    for _ in range(38):
        out.extend(_work_turn(w, rng))
    return out


def main() -> None:
    for line in lines():
        sys.stdout.write(json.dumps(line, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
