"""The public import path of lcm's Hermes context engine (``from lcm.engine import LcmEngine``,
see docs/contract.md): it lives in ``lcm.hermes.engine``."""

from lcm.hermes.engine import LcmEngine

__all__ = ["LcmEngine"]
