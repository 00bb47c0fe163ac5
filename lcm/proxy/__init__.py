"""``lcm proxy``: lcm for any client of the OpenAI chat-completions API.

The proxy sits between such a client (a script using the ``openai`` package, a chat front end,
an agent framework) and its model provider. Each request's messages are stored exactly once
(the engine's alignment: clients re-send the whole conversation every time), the upstream is
handed lcm's assembled context within the model's window, the lcm tools are offered beside
the client's own (and answered by the proxy), and the answer comes back as the upstream gave
it. docs/proxy.md is the user's page.

Modules: ``wire`` (the OpenAI wire format: requests, errors, streamed chunks), ``callers``
(which agent and which conversation a request belongs to), ``conversations`` (a conversation's
context session: store, assemble, recall, keep the answer), ``toolloop`` (the lcm tools beside
the client's), ``windows`` (model → context window), ``app`` (the HTTP routes and the upstream).
"""
