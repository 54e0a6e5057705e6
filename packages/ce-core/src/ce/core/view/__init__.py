"""``ce view``: a local web page over a store's sessions.

The page lists the sessions; a session's timeline shows its messages with their authors, tool
calls with status and duration, evidences (retrievals, tool results) and model calls with
tokens and latency; a model call shows its decisions (kept, degraded to which level, dropped,
with reasons and tokens), its redactions, the evidence blocks with their provenance, the input
as assembled, and its replay under another budget with the diff. Plain HTML, CSS and JavaScript
shipped in this package, served by the standard library; nothing to build or install beyond
ce-core. See :func:`serve`; the JSON it serves comes from :mod:`ce.core.view._api`.
"""

from ce.core.view._api import replay_json, session_json, sessions_json, turn_json
from ce.core.view._server import DEFAULT_PORT, HOST, ViewerHTTPServer, serve

__all__ = [
    "DEFAULT_PORT",
    "HOST",
    "ViewerHTTPServer",
    "replay_json",
    "serve",
    "session_json",
    "sessions_json",
    "turn_json",
]
