"""Importers of other tools' stores: each reads a foreign file read-only and turns it into
:class:`lcm.transfer.SessionPlan` s, which ``lcm.transfer.import_session`` stores exactly once
(so re-running an import stores nothing new)."""

from lcm.importers.hermes_state import read_hermes_state

__all__ = ["read_hermes_state"]
