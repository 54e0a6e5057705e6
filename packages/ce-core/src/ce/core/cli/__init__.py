"""The ``ce`` command line (extra ``ce-core[cli]``, which brings rich).

=====================================  =========================================================
command                                what it does
=====================================  =========================================================
``ce sessions [--user ID]``            the stored sessions: messages, tool calls, evidences,
                                       turn records, last activity, version
``ce show SESSION``                    the session's timeline: messages with their tool calls
                                       and results, model usage, evidences, run status
``ce report SESSION [TURN]``           a turn's report (default: the newest turn): budget,
                                       prune decisions, degradations, errors, redactions
``ce replay SESSION TURN --budget N``  reassemble the turn under another budget (and
                                       ``--model HINT``); diff the two assembled inputs
``ce export SESSION [-o FILE]``        ``{"document": ..., "turns": [...]}`` as JSON
``ce import FILE [--session ID]``      store an export (``--replace`` overwrites a session)
``ce schema``                          the JSON Schema of the session document
``ce view [--port N] [--open]``        a local web page over the store: sessions, timelines,
                                       each model call's input and decisions, replays
=====================================  =========================================================

Every command but ``schema`` takes ``--store URL`` (see :func:`ce.core.stores.open_store`);
the default is ``$CE_STORE_URL``, else ``sqlite:///.ce/sessions.db``. This package imports
without rich; the commands that render tables then fail with a one-line error naming the extra
(every framework plugin depends on ``ce-core[cli]``).
"""

from ce.core.cli._main import main

__all__ = ["main"]
