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

A file that Ansible reads as well (role defaults, argument specs) is read with
:func:`load_as_ansible_reads_it`: besides the above, a scalar that Ansible's YAML 1.1 would
type differently is an error naming its key, so gpufleet and the roles agree on every value.

Every failure is a :class:`YamlProblem` (``line N`` and the problem, on one line).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    _Base = yaml.SafeLoader
else:  # libyaml's loader where PyYAML was built with it: the same results, faster
    _Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
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


class StrictLoader(_Base):
    """A safe loader that refuses duplicate keys and keeps YAML 1.1 coercions as text."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        refuse_duplicate_keys(self, node)
        return super().construct_mapping(node, deep=deep)


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


# Only the strict implicit types: none of YAML 1.1's coercions (yes, on, 0o17, 1_000).
StrictLoader.yaml_implicit_resolvers = {}
add_resolvers(StrictLoader)


def _tag_as_text(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    raise yaml.constructor.ConstructorError(
        None, None, f"unknown node {type(node).__name__}", node.start_mark
    )


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


def load_as_ansible_reads_it(text: str) -> Any:
    """The one document in ``text``, strictly, for a file that Ansible reads too (role
    defaults, argument specs). Ansible reads YAML 1.1: a scalar the two readings type
    differently (``yes``, ``010``, ``10:30``, ``2024-01-01``, a key like ``on``) is a
    :class:`YamlProblem` naming its key, so gpufleet and the roles never see two values."""
    strict = load(text)
    try:
        lenient = yaml.load(text, Loader=_Base)  # a safe loader: YAML 1.1 as Ansible's
    except (yaml.YAMLError, ValueError, OverflowError, TypeError, RecursionError):
        return strict  # a tag only Ansible knows (!vault): nothing to compare
    try:
        found = _first_difference(strict, lenient, "", set())
    except RecursionError:
        raise YamlProblem("", "invalid YAML: nested too deeply") from None
    if found is not None:
        path, problem = found
        raise YamlProblem("", f"{one_line(path or 'the document')[:200]}: {problem}")
    return strict


def _same(strict: Any, lenient: Any) -> bool:
    if type(strict) is not type(lenient):
        return False
    return bool(strict == lenient) or (strict != strict and lenient != lenient)  # NaN


def _first_difference(
    strict: Any, lenient: Any, path: str, compared: set[tuple[int, int]]
) -> tuple[str, str] | None:
    """(key path, problem) of the first key or value the two readings type differently.
    A pair of containers is compared once (aliases share them), so the walk costs the
    document's nodes, not its expansion."""
    if isinstance(strict, (dict, list)):
        if (id(strict), id(lenient)) in compared:
            return None
        compared.add((id(strict), id(lenient)))
    if isinstance(strict, dict) and isinstance(lenient, dict):
        theirs = list(lenient)
        for index, key in enumerate(strict):
            where = f"{path}.{key}" if path else str(key)
            if index >= len(theirs):
                return where, f"{_shown(key)} is the same key as one before it to YAML 1.1"
            if not _same(key, theirs[index]):
                return where, _coerced(key, theirs[index])
        for key, value in strict.items():
            where = f"{path}.{key}" if path else str(key)
            found = _first_difference(value, lenient[key], where, compared)
            if found is not None:
                return found
        return None
    if isinstance(strict, list) and isinstance(lenient, list) and len(strict) == len(lenient):
        for index, (mine, theirs_item) in enumerate(zip(strict, lenient, strict=True)):
            found = _first_difference(mine, theirs_item, f"{path}[{index}]", compared)
            if found is not None:
                return found
        return None
    return None if _same(strict, lenient) else (path, _coerced(strict, lenient))


def _shown(value: Any) -> str:
    return one_line(repr(value))[:80]


def _coerced(written: Any, typed: Any) -> str:
    return (
        f"{_shown(written)} is {_shown(typed)} to YAML 1.1 (Ansible's reading): quote it "
        "if it is text, else write it as YAML 1.2 does (true, 8, 8.0)"
    )
