"""Render deploy/helm/muster without helm: the part of Go templates and sprig the chart uses.

helm is not installed on the build machines, yet the chart now has logic worth testing (replica
counts chosen from the state backend, a refusal to run two servers on one SQLite file, optional
objects). This renderer follows Go's text/template rules for what it supports -- trim markers,
``if / else if / else / end``, ``define`` / ``include``, variables (``:=`` declares in the current
block, ``=`` assigns to the enclosing one), pipelines, parenthesized calls, field chains on maps
(a missing key is nil, a field of nil is an error) -- and Helm's typing: numbers in values are
float64, so ``gt .Values.n 1`` without ``int`` is an error here as it is in helm. Anything else
(``range``, ``with``, an unknown function, a printf verb it does not know) raises
:class:`TemplateError` instead of rendering something wrong; ``test_helm_template_*`` renders with
the real helm where it is installed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    """The template uses something this renderer does not support, or is wrong."""


class ChartFail(TemplateError):
    """The chart's own ``fail`` or ``required``: helm would stop with this message."""


# ------------------------------------------------------------------------------------------
# Lexing and parsing
# ------------------------------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-[ \t\r\n])?(.*?)([ \t\r\n]-)?\}\}", re.S)
_ASSIGN = re.compile(r"^(\$\w*)\s*(:=|=)\s*(.*)$", re.S)
_TOKEN = re.compile(
    r"""\s*(?:
      (?P<str>"(?:[^"\\]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<num>-?\d+(?:\.\d+)?)
    | (?P<field>(?:\$\w*)?(?:\.\w+)+|\$\w*|\.)
    | (?P<ident>[A-Za-z_]\w*)
    | (?P<lp>\()
    | (?P<rp>\))
    | (?P<pipe>\|)
    )""",
    re.X,
)


@dataclass
class Lit:
    value: Any


@dataclass
class Field:
    path: str  # ".A.B", "$x.A", "$", "."


@dataclass
class Ident:
    name: str


@dataclass
class Pipe:
    commands: list[list[Any]]  # each command: operands (Lit, Field, Ident, Pipe)


@dataclass
class Text:
    text: str


@dataclass
class Out:
    pipe: Pipe


@dataclass
class Assign:
    var: str
    pipe: Pipe
    declare: bool


@dataclass
class If:
    branches: list[tuple[Pipe, list[Any]]]
    otherwise: list[Any] = field(default_factory=list)


def _lex(source: str) -> list[tuple[str, str]]:
    """("text", s) and ("action", body) items, trim markers applied."""
    items: list[tuple[str, str]] = []
    pos, trim_next = 0, False
    for m in _ACTION.finditer(source):
        text = source[pos : m.start()]
        if trim_next:
            text = text.lstrip(" \t\r\n")
        if m.group(1):
            text = text.rstrip(" \t\r\n")
        items.append(("text", text))
        items.append(("action", m.group(2).strip()))
        trim_next = bool(m.group(3))
        pos = m.end()
    tail = source[pos:]
    items.append(("text", tail.lstrip(" \t\r\n") if trim_next else tail))
    if "{{" in "".join(t for k, t in items if k == "text"):
        raise TemplateError("unbalanced {{")
    return items


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos, expr = [], 0, expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise TemplateError(f"cannot parse {expr[pos:]!r}")
        kind = m.lastgroup
        assert kind is not None
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _parse_pipe(tokens: list[tuple[str, str]], pos: int = 0) -> tuple[Pipe, int]:
    commands: list[list[Any]] = [[]]
    while pos < len(tokens):
        kind, text = tokens[pos]
        pos += 1
        if kind == "rp":
            return Pipe(commands), pos - 1
        if kind == "pipe":
            commands.append([])
        elif kind == "lp":
            sub, pos = _parse_pipe(tokens, pos)
            if pos >= len(tokens) or tokens[pos][0] != "rp":
                raise TemplateError("unclosed (")
            pos += 1
            commands[-1].append(sub)
        elif kind == "str":
            commands[-1].append(Lit(json.loads(text)))
        elif kind == "raw":
            commands[-1].append(Lit(text[1:-1]))
        elif kind == "num":
            commands[-1].append(Lit(float(text) if "." in text else int(text)))
        elif kind == "field":
            commands[-1].append(Field(text))
        elif text in ("true", "false"):
            commands[-1].append(Lit(text == "true"))
        elif text == "nil":
            commands[-1].append(Lit(None))
        else:
            commands[-1].append(Ident(text))
    if any(not c for c in commands):
        raise TemplateError("empty command in pipeline")
    return Pipe(commands), pos


def parse_pipe(expr: str) -> Pipe:
    tokens = _tokens(expr)
    pipe, pos = _parse_pipe(tokens)
    if pos != len(tokens):
        raise TemplateError(f"unexpected ) in {expr!r}")
    return pipe


def parse(source: str, defines: dict[str, list[Any]]) -> list[Any]:
    """The template's nodes; ``define`` blocks go into ``defines``."""
    items = _lex(source)
    # Stack of open blocks: (kind, node, body list being filled).
    root: list[Any] = []
    stack: list[tuple[str, Any, list[Any]]] = [("root", None, root)]
    for kind, body in items:
        target = stack[-1][2]
        if kind == "text":
            if body:
                target.append(Text(body))
            continue
        if body.startswith("/*"):
            if not body.endswith("*/"):
                raise TemplateError("unclosed comment")
            continue
        word = body.split(None, 1)[0] if body else ""
        if word == "if":
            node = If([(parse_pipe(body[2:]), [])])
            target.append(node)
            stack.append(("if", node, node.branches[0][1]))
        elif word == "else":
            block, node, _ = stack[-1]
            if block != "if" or node.otherwise:
                raise TemplateError("else outside if")
            rest = body[4:].strip()
            if rest.startswith("if "):
                node.branches.append((parse_pipe(rest[3:]), []))
                stack[-1] = ("if", node, node.branches[-1][1])
            elif rest:
                raise TemplateError(f"unsupported else form {body!r}")
            else:
                stack[-1] = ("else", node, node.otherwise)
        elif word == "end":
            if len(stack) == 1:
                raise TemplateError("end without a block")
            stack.pop()
        elif word == "define":
            if len(stack) != 1:
                raise TemplateError("define inside a block")
            name = json.loads(body[6:].strip())
            body_nodes: list[Any] = []
            defines[name] = body_nodes
            stack.append(("define", name, body_nodes))
        elif word in ("range", "with", "block", "template", "break", "continue"):
            raise TemplateError(f"{word} is not supported by this renderer")
        else:
            m = _ASSIGN.match(body)
            if m:
                target.append(Assign(m.group(1), parse_pipe(m.group(3)), m.group(2) == ":="))
            else:
                target.append(Out(parse_pipe(body)))
    if len(stack) != 1:
        raise TemplateError(f"unclosed {stack[-1][0]}")
    return root


# ------------------------------------------------------------------------------------------
# Values and evaluation
# ------------------------------------------------------------------------------------------


def as_helm_values(value: Any) -> Any:
    """Numbers as helm reads them from YAML: float64."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, dict):
        return {k: as_helm_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_helm_values(v) for v in value]
    return value


def merge(base: Any, override: Any) -> Any:
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base.get(k), v)
        return out
    return copy.deepcopy(override)


def truth(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, (str, dict, list)):
        return len(value) > 0
    return True


def go_str(value: Any) -> str:
    """How Go (and helm, which prints nil as "") prints a value."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e21:
            if abs(value) >= 1e6:  # Go's shortest %v switches to 1e+06 here
                raise TemplateError(f"{value} would print in exponent form")
            return str(int(value))
        return repr(value)
    if isinstance(value, str):
        return value
    raise TemplateError(f"printing a {type(value).__name__} is not supported")


def kind_of(value: Any) -> str:
    if value is None:
        return "invalid"
    for kind, types in (
        ("bool", bool),
        ("int", int),
        ("float64", float),
        ("string", str),
        ("map", dict),
        ("slice", list),
    ):
        if isinstance(value, types):
            return kind
    return type(value).__name__


def _comparable(a: Any, b: Any) -> None:
    ka, kb = kind_of(a), kind_of(b)
    if ka != kb or ka not in ("int", "float64", "string", "bool"):
        raise TemplateError(f"incompatible types for comparison: {ka} and {kb}")


def _printf(fmt: str, *args: Any) -> str:
    out, i = [], 0
    parts = re.split(r"(%[sdvq%])", fmt)
    for part in parts:
        if not re.fullmatch(r"%[sdvq%]", part):
            if "%" in part:
                raise TemplateError(f"printf verb not supported in {fmt!r}")
            out.append(part)
            continue
        if part == "%%":
            out.append("%")
            continue
        if i >= len(args):
            raise TemplateError(f"printf {fmt!r}: missing argument")
        arg, i = args[i], i + 1
        if part == "%d":
            if kind_of(arg) != "int":
                raise TemplateError(f"printf %d of a {kind_of(arg)}")
            out.append(str(arg))
        elif part == "%s":
            if not isinstance(arg, str):
                raise TemplateError(f"printf %s of a {kind_of(arg)}")
            out.append(arg)
        elif part == "%q":
            out.append(json.dumps(go_str(arg)))
        else:
            out.append(go_str(arg))
    if i != len(args):
        raise TemplateError(f"printf {fmt!r}: extra arguments")
    return "".join(out)


def _to_int(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return 0  # sprig's int: what does not parse is 0
    raise TemplateError(f"int of a {kind_of(value)}")


def _plain(value: Any) -> Any:
    """A value for toYaml: whole floats back to ints (Go's YAML prints 15, not 15.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _to_yaml(value: Any) -> str:
    text: str = yaml.safe_dump(_plain(value), default_flow_style=False, sort_keys=True)
    return text.removesuffix("\n").removesuffix("\n...")


def _indent(n: Any, text: Any) -> str:
    pad = " " * _to_int(n)
    return pad + str(text).replace("\n", "\n" + pad)


def _eq(a: Any, *others: Any) -> bool:
    for b in others:
        _comparable(a, b)
        if a == b:
            return True
    return False


def _cmp(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def compare(a: Any, b: Any) -> bool:
        _comparable(a, b)
        return op(a, b)

    return compare


def _and(*args: Any) -> Any:
    for a in args:
        if not truth(a):
            return a
    return args[-1]


def _or(*args: Any) -> Any:
    for a in args:
        if truth(a):
            return a
    return args[-1]


def _required(message: str, value: Any) -> Any:
    if value is None or value == "":
        raise ChartFail(message)
    return value


def _fail(message: str) -> None:
    raise ChartFail(message)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quote": lambda *xs: " ".join(json.dumps(go_str(x)) for x in xs if x is not None),
    "indent": _indent,
    "nindent": lambda n, text: "\n" + _indent(n, text),
    "toYaml": _to_yaml,
    "sha256sum": lambda s: hashlib.sha256(str(s).encode()).hexdigest(),
    "fail": _fail,
    "required": _required,
    "default": lambda d, v=None: v if truth(v) else d,
    "printf": _printf,
    "int": _to_int,
    "kindIs": lambda kind, v: kind_of(v) == kind,
    "eq": _eq,
    "ne": lambda a, b: not _eq(a, b),
    "gt": _cmp(lambda a, b: a > b),
    "ge": _cmp(lambda a, b: a >= b),
    "lt": _cmp(lambda a, b: a < b),
    "le": _cmp(lambda a, b: a <= b),
    "and": _and,
    "or": _or,
    "not": lambda v: not truth(v),
    # sprig: contains SUBSTR STR, trunc N STR (negative: from the end), trimSuffix SUFFIX STR
    "contains": lambda sub, s: go_str(sub) in go_str(s),
    "trunc": lambda n, s: go_str(s)[: _to_int(n)] if _to_int(n) >= 0 else go_str(s)[_to_int(n) :],
    "trimSuffix": lambda suffix, s: go_str(s).removesuffix(go_str(suffix)),
}


class Files:
    def __init__(self, chart: Path) -> None:
        self.chart = chart

    def Get(self, path: str) -> str:  # helm's name
        return (self.chart / path).read_text()


_MISSING = object()


class Renderer:
    def __init__(self, chart: Path, values: dict[str, Any], *, name: str, namespace: str) -> None:
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        self.root: dict[str, Any] = {
            "Values": values,
            "Release": {"Name": name, "Namespace": namespace, "Service": "Helm"},
            "Chart": {"Name": meta["name"], "Version": meta["version"]},
            "Files": Files(chart),
        }
        self.defines: dict[str, list[Any]] = {}
        self.templates: dict[str, list[Any]] = {}
        for path in sorted((chart / "templates").iterdir()):
            nodes = parse(path.read_text(), self.defines)
            if not path.name.startswith("_"):
                self.templates[path.name] = nodes

    def render(self) -> dict[str, str]:
        return {name: self.execute(nodes, self.root) for name, nodes in self.templates.items()}

    def execute(self, nodes: list[Any], dot: Any) -> str:
        return self._run(nodes, dot, [{"$": dot}])

    def _run(self, nodes: list[Any], dot: Any, scopes: list[dict[str, Any]]) -> str:
        out: list[str] = []
        for node in nodes:
            if isinstance(node, Text):
                out.append(node.text)
            elif isinstance(node, Out):
                out.append(go_str(self._pipe(node.pipe, dot, scopes)))
            elif isinstance(node, Assign):
                value = self._pipe(node.pipe, dot, scopes)
                if node.declare:
                    scopes[-1][node.var] = value
                else:
                    for scope in reversed(scopes):
                        if node.var in scope:
                            scope[node.var] = value
                            break
                    else:
                        raise TemplateError(f"undefined variable {node.var}")
            elif isinstance(node, If):
                body = node.otherwise
                for cond, branch in node.branches:
                    if truth(self._pipe(cond, dot, scopes)):
                        body = branch
                        break
                out.append(self._run(body, dot, [*scopes, {}]))
            else:
                raise TemplateError(f"unknown node {node!r}")
        return "".join(out)

    def _pipe(self, pipe: Pipe, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        value: Any = _MISSING
        for command in pipe.commands:
            value = self._command(command, dot, scopes, value)
        return value

    def _command(
        self, command: list[Any], dot: Any, scopes: list[dict[str, Any]], piped: Any
    ) -> Any:
        head, rest = command[0], command[1:]
        args = [self._operand(a, dot, scopes) for a in rest]
        if piped is not _MISSING:
            args.append(piped)
        if isinstance(head, Ident):
            if head.name == "include":
                name, data = args
                if name not in self.defines:
                    raise TemplateError(f"no template {name!r}")
                return self.execute(self.defines[name], data)
            if head.name not in FUNCTIONS:
                raise TemplateError(f"function {head.name!r} is not supported")
            return FUNCTIONS[head.name](*args)
        value = self._operand(head, dot, scopes)
        if callable(value):
            return value(*args)
        if args:
            raise TemplateError(f"cannot give arguments to {head!r}")
        return value

    def _operand(self, operand: Any, dot: Any, scopes: list[dict[str, Any]]) -> Any:
        if isinstance(operand, Lit):
            return operand.value
        if isinstance(operand, Pipe):
            return self._pipe(operand, dot, scopes)
        if isinstance(operand, Ident):
            if operand.name not in FUNCTIONS:
                raise TemplateError(f"function {operand.name!r} is not supported")
            return FUNCTIONS[operand.name]()
        path = operand.path
        if path == ".":
            return dot
        if path.startswith("$"):
            var, _, rest = path.partition(".")
            for scope in reversed(scopes):
                if var in scope:
                    value = scope[var]
                    break
            else:
                raise TemplateError(f"undefined variable {var}")
            steps = rest.split(".") if rest else []
        else:
            value, steps = dot, path[1:].split(".")
        for step in steps:
            if value is None:
                raise TemplateError(f"nil pointer evaluating {path}")
            value = value.get(step) if isinstance(value, dict) else getattr(value, step)
        return value


class _StrictLoader(yaml.SafeLoader):
    """YAML with duplicate keys refused (the API server would keep one silently)."""


def _mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    dupes = {k for k in keys if keys.count(k) > 1}
    if dupes:
        raise TemplateError(f"duplicate keys {sorted(dupes)} at {node.start_mark}")
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def render_chart(
    chart: Path,
    overrides: dict[str, Any] | None = None,
    *,
    name: str = "muster",
    namespace: str = "muster-system",
) -> list[dict[str, Any]]:
    """The chart's objects for values.yaml plus ``overrides`` (as ``--set`` would give them)."""
    values = yaml.safe_load((chart / "values.yaml").read_text())
    values = as_helm_values(merge(values, overrides or {}))
    docs = Renderer(chart, values, name=name, namespace=namespace).render()
    objects: list[dict[str, Any]] = []
    for filename, text in docs.items():
        try:
            loaded = list(yaml.load_all(text, Loader=_StrictLoader))
        except yaml.YAMLError as exc:
            raise TemplateError(f"{filename} renders invalid YAML: {exc}\n{text}") from exc
        objects.extend(d for d in loaded if d)
    return objects
