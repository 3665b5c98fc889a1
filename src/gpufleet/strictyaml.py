"""The one YAML loader for every configuration gpufleet reads (node list, shard lock).

Strict where PyYAML's ``safe_load`` is not:

* a mapping that repeats a key, at any depth, is an error naming the key and both lines
  (PyYAML keeps the last one silently: a second ``nodes:`` dropped hosts);
* only YAML 1.2 core scalars are typed: ``true``/``false``, ``null``/``~``, decimal
  integers written without a sign or leading zero (so ``str(value)`` is the text written)
  and decimal floats. Every YAML 1.1 coercion (``010`` octal, ``0x1F``, ``10:30``
  sexagesimal, ``1_000``, ``yes``/``on``/``off``, timestamps like ``2024-01-01``) stays the
  string written, so an identifier is never changed on the way in;
* Ansible's own tags (``!vault``, ``!unsafe``) load as their text: the plugin takes those
  values from Ansible's loader, gpufleet never interprets them.

Every failure is a :class:`YamlProblem` (``line N`` and the problem, on one line).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import yaml

_Base: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_LINE_BREAKING_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")

# YAML 1.2 core schema, narrowed so that an integer's text is str(int(text)).
_IMPLICIT: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), "tTfF"),
    ("tag:yaml.org,2002:int", re.compile(r"^(?:0|-?[1-9][0-9]*)$"), "-0123456789"),
    (
        "tag:yaml.org,2002:float",
        re.compile(
            r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+(?:[eE][-+]?[0-9]+)?|[eE][-+]?[0-9]+)$"
            r"|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$"
        ),
        "-+.0123456789",
    ),
    ("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), "~nN "),
    ("tag:yaml.org,2002:merge", re.compile(r"^<<$"), "<"),
)


def one_line(text: str) -> str:
    """``text`` with control and line-breaking characters escaped."""
    return _LINE_BREAKING_RE.sub(lambda match: repr(match.group())[1:-1], text)


class YamlProblem(ValueError):
    """Why a YAML text could not be loaded: ``where`` ("line N" or "") and ``problem``."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.where = where
        self.problem = problem


class StrictLoader(_Base):  # type: ignore[misc]
    """A safe loader that refuses duplicate keys and keeps YAML 1.1 coercions as text."""

    yaml_implicit_resolvers: ClassVar[dict[str | None, list[tuple[str, re.Pattern[str]]]]] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


def refuse_duplicate_keys(loader: yaml.SafeLoader, node: yaml.MappingNode) -> None:
    """Raise for the first key that ``node`` (before merging ``<<`` keys) writes twice."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: the base constructor names it
            continue
        seen[key] = line
        if first is not None:
            shown = one_line(key if isinstance(key, str) else repr(key))[:80]
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"duplicate key {shown!r} (first at line {first}; YAML would keep only the last)",
                key_node.start_mark,
            )


def add_resolvers(cls: Any) -> None:
    """Teach a loader or dumper class the strict implicit types (a dumper that knows them
    besides YAML 1.1's quotes every string either would type)."""
    for tag, pattern, first in _IMPLICIT:
        # " " stands for the empty scalar (a bare ``key:``), which PyYAML looks up as "".
        cls.add_implicit_resolver(tag, pattern, [char.strip() for char in first])


add_resolvers(StrictLoader)


def _tag_as_text(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)


for _prefix in ("!vault", "!unsafe"):
    StrictLoader.add_multi_constructor(_prefix, _tag_as_text)


def load(text: str) -> Any:
    """The one document in ``text``, strictly; every failure a :class:`YamlProblem`."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # a safe loader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or (str(err).splitlines() or ["?"])[0]
        raise YamlProblem(where, f"invalid YAML: {one_line(problem)}") from None
    except RecursionError:
        raise YamlProblem("", "invalid YAML: nested too deeply") from None
    except (ValueError, OverflowError, TypeError) as err:
        raise YamlProblem("", f"invalid YAML: {one_line(str(err))[:200]}") from None
