"""YAML documents from users (configurations, scenarios, job files, inventories, policies), parsed
with bounds. Every YAML text the product reads goes through ``load`` or ``load_all``.

* Size: a text over ``MAX_BYTES`` characters is refused before parsing.
* Depth: PyYAML's composer recurses once per level, so a deeply nested document would run until
  ``RecursionError`` (seconds of CPU first); nesting deeper than ``MAX_DEPTH`` is refused while
  composing, aliases included (an alias counts as deep as the node it names).
* Aliases: PyYAML shares an anchored node between its aliases, so ``a: &a [x, x]``,
  ``b: &b [*a, *a]`` ... (a "billion laughs") is a few hundred bytes of text and a small object
  graph, but anything walking it (validation, ``repr`` in an error message, JSON) sees the
  expansion: 10**9 nodes. The composer counts what aliases add to the expanded document (an
  alias adds the expanded size of the node it names, computed once when that node was composed)
  and refuses past ``MAX_ALIAS_NODES`` nodes or ``MAX_ALIAS_CHARS`` characters of scalars, before
  anything is expanded. A small anchor reused a few times (``<<: *defaults``) is far below both.
  An alias inside the node it names (a recursive document) is refused too.

A refused or malformed document raises ``DocumentError``: a ``ValueError`` (what the callers turn
into their own error naming the document) that is also a ``yaml.YAMLError`` for callers that
catch that.
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import ScalarNode

__all__ = [
    "MAX_ALIAS_CHARS",
    "MAX_ALIAS_NODES",
    "MAX_BYTES",
    "MAX_DEPTH",
    "DocumentError",
    "brief",
    "load",
    "load_all",
]

MAX_DEPTH = 64
MAX_BYTES = 4 * 1024 * 1024
# What aliases may add to a document (a stream, for load_all), beyond its own text.
MAX_ALIAS_NODES = 100_000
MAX_ALIAS_CHARS = 1_000_000


class DocumentError(ValueError, yaml.YAMLError):
    """Not YAML, or past one of the bounds; the message says which (with the line)."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that bounds nesting and alias expansion while composing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0  # of the node being composed
        self._deepest = 0  # the deepest level reached (aliases expanded) inside the current node
        self._nodes = 0  # nodes of the expanded stream so far
        self._chars = 0  # scalar characters of the expanded stream so far
        self._alias_nodes = 0  # of which added by aliases
        self._alias_chars = 0
        # Per anchored node (by id; the composer keeps it alive in self.anchors): its expanded
        # nodes, scalar characters and height. Absent while it is being composed.
        self._extent: dict[int, tuple[int, int, int]] = {}

    def _line(self) -> int:
        return int(self.peek_event().start_mark.line) + 1

    def compose_node(self, parent: Any, index: Any) -> Any:
        depth = self._depth + 1
        if self.check_event(AliasEvent):
            line, anchor = self._line(), self.peek_event().anchor
            node = super().compose_node(parent, index)
            extent = self._extent.get(id(node))
            if extent is None:
                raise DocumentError(f"alias *{anchor} inside the node it names (line {line})")
            nodes, chars, height = extent
            self._alias_nodes += nodes
            self._alias_chars += chars
            if self._alias_nodes > MAX_ALIAS_NODES or self._alias_chars > MAX_ALIAS_CHARS:
                raise DocumentError(
                    f"aliases expand to more than {MAX_ALIAS_NODES:,} nodes or {MAX_ALIAS_CHARS:,} "
                    f"characters (line {line})"
                )
            if depth + height - 1 > MAX_DEPTH:
                raise DocumentError(
                    f"nested deeper than {MAX_DEPTH} levels through alias *{anchor} (line {line})"
                )
            self._nodes += nodes
            self._chars += chars
            self._deepest = max(self._deepest, depth + height - 1)
            return node
        if depth > MAX_DEPTH:
            raise DocumentError(f"nested deeper than {MAX_DEPTH} levels (line {self._line()})")
        anchor = self.peek_event().anchor
        nodes, chars, outer_deepest = self._nodes, self._chars, self._deepest
        self._depth, self._deepest = depth, depth
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth = depth - 1
        self._nodes += 1
        if isinstance(node, ScalarNode):
            self._chars += len(node.value)
        if anchor is not None:
            self._extent[id(node)] = (
                self._nodes - nodes,
                self._chars - chars,
                self._deepest - depth + 1,
            )
        self._deepest = max(outer_deepest, self._deepest)
        return node

    def compose_document(self) -> Any:
        node = super().compose_document()
        self._extent.clear()  # anchors are per document; the counts go on over the stream
        return node


class _NoBase60Loader(_BoundedLoader):
    """Reads ``1:30`` and ``2:00:00`` as text (YAML 1.2, and Kubernetes' YAML), not as YAML 1.1's
    base-60 numbers (90, 7200): for documents where such a value is a time (job files' Slurm-style
    ``time_limit: 1:30:00``)."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        tag = super().resolve(kind, value, implicit)  # type: ignore[no-untyped-call]
        if kind is ScalarNode and tag in _NUMBER_TAGS and ":" in value:
            return "tag:yaml.org,2002:str"  # only a base-60 number holds a colon
        return tag


_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"})


def _check_size(text: str) -> None:
    if len(text) > MAX_BYTES:
        raise DocumentError(f"{len(text):,} characters is more than the {MAX_BYTES:,} allowed")


def load(text: str) -> Any:
    """One YAML (or JSON) document. DocumentError: too large, too deep, too many aliases, or not
    YAML."""
    _check_size(text)
    try:
        loader = _BoundedLoader(text)  # the reader refuses unprintable characters already here
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except DocumentError:
        raise
    except yaml.YAMLError as exc:
        raise DocumentError(f"not valid YAML: {exc}") from None


def load_all(text: str, *, base60: bool = True) -> Iterator[Any]:
    """Every document of a YAML stream (``---`` separated), with the bounds of ``load`` over the
    whole stream. ``base60=False``: ``1:30`` is the text ``"1:30"``, not the number 90."""
    _check_size(text)
    try:
        loader = _BoundedLoader(text) if base60 else _NoBase60Loader(text)
        try:
            while loader.check_data():
                yield loader.get_data()
        finally:
            loader.dispose()
    except DocumentError:
        raise
    except yaml.YAMLError as exc:
        raise DocumentError(f"not valid YAML: {exc}") from None


_BRIEF = reprlib.Repr()
_BRIEF.maxlevel = 3
_BRIEF.maxstring = 40
_BRIEF.maxother = 60
_BRIEF.maxlist = _BRIEF.maxtuple = _BRIEF.maxdict = _BRIEF.maxset = 5
_BRIEF.maxlong = 40


BRIEF_CHARS = 200


def brief(value: Any) -> str:
    """``repr(value)`` for an error message: a few levels and entries, long strings cut, at most
    ``BRIEF_CHARS`` characters (a value from a document may be large, or shared by aliases many
    times over)."""
    text = _BRIEF.repr(value)
    return text if len(text) <= BRIEF_CHARS else text[: BRIEF_CHARS - 3] + "..."
