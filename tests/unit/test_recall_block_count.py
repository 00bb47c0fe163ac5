"""Auto-recall counts its block as the sum of its pieces, each with the newline after it
(``lcm.tools.autorecall._render``). That is exact only because a tokenizer's pre-split never
runs a piece across a newline into text that starts with a non-space character: checked here
on random lines for the encoding lcm loads offline, and for the split patterns of the other
OpenAI encodings a cached or downloaded tokenizer would use (their patterns with the offline
encoding's ranks: what is additive is the split, whatever the merges)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcm import tokens as tok
from lcm.messages import RECALL_CLOSE, RECALL_HEADER


def _encodings() -> list[object]:
    import tiktoken
    import tiktoken_ext.openai_public as public

    offline = tok._load_without_network(tok.OFFLINE_ENCODING)
    ranks = offline._mergeable_ranks
    out = [offline]
    for name in ("o200k_base", "r50k_base"):
        real = public.load_tiktoken_bpe
        public.load_tiktoken_bpe = lambda *a, **k: ranks
        try:
            spec = getattr(public, name)()
        finally:
            public.load_tiktoken_bpe = real
        out.append(tiktoken.Encoding(name=f"{name}-split", pat_str=spec["pat_str"], mergeable_ranks=ranks,
                                     special_tokens={}))
    return out


ENCODINGS = _encodings()

#: What a quoted line's text can be: any characters a message holds, whitespace made single
#: spaces (as ``_render`` does), ending anyhow (a word, punctuation, an ellipsis, a space).
bodies = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80).map(
    lambda t: " ".join(t.split())) | st.sampled_from(["", "ok.", "done …", "!!!", "x\u00a0", "数据 …", "42"])


@pytest.mark.parametrize("encoding", ENCODINGS, ids=lambda e: e.name)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(bodies, min_size=1, max_size=6), ends=st.lists(st.sampled_from(["", " …", " ", "."]),
                                                                       min_size=6, max_size=6))
def test_a_block_counts_as_the_sum_of_its_lines_with_their_newlines(encoding, texts, ends):
    count = lambda text: len(encoding.encode_ordinary(text))  # noqa: E731
    # As ``_render`` makes them: the label, the text, no space at the end.
    lines = [f"[store_id={i + 1} · 2026-11-29 10:00 · user] {body}{end}".rstrip() for i, (body, end) in
             enumerate(zip(texts, ends, strict=False))]
    whole = "\n".join([RECALL_HEADER, *lines, RECALL_CLOSE])
    pieces = count(RECALL_HEADER + "\n") + sum(count(line + "\n") for line in lines) + count(RECALL_CLOSE)
    assert pieces == count(whole)


def test_with_a_character_estimate_the_sum_is_an_upper_bound():
    """No tokenizer at all: characters / 4 rounded up per piece can only add up to more."""
    estimate = tok.EstimatedTokens()
    lines = ["[store_id=1 · 2026-11-29 10:00 · user] " + "x" * n for n in (1, 5, 22, 301)]
    whole = "\n".join([RECALL_HEADER, *lines, RECALL_CLOSE])
    pieces = (estimate.count_text(RECALL_HEADER + "\n") + sum(estimate.count_text(line + "\n") for line in lines)
              + estimate.count_text(RECALL_CLOSE))
    assert pieces >= estimate.count_text(whole)
