"""Test support shipped with ce-core.

:class:`StoreContract` is the pytest suite every :class:`~ce.core.stores.Store` implementation
must pass; it needs ``pytest`` and ``pytest-asyncio`` (extra ``ce-core[testing]``) and is
imported on first use, so ``import ce.core.testing`` works without them.
:mod:`ce.core.testing.records` holds the record factories it uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ce.core.testing.store_contract import InjectedFailure, StoreContract

__all__ = ["InjectedFailure", "StoreContract"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ce.core.testing import store_contract

        return getattr(store_contract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
