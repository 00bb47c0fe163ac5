"""Summaries of leaf chunks and condensations, through an LLM when one is configured and a
deterministic extractive summary otherwise (see ``summarizer``)."""

from lcm.context.summarize.request import SummaryDraft, SummaryRequest
from lcm.context.summarize.routes import Route, RouteError
from lcm.context.summarize.summarizer import HostRoute, Summarizer

__all__ = ["HostRoute", "Route", "RouteError", "Summarizer", "SummaryDraft", "SummaryRequest"]
