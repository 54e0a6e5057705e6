"""Context Engine for Semantic Kernel 1.x: ``ce.semantic_kernel.install(engine)`` hands every
chat-completion request of every kernel (each round of the auto-function-calling loop,
streamed or not, ``kernel.invoke_prompt``, a chat service called directly,
``ChatCompletionAgent``) the engine's assembled input and records the runs through SK's
filters; ``install(engine, kernel=kernel)`` does it for one kernel (and its clones)."""

from __future__ import annotations

from ce.semantic_kernel._plugin import SemanticKernelPlugin, install, uninstall

__all__ = ["SemanticKernelPlugin", "install", "uninstall"]
