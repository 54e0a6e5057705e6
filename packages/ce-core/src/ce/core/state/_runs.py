"""The run-status state machine: which status may follow which."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ce.core.errors import InvalidTransitionError
from ce.core.schema import RunStatus

__all__ = ["RUN_TRANSITIONS", "can_transition", "check_transition"]

_S = RunStatus

_END = frozenset({_S.FAILED, _S.ABORTED})

RUN_TRANSITIONS: Mapping[RunStatus, frozenset[RunStatus]] = MappingProxyType(
    {
        _S.IDLE: frozenset({_S.PREPARING}),
        _S.PREPARING: frozenset({_S.MODEL_RUNNING}) | _END,
        _S.MODEL_RUNNING: frozenset({_S.TOOL_RUNNING, _S.AWAITING_HUMAN, _S.COMPLETED}) | _END,
        _S.TOOL_RUNNING: frozenset({_S.MODEL_RUNNING, _S.AWAITING_HUMAN}) | _END,
        _S.AWAITING_HUMAN: frozenset({_S.MODEL_RUNNING, _S.TOOL_RUNNING}) | _END,
        _S.COMPLETED: frozenset({_S.PREPARING}),
        _S.FAILED: frozenset({_S.PREPARING}),
        _S.ABORTED: frozenset({_S.PREPARING}),
    }
)
"""Every legal ``current -> target`` run-status transition; anything else is illegal.

A run goes ``idle -> preparing -> model_running -> tool_running -> model_running … ->
completed``; ``awaiting_human`` is entered from and returns to ``model_running`` or
``tool_running``; any active status may end in ``failed`` or ``aborted``; a new run
(``preparing``) starts from ``idle``, ``completed``, ``failed`` or ``aborted``.
"""


def can_transition(current: RunStatus, target: RunStatus) -> bool:
    """Whether the run state machine allows ``current -> target``."""
    return target in RUN_TRANSITIONS[current]


def check_transition(current: RunStatus, target: RunStatus) -> None:
    """Raise :class:`InvalidTransitionError` unless ``current -> target`` is legal."""
    if not can_transition(current, target):
        raise InvalidTransitionError(current.value, target.value)
