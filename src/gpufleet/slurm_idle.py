"""The idle-GPU threshold and duration of gpufleet-slurm.rules.yml, set per site.

The rules file stays a static file with the defaults (5 %, 30m), so promtool checks and
tests it as shipped; the role substitutes the two parameters in the idle rules and the
threshold's own recording rule only (:func:`idle_rules`, filter gpufleet_slurm_idle_rules of
plugins/filter/gpufleet_filters.py). Each place must be found exactly once: a rule
edited elsewhere fails the play, not silently keeps the default.
"""

from __future__ import annotations

import re

DEFAULT_THRESHOLD = "5"
DEFAULT_DURATION = "30m"
DURATION = re.compile(r"^[1-9][0-9]*[smhd]$")

# (text as shipped, text with {threshold} and {duration}); each occurs once in the file.
_PLACES = (
    (
        "max_over_time(slurm_job_gpu:gpu_utilization_percent:max[30m]) < 5)",
        "max_over_time(slurm_job_gpu:gpu_utilization_percent:max[{duration}]) < {threshold})",
    ),
    (
        "            slurm_job_gpu:gpu_utilization_percent:max < 5\n          )\n"
        "        for: 30m\n",
        "            slurm_job_gpu:gpu_utilization_percent:max < {threshold}\n          )\n"
        "        for: {duration}\n",
    ),
    ("below 5 % utilization for 30 minutes", "below {threshold} % utilization for {words}"),
    (
        "record: gpufleet:slurm_idle_gpu_threshold:percent\n        expr: vector(5)\n",
        "record: gpufleet:slurm_idle_gpu_threshold:percent\n        expr: vector({threshold})\n",
    ),
)


def _threshold(value: object) -> str:
    number = float(str(value))
    if not 0 < number <= 100:
        raise ValueError(f"idle GPU threshold must be a percentage in (0, 100], got {value!r}")
    return f"{number:g}"


def _words(duration: str) -> str:
    count, unit = int(duration[:-1]), duration[-1]
    name = {"s": "second", "m": "minute", "h": "hour", "d": "day"}[unit]
    return f"{count} {name}{'' if count == 1 else 's'}"


def idle_rules(text: str, threshold: object, duration: object) -> str:
    """The Slurm rules text with the idle threshold (percent) and duration substituted."""
    duration = str(duration)
    if not DURATION.match(duration):
        raise ValueError(f"idle GPU duration must be like 30m or 2h, got {duration!r}")
    values = {"threshold": _threshold(threshold), "duration": duration, "words": _words(duration)}
    if values["threshold"] == DEFAULT_THRESHOLD and duration == DEFAULT_DURATION:
        return text
    for shipped, wanted in _PLACES:
        count = text.count(shipped)
        if count != 1:
            raise ValueError(f"gpufleet-slurm.rules.yml: {shipped!r} found {count} times, not once")
        text = text.replace(shipped, wanted.format(**values))
    return text
