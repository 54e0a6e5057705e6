"""Context Engine core: schema, AgentState, stores and the context pipeline."""

__version__ = "0.1.0"

__all__ = ["__version__"]
