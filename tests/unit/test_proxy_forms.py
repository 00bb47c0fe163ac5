"""What the proxy sends for lcm's context messages: each in the client's current form of it."""

from __future__ import annotations

from typing import Any

from lcm.proxy.conversations import in_clients_form

MARK = {"cache_control": {"type": "ephemeral"}}


def marked(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": text, **MARK}]}


def test_a_message_the_client_still_sends_goes_out_as_the_client_sends_it_now():
    stored = [marked("first"), {"role": "assistant", "content": "a1"}, marked("second")]
    client = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "a1"}, marked("second")]
    out = list(stored)
    in_clients_form(out, client)
    assert out == [{"role": "user", "content": [{"type": "text", "text": "first"}]},  # not sent now: unmarked
                   {"role": "assistant", "content": "a1"}, marked("second")]
    assert out[2] is client[2]  # the client's own object


def test_marks_on_a_message_without_text_are_dropped_unless_the_client_sends_them_now():
    """Hermes marks an assistant turn that only calls tools at its top level (Anthropic's native
    layout): the stored copy keeps it, the upstream gets it only while the client does."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    stored = {"role": "assistant", "content": None, "tool_calls": [call], **MARK}
    out = [stored]
    in_clients_form(out, [{"role": "user", "content": "go on"}])
    assert out == [{"role": "assistant", "content": None, "tool_calls": [call]}]
    out = [stored]
    now = {"role": "assistant", "content": None, "tool_calls": [call], **MARK}
    in_clients_form(out, [now])
    assert out[0] is now


def test_messages_before_start_and_plain_ones_are_left_as_they_are():
    first, plain = marked("kept as it went out last time"), {"role": "user", "content": "plain"}
    out = [first, plain, marked("new")]
    in_clients_form(out, [], start=1)
    assert out[0] is first and out[1] is plain
    assert out[2] == {"role": "user", "content": [{"type": "text", "text": "new"}]}
