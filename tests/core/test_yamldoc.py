"""muster/yamldoc.py: the one YAML loader for user documents, with its size, depth and alias bounds."""

from __future__ import annotations

import time

import pytest
import yaml

from muster import yamldoc
from muster.yamldoc import DocumentError


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    """``a: &a [lol x 9]``, ``b: &b [*a x 9]`` ...: a few hundred bytes, width**levels nodes."""
    lines = ["a: &a [" + ", ".join(["lol"] * width) + "]"]
    names = "abcdefghijklmnopqrstuvwxyz"
    for i in range(1, levels):
        lines.append(f"{names[i]}: &{names[i]} [" + ", ".join([f"*{names[i - 1]}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_a_billion_laughs_is_refused_in_milliseconds() -> None:
    text = billion_laughs()
    assert len(text) < 600
    started = time.perf_counter()
    with pytest.raises(DocumentError, match="aliases expand to more than 100,000 nodes"):
        yamldoc.load(text)
    assert time.perf_counter() - started < 0.5


def test_a_long_string_repeated_by_aliases_is_refused() -> None:
    text = "a: &a " + "x" * 300_000 + "\nb: [*a, *a, *a, *a]\n"
    with pytest.raises(DocumentError, match="1,000,000 characters"):
        yamldoc.load(text)


def test_small_anchors_and_merge_keys_load_as_before() -> None:
    text = (
        "defaults: &defaults {queue: ml, request: {cpu: '1', memory: 1Gi}}\n"
        "jobs:\n"
        "- {<<: *defaults, id: a}\n"
        "- {<<: *defaults, id: b, queue: web}\n"
        "same: [*defaults, *defaults]\n"
    )
    doc = yamldoc.load(text)
    assert doc == yaml.safe_load(text)
    assert doc["jobs"][1] == {"queue": "web", "request": {"cpu": "1", "memory": "1Gi"}, "id": "b"}


def test_the_bound_is_on_what_aliases_add() -> None:
    # Each level doubles the one before: 14 levels add 65,502 nodes through aliases (under the
    # bound), 15 levels 131,042 (over).
    def doubling(levels: int) -> str:
        lines = ["l0: &l0 [x, x]"] + [
            f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}]" for i in range(1, levels)
        ]
        return "\n".join(lines) + "\n"

    assert yamldoc.load(doubling(14))["l13"][1][1][0] == yamldoc.load(doubling(14))["l11"][0]
    with pytest.raises(DocumentError, match="aliases expand"):
        yamldoc.load(doubling(15))


def test_a_plain_document_is_bounded_by_its_size_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yamldoc, "MAX_ALIAS_NODES", 1000)
    assert len(yamldoc.load("[" + ", ".join(["1"] * 5000) + "]")) == 5000
    with pytest.raises(DocumentError, match="aliases expand to more than 1,000 nodes"):
        yamldoc.load("a: &a [" + ", ".join(["1"] * 600) + "]\nb: [*a, *a]\n")


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: [1, *a]}"])
def test_an_alias_inside_the_node_it_names_is_refused(text: str) -> None:
    with pytest.raises(DocumentError, match="inside the node it names"):
        yamldoc.load(text)


def test_depth_counts_what_aliases_nest() -> None:
    deep = "[" * 40 + "1" + "]" * 40
    assert yamldoc.load(f"a: &a {deep}\nb: *a\n")["b"] is not None
    with pytest.raises(DocumentError, match="deeper than 64 levels through alias"):
        yamldoc.load(f"a: &a {deep}\nb: {'[' * 30}*a{']' * 30}\n")
    with pytest.raises(DocumentError, match="deeper than 64 levels"):
        yamldoc.load("a: " + "[" * 100 + "]" * 100)


def test_size_bound_and_syntax_errors() -> None:
    with pytest.raises(DocumentError, match="more than the"):
        yamldoc.load("x" * (yamldoc.MAX_BYTES + 1))
    with pytest.raises(DocumentError, match="not valid YAML"):
        yamldoc.load("a: [")
    # Both kinds of caller: those catching ValueError and those catching yaml.YAMLError.
    with pytest.raises(ValueError, match="not valid YAML"):
        yamldoc.load("a: [")
    with pytest.raises(yaml.YAMLError):
        yamldoc.load("a: [")


def test_load_all_bounds_the_whole_stream() -> None:
    assert list(yamldoc.load_all("a: 1\n---\nb: &b 2\nc: *b\n")) == [{"a": 1}, {"b": 2, "c": 2}]
    one = "l0: &l0 [x, x, x, x, x, x, x, x, x, x]\nl1: &l1 [" + ", ".join(["*l0"] * 1000) + "]\n"
    assert len(list(yamldoc.load_all(one))) == 1  # 10,000 nodes through aliases
    with pytest.raises(DocumentError, match="aliases expand"):
        list(yamldoc.load_all("---\n".join([one] * 11)))  # 110,000 over the stream
    with pytest.raises(DocumentError, match="undefined alias"):
        list(yamldoc.load_all("a: &a 1\n---\nb: *a\n"))  # anchors are per document


def test_brief_keeps_error_messages_short() -> None:
    shared = ["x" * 1000] * 1000
    assert len(yamldoc.brief({"a": shared, "b": shared})) < 400
    assert yamldoc.brief([]) == "[]"
    assert yamldoc.brief("volcano") == "'volcano'"


@pytest.mark.parametrize("text", ["\x1b", "a: \x01", "\x9d"])
def test_unprintable_characters_are_a_document_error(text: str) -> None:
    with pytest.raises(DocumentError, match="not valid YAML"):
        yamldoc.load(text)
    with pytest.raises(DocumentError, match="not valid YAML"):
        list(yamldoc.load_all(text))
