"""Context Engine for LangChain: ``ce.langchain.install(engine)`` records every run and hands
every chat-model call the engine's assembled input."""

from ce.langchain._plugin import LangChainPlugin, install, middleware, uninstall

__all__ = ["LangChainPlugin", "install", "middleware", "uninstall"]
