"""YAML documents from users (configurations, scenarios), parsed with bounds.

A deeply nested document makes PyYAML's composer recurse until ``RecursionError`` (seconds of CPU
first); a huge one holds the server's memory. Both are refused up front with ``ValueError``,
which the callers turn into their own error naming the document.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 64
MAX_BYTES = 4 * 1024 * 1024


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than ``MAX_DEPTH`` while composing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels (line {mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load(text: str) -> Any:
    """One YAML (or JSON) document. ValueError: too large, too deep, or not YAML."""
    if len(text) > MAX_BYTES:
        raise ValueError(f"{len(text):,} characters is more than the {MAX_BYTES:,} allowed")
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ValueError(f"not valid YAML: {exc}") from None
