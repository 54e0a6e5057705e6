"""Context Engine for LangChain: ``ce.langchain.install(engine)`` records every run and hands
every chat-model call the engine's assembled input; ``ce.langchain.middleware()`` and
``ce.langchain.wrap(model)`` are the explicit seams."""

from ce.langchain._plugin import LangChainPlugin, install, middleware, uninstall, wrap

__all__ = ["LangChainPlugin", "install", "middleware", "uninstall", "wrap"]
