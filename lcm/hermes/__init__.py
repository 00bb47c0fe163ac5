"""The Hermes adapter: lcm as the Hermes agent's context engine.

``engine`` (``LcmEngine``: Hermes' contract over ``lcm.context.ContextSession``), ``host``
(Hermes' ``ContextEngine`` base, or a stand-in when Hermes is not installed), ``routes``
(Hermes' auxiliary LLM as a summarizer route) and ``install`` (``lcm hermes install`` /
``uninstall``). Imported by the plugin (``hermes_plugin/``) and the command line only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lcm.config import hermes_home_from_env

if TYPE_CHECKING:
    from lcm.hermes.engine import LcmEngine


def hermes_home() -> Path | None:
    """The running Hermes' home (its own resolver when importable), else $HERMES_HOME."""
    try:
        from hermes_constants import get_hermes_home  # type: ignore[import-not-found]

        return Path(get_hermes_home())
    except Exception:  # noqa: BLE001 - not inside Hermes
        return hermes_home_from_env()


def build_engine(ctx: Any = None) -> LcmEngine:
    """The engine the plugin registers: settings from the environment (Hermes has loaded its
    ``.env`` by then), the database in the Hermes home unless ``LCM_DATABASE_URL`` says
    otherwise, the agent scope from the profile. No I/O here. (The engine module is imported
    here, not at the top, so that ``lcm hermes install`` does not load the whole engine.)"""
    from lcm.hermes import hooks
    from lcm.hermes.engine import LcmEngine

    home = hermes_home()
    kwargs: dict[str, Any] = {"inside_hermes": True}
    if home is not None:
        kwargs["hermes_home"] = str(home)
    if ctx is not None:
        hooks.register(ctx)  # the system prompt reaches lcm through pre_api_request
    return LcmEngine(**kwargs)
