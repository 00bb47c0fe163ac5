"""Recall: does ``lcm_grep`` find the message that answers a question asked in plain words?

A labelled, deterministic corpus built here (no test set is tuned to): one agent's
multi-session history of a software team's chat with its agent, where facts about services
(ports, owners, regions, versions, timeouts, schedules) are stated in one wording and later
asked about in another, among filler turns that use the same vocabulary (logs, deploys, the
same service names). Question classes:

* ``named``: the question names the service but says the rest in other words ("Which port did
  we move the billing-api staging database to?" for "billing-api's pre-prod DB now listens on
  6543");
* ``paraphrase``: a one-off fact asked with none of its rare words (synonyms only);
* ``temporal``: a value that was changed in a later session; only the newest statement counts.

Each question is sent as asked, through the agent tool (``lcm_grep``, ``session_scope="all"``,
``sort="relevance"``), and scored recall@5 / recall@10 (the evidence message among the hits)
with latency p50 / p95. Modes: ``full_text`` (every word, then any content word by BM25), the
same search with every word required (lcm before issue 15: ``all_words``), and a plain BM25
index (``bm25s``, English stop words) over the same messages in the same run, as the baseline.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import append_messages, summary_ms
from lcm.config import LcmConfig, local_model_installed
from lcm.context.embed import backfill
from lcm.engine import LcmEngine
from lcm.store import Store
from lcm.tools import run_tool
from lcm.vectors import numpy

AGENT = "recall-bench"
BATCH = 500
K = (5, 10)

SYLLABLES = ("bil", "ling", "or", "chid", "fal", "con", "led", "ger", "quar", "tz", "mar", "lin", "ves", "per",
             "cal", "dera", "no", "va", "pi", "xel", "ru", "bric", "tan", "go", "zep", "hyr", "ax", "ion")
KINDS = ("api", "worker", "gateway", "indexer", "scheduler", "proxy")

#: attribute -> (values, statement wordings, question wordings). {s}: the service, {v}: the value.
ATTRIBUTES: dict[str, tuple[list[str], list[str], list[str]]] = {
    "port": (
        [str(p) for p in range(5400, 9900, 37)],
        ["We moved the {s} staging database to port {v}.",
         "Heads up: {s}'s pre-prod DB now listens on {v} from today.",
         "Done, the test datastore behind {s} answers on port {v} now."],
        ["Which port did we move the {s} staging database to?",
         "what port is the pre-production database for {s} on",
         "where does the {s} test db listen these days?"]),
    "owner": (
        ["Priya", "Marcus", "Elena", "Tomasz", "Aiko", "Diego", "Fatima", "Jonas", "Wei", "Olu", "Sven", "Nadia"],
        ["{v} owns {s} from now on; page them for incidents.",
         "Ownership of {s} moved to {v}'s team this sprint.",
         "{v} is the on-call lead for {s}."],
        ["who is responsible for {s}?",
         "Who should I page when {s} breaks?",
         "which person maintains the {s} service"]),
    "region": (
        ["eu-west-1", "us-east-2", "ap-southeast-1", "eu-central-1", "us-west-2", "sa-east-1"],
        ["{s} was migrated to the {v} cluster last night.",
         "We run {s} out of {v} now, the old region is drained.",
         "Deployment target for {s} is {v} going forward."],
        ["which region is {s} hosted in?",
         "Where is {s} deployed geographically?",
         "what datacenter serves {s} traffic"]),
    "timeout": (
        [f"{n} seconds" for n in (5, 8, 12, 15, 20, 30, 45, 60, 90, 120)],
        ["Raised the {s} request timeout to {v} after the incident.",
         "The upstream deadline for calls into {s} is {v} now.",
         "{s} gives up on slow clients after {v}."],
        ["how long before {s} times out a request?",
         "What is the deadline configured for {s} calls?",
         "after how many seconds does {s} abort a slow call"]),
    "version": (
        [f"{a}.{b}.{c}" for a in (1, 2, 3) for b in (0, 4, 7) for c in (1, 3)],
        ["Rolled {s} forward to release {v}.",
         "{s} is pinned at version {v} until the freeze ends.",
         "Shipped {v} of {s} to production this morning."],
        ["what release of {s} is live?",
         "Which build of {s} are we running in prod?",
         "what version is {s} pinned to"]),
}
#: The attribute whose value changes in a later session (the temporal class).
CHANGING = "timeout"

#: One-off facts asked with none of their rare words: (statement, question).
PARAPHRASES = [
    ("The office wifi password was rotated to Heron-Basket-42.", "what is the new wireless key at work?"),
    ("Our AWS bill jumped 40% because of the forgotten GPU instances.", "why did cloud costs go up so much?"),
    ("The quarterly planning offsite is booked at the lakeside lodge in Annecy.",
     "where is the team retreat this quarter?"),
    ("Legal asked us to keep customer logs for 400 days, not 90.", "how long must we retain client logging data?"),
    ("The flaky integration suite fails because the mock clock drifts under load.",
     "why do the end-to-end tests break randomly?"),
    ("Marketing wants the launch email to go out Thursday at 9am Pacific.",
     "when should the product announcement newsletter be sent?"),
    ("The CEO prefers dark mode screenshots in every investor deck.",
     "what style of images does the chief executive like in slides?"),
    ("We picked Postgres over Mongo because we need transactions across tables.",
     "why did we choose a relational store instead of a document database?"),
    ("The intern cohort starts on the first Monday of June.", "when do the new trainees join?"),
    ("Security found that the admin panel leaked session tokens in URLs.",
     "what vulnerability did the auditors discover in the backoffice?"),
    ("The mobile app crashes on Android 12 when the camera permission is denied.",
     "why does the phone application die on some devices?"),
    ("Support tickets doubled after we removed the phone hotline.",
     "why did the helpdesk workload grow?"),
    ("The design system moved from Sketch to Figma in March.", "which tool do designers use for mockups now?"),
    ("Finance closes the books on the third business day of each month.",
     "when does accounting finish month-end?"),
    ("The CDN purge takes about eleven minutes to propagate worldwide.",
     "how long until cache invalidation reaches every edge location?"),
    ("Our largest customer, Northwind, renewed for three more years.", "did the biggest client extend their contract?"),
    ("The hackathon winner built a Slack bot that summarizes incidents.",
     "what did the team that won the coding competition make?"),
    ("We deprecated the v1 REST endpoints; clients must use GraphQL by October.",
     "when do integrators need to stop calling the old interface?"),
    ("The backup tapes are stored offsite in the Reno vault.", "where are the archival copies physically kept?"),
    ("The new hire laptop image ships with Ubuntu 24.04 and Docker preinstalled.",
     "what operating system do onboarding machines come with?"),
    ("The recommendation model was retrained on six months of clickstream data.",
     "how much history did we use to refit the suggestions algorithm?"),
    ("Customer churn in Q2 was 3.1 percent, down from 4.4.", "how many subscribers did we lose last quarter?"),
    ("The data warehouse nightly load now starts at 02:30 UTC.", "what time does the analytics import kick off?"),
    ("Two-factor login is mandatory for all staff from next week.", "will employees need MFA to sign in?"),
    ("The parking garage closes at 10pm on weekdays.", "until when can I leave my car in the building lot?"),
    ("We sunset the Windows desktop client; only macOS and web remain.",
     "which platforms does the native app still support?"),
    ("Latency in Sydney improved after we added a Melbourne edge node.",
     "why did response times in Australia get better?"),
    ("The on-call rotation switches every Tuesday at noon.", "when does the pager handoff happen?"),
    ("Search relevance dropped because the synonym file was truncated.",
     "why did lookup quality get worse?"),
    ("The GDPR deletion job purges inactive accounts after 24 months.",
     "how long do we keep dormant user profiles before erasing them?"),
]

FILLER = (
    "Checked the {s} logs: {n} warnings about the database connection pool, nothing critical.",
    "Restarted {s} after the deploy; health checks are green again.",
    "The {s} staging build failed on a lint error, fixed and re-run.",
    "Can you look at why {s} is slow in the test environment?",
    "Opened a ticket for the {s} port scan alert, looks like a false positive.",
    "Running the migration for {s} now, {n} tables to go.",
    "The {s} dashboard shows p95 latency of {n} ms in production.",
    "Who reviewed the last {s} pull request? It touched the timeout handling.",
    "I updated the {s} runbook with the new release steps.",
    "Traffic to {s} peaked at {n} requests per second during the sale.",
    "The cron job for {s} ran twice last night, investigating the schedule.",
    "Cache hit rate for {s} dropped to {n} percent after the config change.",
    "Please bump the {s} dependencies, there is a security advisory.",
    "Tool output: {s} pod {n} restarted with exit code 137 (out of memory).",
    "The {s} team wants a new database index on the orders table.",
)


def _service_names(rng: random.Random, count: int) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        names.add(rng.choice(SYLLABLES) + rng.choice(SYLLABLES) + "-" + rng.choice(KINDS))
    return sorted(names)


@dataclass
class Question:
    text: str
    kind: str  # named | paraphrase | temporal
    evidence: int = 0  # index of the evidence message in the corpus (later: its store id)


@dataclass
class Corpus:
    sessions: list[list[dict[str, Any]]] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)


def build(messages: int, seed: int = 15) -> Corpus:
    """About ``messages`` messages in sessions of ~100, facts spread over the first sessions'
    and the whole history, each question labelled with its evidence message."""
    rng = random.Random(seed)
    services = _service_names(rng, 60)
    facts: list[tuple[str, str, str]] = []  # (statement, question, kind)
    for s in services:
        for attribute in ("port", "owner", "region", "version"):
            values, says, asks = ATTRIBUTES[attribute]
            v = rng.choice(values)
            facts.append((rng.choice(says).format(s=s, v=v), rng.choice(asks).format(s=s), "named"))
    facts += [(say, ask, "paraphrase") for say, ask in PARAPHRASES]
    changing = rng.sample(services, 40)
    n_sessions = max(4, messages // 100)
    placed: list[tuple[int, str, str, str]] = [(rng.randrange(n_sessions), *f) for f in facts]
    values, says, asks = ATTRIBUTES[CHANGING]
    for s in changing:  # stated early, changed later: the newest statement is the answer
        first = rng.randrange(n_sessions // 2)
        old, new = rng.sample(values, 2)
        placed.append((first, rng.choice(says).format(s=s, v=old), "", "stale"))
        placed.append((rng.randrange(first + 1, n_sessions), f"Update: {rng.choice(says).format(s=s, v=new)}",
                       rng.choice(asks).format(s=s) + " now", "temporal"))
    by_session: dict[int, list[tuple[str, str, str]]] = {}
    for where, say, ask, kind in placed:
        by_session.setdefault(where, []).append((say, ask, kind))
    corpus = Corpus()
    index = 0
    per_session = max(4, messages // n_sessions)
    for si in range(n_sessions):
        stated = by_session.get(si, [])
        slots = set(rng.sample(range(per_session // 2), min(len(stated), per_session // 2)))
        session: list[dict[str, Any]] = []
        pending = list(stated)
        for turn in range(per_session // 2):
            if turn in slots and pending:
                say, ask, kind = pending.pop()
                session.append({"role": "user", "content": "note for later: " + say})
                if kind in ("named", "paraphrase", "temporal"):
                    corpus.questions.append(Question(ask, kind, index))
                session.append({"role": "assistant", "content": "Noted, I will keep that in mind."})
            else:
                s = rng.choice(services)
                session.append({"role": "user", "content": rng.choice(FILLER).format(s=s, n=rng.randint(2, 999))})
                session.append({"role": "assistant", "content": rng.choice(FILLER).format(
                    s=rng.choice(services), n=rng.randint(2, 999))})
            index += 2
        corpus.sessions.append(session)
    return corpus


def _bm25s_index(corpus: Corpus) -> Any:
    """The baseline: bm25s over the same messages, English stop words, its default tokenizer."""
    import bm25s

    texts = [m["content"] for session in corpus.sessions for m in session]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    return retriever


class StandInVectors:
    """Random unit vectors under the real model's name, for latency at sizes the model would
    take too long to embed on this machine (100k messages: ~20 minutes on 2 cores). Queries are
    still embedded by the real model, so a search's work is the same; its semantic and hybrid
    recall figures mean nothing (the table says so)."""

    def __init__(self, real: Any) -> None:
        self.model, self.floor, self._dims = real.model, 0.0, real.embed(["x"]).shape[1]
        self._rng = numpy().random.default_rng(36)

    def embed(self, texts: Any, *, timeout: float | None = None) -> Any:
        rows = self._rng.standard_normal((len(texts), self._dims)).astype("float32")
        return rows / numpy().linalg.norm(rows, axis=1, keepdims=True)


def run(backend: str, url: str, *, messages: int = 10_000, vectors: str = "model",
        questions: int | None = None) -> dict[str, Any]:
    """Load the corpus into lcm (one agent, one lcm session per corpus session) and ask every
    question in each mode. ``vectors="stand-in"``: latency only (see StandInVectors).
    ``questions``: ask that many, spread evenly over the corpus's questions in the order they
    were placed (so each kind keeps about its share), instead of all: the smoke size, where
    asking all of them and embedding 2,000 messages took two minutes of CI."""
    import bm25s

    corpus = build(messages)
    if questions is not None and questions < len(corpus.questions):
        step = len(corpus.questions) / questions
        corpus.questions = [corpus.questions[int(i * step)] for i in range(questions)]
    store = Store.open(url, upgrade=True)
    ids: list[int] = []
    started = time.perf_counter()
    for si, session in enumerate(corpus.sessions):
        record = store.sessions.get_or_create(AGENT, f"chat-{si:05d}", platform="cli")
        for b in range(0, len(session), BATCH):
            ids += append_messages(store, record.id, session[b:b + BATCH]).store_ids
    store.health.optimize()  # what `lcm ingest` does after an import: statistics, GIN pending lists merged
    load_s = time.perf_counter() - started
    semantic = local_model_installed()
    engine = LcmEngine(LcmConfig.from_env({}, database_url=url, agent_id=AGENT,
                                          embeddings="local" if semantic else "off"))
    engine.on_session_start("chat-00000")
    embed_s = None
    if semantic:  # what `lcm embed` does for an imported store: every message gets its vector
        embedder = engine.context.embedder
        assert embedder is not None
        started = time.perf_counter()
        backfill(store.vectors, embedder if vectors == "model" else StandInVectors(embedder), agent=AGENT)
        embed_s = time.perf_counter() - started
    retriever = _bm25s_index(corpus)
    rows: list[dict[str, Any]] = []
    modes = ("full_text", "semantic", "hybrid") if semantic else ("full_text",)
    for mode in (*modes, "all_words", "bm25s"):
        found: dict[str, list[int]] = {}
        lat: list[float] = []
        for q in corpus.questions:
            evidence = ids[q.evidence]
            t0 = time.perf_counter()
            if mode == "bm25s":
                docs, _scores = retriever.retrieve(bm25s.tokenize([q.text], stopwords="en", show_progress=False),
                                                   k=max(K), show_progress=False)
                ranked = [ids[int(d)] for d in docs[0]]
            elif mode == "all_words":
                hits = store.search.messages(q.text, agent=AGENT, sort="relevance", limit=max(K))
                ranked = [h.id for h in hits.hits]
            else:
                res = json.loads(run_tool(engine.context, "lcm_grep", {
                    "query": q.text, "session_scope": "all", "sort": "relevance", "limit": max(K), "mode": mode}))
                assert res["mode"] == mode, res.get("degraded_reason")
                ranked = [h["store_id"] for h in res["results"] if h["type"] == "message"]
            lat.append((time.perf_counter() - t0) * 1000)
            found.setdefault(q.kind, []).append(ranked.index(evidence) if evidence in ranked else -1)
            found.setdefault("all", []).append(found[q.kind][-1])
        rows.append({"mode": mode, "latency_ms": summary_ms(lat), "classes": {
            kind: {"questions": len(ranks), **{f"recall@{k}": sum(0 <= r < k for r in ranks) / len(ranks) for k in K}}
            for kind, ranks in found.items()}})
    return {"messages": len(ids), "questions": len(corpus.questions), "load_s": load_s, "embed_s": embed_s,
            "vectors": vectors, "rows": rows}
