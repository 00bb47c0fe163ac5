"""Importers of other tools' stores: each reads a foreign file read-only and turns it into
:class:`lcm.transfer.SessionPlan` s, which ``lcm.transfer.import_session`` stores exactly once
(so re-running an import stores nothing new); the summaries another program wrote are placed
into lcm's DAG by ``lcm.importers.dag``."""

from lcm.importers.dag import DagReport, plan_dag, write_dag
from lcm.importers.hermes_lcm import read_hermes_lcm
from lcm.importers.hermes_state import read_hermes_state
from lcm.importers.lossless_claw import read_lossless_claw
from lcm.importers.source import NotThisFormat

__all__ = ["DagReport", "NotThisFormat", "plan_dag", "read_hermes_lcm", "read_hermes_state", "read_lossless_claw",
           "write_dag"]
