"""The node list's custom labels (``labels:``) on every node-level rule and alert.

Every scrape target of a host carries the host's ``labels:`` (inventory.target_labels),
but an aggregation keeps only the labels it names: ``max by (cluster, rack, node)``
would drop ``site``. The rule files stay static files as shipped (promtool's tests in
tests/rules test them so); the prometheus role passes each one through
:func:`with_node_labels` (filter gpufleet_rule_labels, plugins/filter/gpufleet_filters.py)
with the label names the inventory plugin publishes (gpufleet_node_label_names, the role's
prometheus_node_labels), and the names are added, in order, to

- every ``by (...)`` list that names ``node``: a node-level (or finer) aggregation. A
  custom label is an attribute of the node, one value per node, so it never splits such
  a group; it would split ``by (cluster)`` or a rack, partition or GPU-model rollup into
  one series per value, which a cluster-wide sum must not do, so those are left alone
  (the global tier reads only such rollups and node: series, which carry the labels
  already);
- every ``group_left (...)`` / ``group_right (...)`` list that names ``rack``: a join
  that copies the node's attributes onto series of another target (the Slurm exporter
  on the controller, whose own target labels are the controller's), so the result
  carries the node's values, as it carries the node's rack.

``on (...)`` and ``ignoring (...)`` lists need nothing (the labels are the node's, so
matching on ``node`` already pairs the right series), nor ``without``. Only the ``expr``
of each rule changes, in place (the YAML parser locates each one): every other byte of
the file, comments and annotations included, stays as shipped, and the result is
checked to load as the shipped rules with just those expressions rewritten.

Pure: no Ansible imports, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import cast

import yaml

from gpufleet.nodelist import RESERVED_LABELS

VARIABLE = "prometheus_node_labels"
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# `by (...)`, `group_left (...)`, `group_right (...)` and their label list (no nesting:
# a label list holds names only).
_GROUPING = re.compile(r"(?<![A-Za-z0-9_:])(by|group_left|group_right)(\s*)\(([^()]*)\)")
# The label a list must name to get the custom labels, per keyword.
_ANCHOR = {"by": "node", "group_left": "rack", "group_right": "rack"}


def name_problems(names: object) -> list[str]:
    """What is wrong with names as the custom label names ([] when nothing)."""
    if names is None:
        return []
    if isinstance(names, str | bytes) or not isinstance(names, Sequence):
        return [f"{VARIABLE} must be a list of label names, got {type(names).__name__}"]
    problems: list[str] = []
    seen: set[str] = set()
    for name in names:
        if not isinstance(name, str) or not LABEL_NAME.fullmatch(name):
            problems.append(
                f"{VARIABLE}: {name!r} is not a Prometheus label name "
                "(must match [a-zA-Z_][a-zA-Z0-9_]*)"
            )
        elif name.startswith("__"):
            problems.append(f"{VARIABLE}: {name!r}: names starting with '__' are Prometheus'")
        elif name in RESERVED_LABELS:
            problems.append(
                f"{VARIABLE}: {name!r} is a label gpufleet or Prometheus sets, or gpufleet's "
                "rules use (nodelist.RESERVED_LABELS)"
            )
        elif name in seen:
            problems.append(f"{VARIABLE}: {name!r} is given twice")
        seen.add(str(name))
    return problems


def _names(names: object) -> list[str]:
    problems = name_problems(names)
    if problems:
        raise ValueError("; ".join(problems))
    return [str(name) for name in cast(Sequence[object], names or [])]


def _items(inner: str) -> list[str]:
    return [item.strip() for item in inner.split(",") if item.strip()]


def rewrite_expr(expr: str, names: Sequence[str]) -> str:
    """The PromQL expression with names added to its node-level label lists."""

    def edit(match: re.Match[str]) -> str:
        keyword, space, inner = match.groups()
        items = _items(inner)
        missing = [name for name in names if name not in items]
        if _ANCHOR[keyword] not in items or not missing:
            return match.group(0)
        body = inner.rstrip()
        separator = " " if body.endswith(",") else ", "
        return f"{keyword}{space}({body}{separator}{', '.join(missing)}{inner[len(body) :]})"

    return _GROUPING.sub(edit, expr)


def _mapping(node: yaml.Node, where: str) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise ValueError(f"{where} is not a mapping")
    out: dict[str, yaml.Node] = {}
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            raise ValueError(f"{where}: a key that is not a plain value")
        if key.value in out:
            raise ValueError(f"{where}: key {key.value!r} given twice")
        out[key.value] = value
    return out


def _sequence(node: yaml.Node, where: str) -> list[yaml.Node]:
    if not isinstance(node, yaml.SequenceNode):
        raise ValueError(f"{where} is not a list")
    return list(node.value)


def _expr_nodes(text: str, filename: str) -> list[yaml.ScalarNode]:
    """The `expr` value of every rule of a Prometheus rule file, in file order."""
    try:
        document = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as error:
        raise ValueError(f"{filename}: not YAML: {error}".replace("\n", " ")) from error
    if document is None:
        raise ValueError(f"{filename}: empty")
    found: list[yaml.ScalarNode] = []
    groups = _mapping(document, filename).get("groups")
    if groups is None:
        raise ValueError(f"{filename}: no groups")
    for g, group in enumerate(_sequence(groups, f"{filename}: groups")):
        rules = _mapping(group, f"{filename}: group {g}").get("rules")
        for r, rule in enumerate(_sequence(rules, f"{filename}: group {g} rules") if rules else []):
            where = f"{filename}: group {g} rule {r}"
            expr = _mapping(rule, where).get("expr")
            if not isinstance(expr, yaml.ScalarNode):
                raise ValueError(f"{where}: no expr, or one that is not a string")
            found.append(expr)
    return found


def _check(shipped: str, text: str, names: Sequence[str], filename: str) -> None:
    """Fails unless text loads as the shipped rules with just their expressions rewritten."""
    expected = yaml.safe_load(shipped)
    for group in expected["groups"]:
        for rule in group.get("rules") or []:
            rule["expr"] = rewrite_expr(str(rule["expr"]), names)
    if yaml.safe_load(text) != expected:
        raise ValueError(f"{filename}: adding {VARIABLE} changed more than the expressions")


def with_node_labels(text: str, names: object, filename: str = "rules") -> str:
    """The rule file text with names added to every node-level label list of its rules.

    No names: the text as given, byte for byte. Applying it twice changes nothing more.
    """
    wanted = _names(names)
    if not wanted:
        return text
    out = text
    for node in reversed(_expr_nodes(text, filename)):
        start, end = node.start_mark.index, node.end_mark.index
        out = out[:start] + rewrite_expr(out[start:end], wanted) + out[end:]
    _check(text, out, wanted, filename)
    return out
