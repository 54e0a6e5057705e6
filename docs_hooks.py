"""mkdocs hook: the site's home page is the repository's README.md, its links made relative
to the docs directory (``docs/concepts/x.md`` -> ``concepts/x.md``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

README = Path(__file__).parent / "README.md"
_DOCS_LINK = re.compile(r"\]\(docs/")


def on_files(files: Files, config: Any) -> Files:
    text = _DOCS_LINK.sub("](", README.read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=text))
    return files
