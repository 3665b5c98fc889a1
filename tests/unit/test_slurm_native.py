"""The check before Prometheus scrapes slurmctld's own metrics (gpufleet.slurm_native)."""

from __future__ import annotations

import random

import pytest

from gpufleet.slurm_native import MAX_CONFIG_BYTES, native_metrics_problem, parse_show_config

# The lines of `scontrol show config` that decide it, as Slurm 26.05.5 prints them.
SHOW_CONFIG_26_05 = """\
Configuration data as of 2026-12-07T03:06:56
AccountingStorageType   = (null)
MetricsAuthUsers        = (null)
MetricsParameters       = (null)
MetricsType             = metrics/openmetrics
PrivateData             = none
SLURM_VERSION           = 26.05.5
SlurmctldPort           = 6817
"""


def problem(text: str = SHOW_CONFIG_26_05, token: bool = False, **changes: str) -> str:
    config = parse_show_config(text)
    config.update(changes)
    return native_metrics_problem(config, prometheus_has_token=token)


def test_an_open_openmetrics_controller_passes() -> None:
    assert problem() == ""
    assert parse_show_config(SHOW_CONFIG_26_05)["SlurmctldPort"] == "6817"


@pytest.mark.parametrize(
    ("changes", "token", "says"),
    [
        ({"SLURM_VERSION": "24.11.5"}, False, "Slurm 24.11.5 serves no metrics endpoints"),
        ({"SLURM_VERSION": "25.05.3"}, True, "25.11 and later do"),
        ({"MetricsType": "(null)"}, False, "MetricsType is not set"),
        ({"MetricsType": "metrics/other"}, True, "MetricsType is metrics/other"),
        # 25.11: PrivateData turns the endpoints off, a token cannot help.
        ({"SLURM_VERSION": "25.11.2", "PrivateData": "jobs"}, True, "turns slurmctld 25.11.2"),
        # 26.05: SlurmUser and root with a JWT.
        ({"PrivateData": "jobs,usage"}, False, "restricts the metrics endpoints"),
        ({"MetricsAuthUsers": "prometheus"}, False, "MetricsAuthUsers=prometheus"),
        ({"SLURM_VERSION": ""}, False, "names no Slurm release (SLURM_VERSION=missing)"),
        ({"SLURM_VERSION": "twenty"}, False, "names no Slurm release"),
    ],
)
def test_each_refusal_says_why_in_one_line(changes: dict, token: bool, says: str) -> None:
    said = problem(token=token, **changes)
    assert says in said
    assert "\n" not in said and len(said) < 400


@pytest.mark.parametrize(
    "changes",
    [
        {"PrivateData": "jobs", "MetricsParameters": "ignore_private_data"},
        {"PrivateData": "jobs", "MetricsParameters": "Ignore_Private_Data,other"},
        {"PrivateData": "none"},
    ],
)
def test_private_data_that_slurm_ignores_passes(changes: dict) -> None:
    assert problem(**changes) == ""


def test_a_token_for_prometheus_lets_a_restricted_endpoint_pass() -> None:
    assert problem(token=True, PrivateData="jobs") == ""
    assert problem(token=True, MetricsAuthUsers="prometheus") == ""


def test_a_quoted_value_is_bounded_and_printable() -> None:
    said = problem(PrivateData="jobs\x1b[2J" + "x" * 500)
    assert "\x1b" not in said and len(said) < 400


def test_any_text_gives_an_answer_or_one_bounded_error() -> None:
    rng = random.Random(2605)
    alphabet = "= \t\nabcMetricsTypePrivateData/.0123456789\x00\x1b"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 400)))
        assert isinstance(problem(text), str)
    with pytest.raises(ValueError, match="over"):
        parse_show_config("x" * (MAX_CONFIG_BYTES + 1))
