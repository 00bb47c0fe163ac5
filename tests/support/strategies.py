"""Hypothesis strategies for OpenAI-format messages, including the text databases choke on."""

from __future__ import annotations

from hypothesis import strategies as st

# Any code point, surrogates included (hypothesis leaves category Cs out by default), with
# NUL and U+0001 (the codec's escape marker) drawn often.
any_char = st.one_of(
    st.characters(codec="utf-8"),
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
    st.sampled_from(["\x00", "\x01", "\ud83d", "\ude00", "é", "数", "\u2028", '"', "\\"]),
)
nasty_text = st.text(alphabet=any_char, max_size=40)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False), nasty_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(nasty_text, children, max_size=4),
    ),
    max_leaves=12,
)

text_part = st.fixed_dictionaries({"type": st.just("text"), "text": nasty_text})
image_part = st.fixed_dictionaries({
    "type": st.just("image_url"),
    "image_url": st.fixed_dictionaries({"url": st.just("data:image/png;base64,iVBORw0KGgo=")}),
})
content = st.one_of(st.none(), nasty_text, st.lists(st.one_of(text_part, image_part), max_size=3))

tool_call = st.fixed_dictionaries({
    "id": st.text(min_size=1, max_size=12),
    "type": st.just("function"),
    "function": st.fixed_dictionaries({"name": nasty_text, "arguments": nasty_text}),
})

ROLES = ["user", "assistant", "tool", "system", "developer"]


@st.composite
def messages(draw: st.DrawFn) -> dict:
    """A message with any mix of core keys, extra keys and key orders."""
    msg: dict = {"role": draw(st.sampled_from(ROLES))}
    if draw(st.booleans()):
        msg["content"] = draw(content)
    if draw(st.integers(0, 3)) == 0:
        msg["tool_calls"] = draw(st.lists(tool_call, max_size=2))
    if draw(st.integers(0, 3)) == 0:
        msg["tool_call_id"] = draw(st.one_of(st.text(max_size=10), nasty_text, st.none()))
    if draw(st.integers(0, 4)) == 0:
        msg["name"] = draw(nasty_text)
    extras = draw(st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k not in ("role", "content", "tool_calls",
                                                                    "tool_call_id", "name",
                                                                    "_db_persisted", "message_uid")),
        json_values, max_size=3))
    msg.update(extras)
    if draw(st.booleans()):  # shuffle key order
        keys = draw(st.permutations(list(msg.keys())))
        msg = {k: msg[k] for k in keys}
    return msg
