"""The Plugin base class every framework integration derives from (BaseInstrumentor-style)."""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from abc import ABC, abstractmethod
from collections import Counter
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from packaging.requirements import InvalidRequirement, Requirement

from ce.core.errors import ContextEngineError
from ce.core.integration._history import HistoryMemo
from ce.core.integration._ledger import PatchLedger

if TYPE_CHECKING:
    from ce.core.config import RuntimeConfig
    from ce.core.engine import ContextEngine

__all__ = ["InjectMode", "Plugin", "PluginVersionError", "requirement_conflicts"]

logger = logging.getLogger("ce.core.integration")

InjectMode = Literal["replace", "augment"]
_P = TypeVar("_P", bound="Plugin")
_instances: dict[type[Plugin], Plugin] = {}
_instances_lock = threading.Lock()


class PluginVersionError(ContextEngineError):
    """The installed framework is missing or outside the plugin's supported range."""


def requirement_conflicts(requirements: tuple[str, ...]) -> list[str]:
    """What the installed distributions violate of ``requirements`` (PEP 508 strings; those
    whose environment marker does not apply are skipped), one line each; empty when all are
    met. Pre-releases inside the range count as meeting it."""
    conflicts: list[str] = []
    for spec in requirements:
        try:
            requirement = Requirement(spec)
        except InvalidRequirement as exc:
            conflicts.append(f"invalid requirement {spec!r}: {exc}")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            conflicts.append(f"{requirement.name} is not installed (needs {spec!r})")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            conflicts.append(f"{requirement.name} {version} is installed, needs {spec!r}")
    return conflicts


class Plugin(ABC):
    """One framework integration. Subclasses set :attr:`name` and :attr:`requirements` and
    implement :meth:`_install` (put hooks in place through :attr:`ledger`); :meth:`_uninstall`
    defaults to undoing the ledger.

    There is one instance per class (``MyPlugin() is MyPlugin()``). :meth:`install` and
    :meth:`uninstall` are the public template methods: installing an installed plugin, or
    uninstalling one that is not installed, logs a warning and changes nothing. While
    installed, hooks read :attr:`engine`, :attr:`session_id`, :attr:`config`, :attr:`mode`,
    :attr:`fail_closed` and :attr:`options`.
    """

    name: ClassVar[str] = ""
    """The plugin's name in logs and events (e.g. ``"langchain"``)."""
    requirements: ClassVar[tuple[str, ...]] = ()
    """PEP 508 requirements on the framework, e.g. ``("langchain-core >= 1.0, < 2",)``."""

    ledger: PatchLedger
    session_id: str | None
    config: RuntimeConfig | None
    mode: InjectMode
    fail_closed: bool
    options: dict[str, Any]
    failures: Counter[str]
    """How often a hook went on without the engine, by reason: ``"integration_failed"`` (the
    engine could not serve a call: the framework's own input went through, redacted) and
    ``"redaction_failed"`` (that redaction failed too: the input went through unredacted)."""
    histories: HistoryMemo
    """The history each session's previous call passed, converted (see
    :class:`~ce.core.integration.HistoryMemo`); forgotten on :meth:`uninstall`."""
    _engine: ContextEngine | None
    _installed: bool
    _lock: threading.RLock

    def __new__(cls: type[_P], *args: Any, **kwargs: Any) -> _P:
        with _instances_lock:
            instance = _instances.get(cls)
            if instance is None:
                instance = super().__new__(cls)
                instance.ledger = PatchLedger()
                instance.session_id = None
                instance.config = None
                instance.mode = "replace"
                instance.fail_closed = False
                instance.options = {}
                instance.failures = Counter()
                instance.histories = HistoryMemo()
                instance._engine = None
                instance._installed = False
                instance._lock = threading.RLock()
                _instances[cls] = instance
            assert isinstance(instance, cls)
            return instance

    @property
    def installed(self) -> bool:
        """Whether the plugin's hooks are in place."""
        return self._installed

    @property
    def engine(self) -> ContextEngine:
        """The engine given to (or created by) :meth:`install`; :class:`RuntimeError` when
        the plugin was never installed."""
        if self._engine is None:
            raise RuntimeError(f"plugin {self.name or type(self).__name__!r} is not installed")
        return self._engine

    def install(
        self: _P,
        engine: ContextEngine | None = None,
        *,
        session_id: str | None = None,
        config: RuntimeConfig | None = None,
        mode: InjectMode = "replace",
        fail_closed: bool = False,
        strict: bool = False,
        **options: Any,
    ) -> _P:
        """Put the plugin's hooks in place and return the plugin (the handle to uninstall).

        ``engine`` defaults to a new :class:`~ce.core.engine.ContextEngine`; ``session_id``
        is the session of calls for which neither the framework nor ``engine.session()``
        names one; ``config`` is the :class:`RuntimeConfig` of the engine calls the hooks
        make (default: the engine's). ``mode="replace"`` lets the engine decide the whole
        message list, ``"augment"`` keeps the framework's list and adds the engine's context.
        With ``fail_closed=True`` an engine failure raises into the framework call instead of
        letting the original input through. ``options`` go to :meth:`_install`.

        When the installed framework does not meet :attr:`requirements`, nothing is installed
        and the conflict is logged, or raised as :class:`PluginVersionError` with
        ``strict=True``. If :meth:`_install` raises, what it had put in place is undone.
        Installing loads the tokenizer of the config's model, so the first model call (on an
        event loop, perhaps) does not.
        """
        if mode not in ("replace", "augment"):
            raise ValueError(f"mode must be 'replace' or 'augment', not {mode!r}")
        label = self.name or type(self).__name__
        with self._lock:
            if self._installed:
                logger.warning("plugin %r is already installed; install() does nothing", label)
                return self
            conflicts = requirement_conflicts(self.requirements)
            if conflicts:
                message = f"plugin {label!r} not installed: " + "; ".join(conflicts)
                if strict:
                    raise PluginVersionError(message)
                logger.error("%s", message)
                return self
            if engine is None:
                from ce.core.engine import ContextEngine

                engine = ContextEngine()
            self._engine = engine
            self.session_id = session_id
            self.config = config
            self.mode = mode
            self.fail_closed = fail_closed
            self.options = dict(options)
            try:
                self._install(**options)
            except BaseException:
                self._engine = None
                self.ledger.undo()
                raise
            self._installed = True
            _load_tokenizer(engine, config)
            logger.debug("plugin %r installed", label)
        return self

    def uninstall(self) -> None:
        """Remove every hook :meth:`install` put in place, restoring the framework's exact
        original objects."""
        label = self.name or type(self).__name__
        with self._lock:
            if not self._installed:
                logger.warning("plugin %r is not installed; uninstall() does nothing", label)
                return
            try:
                self._uninstall()
            finally:
                self._installed = False
                self._engine = None
                self.histories.forget()
            logger.debug("plugin %r uninstalled", label)

    @abstractmethod
    def _install(self, **options: Any) -> None:
        """Put the hooks in place, recording each one in :attr:`ledger`. Import the
        framework here (not at module level), so the plugin imports without it."""

    def _uninstall(self) -> None:
        """Remove the hooks; the default undoes :attr:`ledger`."""
        self.ledger.undo()


def _load_tokenizer(engine: ContextEngine, config: RuntimeConfig | None) -> None:
    """Load the tokenizer of the hooks' model now (once per process: a tiktoken encoding
    takes a few hundred ms to build), not in the first model call, which may run on an event
    loop that every other request is waiting on. Fail-open: a tokenizer that cannot load is
    reported by the engine's first call, as before."""
    try:
        engine.estimator.estimate_text("", (config or engine.config).model_hint)
    except Exception:
        logger.debug("loading the tokenizer at install failed", exc_info=True)
