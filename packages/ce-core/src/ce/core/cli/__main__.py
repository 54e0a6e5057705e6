"""``python -m ce.core.cli ...`` runs the ``ce`` command."""

from ce.core.cli import main

raise SystemExit(main())
