"""lcm's Hermes plugin: registers lcm's context engine (a Hermes ``ContextEngine``) named ``lcm``.

Installed by ``lcm hermes install`` into ``$HERMES_HOME/plugins/lcm/`` and activated by
``plugins.enabled: [lcm]`` plus ``context.engine: lcm`` in Hermes' ``config.yaml``. This file
is deliberately thin: the engine lives in the ``lossless-context`` package, which must be
installed into the Python environment that runs Hermes (upgrading the package upgrades the
plugin; the files here never need to change).

Constructing the engine does no I/O; the database (``lcm.db`` in the Hermes home, or
``LCM_DATABASE_URL``) opens on the first session. Hermes deep-copies the registered engine for
every agent; lcm's copies share the database engine and never a session.
"""

from __future__ import annotations

import logging

log = logging.getLogger("lcm.hermes_plugin")


def register(ctx) -> None:
    """Hermes plugin entry point: build lcm's engine and hand it to ``ctx``."""
    try:
        from lcm.hermes import build_engine
    except ImportError as exc:
        import sys

        log.error("lcm: the lossless-context package is not importable from Hermes' Python (%s): %s. "
                  "Install it into that environment from an lcm checkout or wheel (lossless-context is "
                  "not on PyPI yet): %s -m pip install /path/to/lcm-checkout",
                  sys.executable, exc, sys.executable)
        return
    engine = build_engine(ctx)
    register_engine = getattr(ctx, "register_context_engine", None)
    if register_engine is None:
        log.error("lcm: this Hermes has no register_context_engine(); lcm needs hermes-agent 0.19 or newer")
        return
    register_engine(engine)
