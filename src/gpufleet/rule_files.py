"""The shipped rule files as an instance gets them (filter gpufleet_rule_files).

Each file of roles/prometheus/files/rules passes, in this order, through the site's
idle-GPU threshold and duration (the Slurm file only, gpufleet.slurm_idle), its `for:`
durations per alert (gpufleet.alert_for) and the node list's custom labels
(gpufleet.rule_labels). With the defaults, each comes back as shipped.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpufleet.alert_for import set_durations
from gpufleet.rule_labels import with_node_labels
from gpufleet.slurm_idle import idle_rules

SLURM_RULES = "gpufleet-slurm.rules.yml"


def rule_file(
    name: str,
    text: str,
    idle_threshold: object,
    idle_duration: object,
    alert_for: object,
    node_labels: object,
) -> str:
    """One rule file's text as the instance gets it."""
    if name == SLURM_RULES:
        text = idle_rules(text, idle_threshold, idle_duration)
    return with_node_labels(set_durations(text, alert_for, name), node_labels, name)


def rule_files(
    directory: str,
    names: Iterable[str],
    texts: Iterable[str],
    idle_threshold: object,
    idle_duration: object,
    alert_for: object,
    node_labels: object,
) -> dict[str, str]:
    """{<directory>/<name>: text} of the named files, texts given in the same order."""
    names, texts = list(names), [str(text) for text in texts]
    if len(names) != len(texts):
        raise ValueError(f"{len(names)} rule file names for {len(texts)} texts")
    return {
        f"{directory}/{name}": rule_file(
            name, text, idle_threshold, idle_duration, alert_for, node_labels
        )
        for name, text in zip(names, texts, strict=True)
    }
