"""``lcm ui``: a read-only web explorer of a store (agents, sessions, messages, the summary DAG,
search, status and health), served on loopback. Needs the ``ui`` extra (Starlette, uvicorn,
Jinja2); ``lcm.ui.app`` has the routes, ``lcm.ui.serve`` the server."""
