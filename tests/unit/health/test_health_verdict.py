"""The collector's health verdict (gpu_collector.verdict) and the XID catalog."""

from __future__ import annotations

import json

import pytest
from health_helpers import NOW, gpu_sample, info

from gpufleet_node.gpu_collector import verdict as vd
from gpufleet_node.gpu_collector.model import Sample
from gpufleet_node.gpu_collector.xidcatalog import CATALOG, CRITICAL_XIDS, WARNING_XIDS
from gpufleet_node.gpu_health import decide


def state_of(checks: list[vd.Check], check: str, gpu: str = "0") -> tuple[str, str]:
    found = [(c.state, c.reason) for c in checks if c.check == check and c.gpu == gpu]
    assert len(found) == 1, (check, gpu, checks)
    return found[0]


def gpu_checks(*samples: Sample, gpu: str = "0") -> list[vd.Check]:
    return vd.gpu_state_checks([info(gpu), *samples], gpu)


# --- per-GPU checks read from nvidia-smi's answer -----------------------------------


def test_every_gpu_check_is_ok_when_nothing_is_reported():
    checks = gpu_checks()
    assert [c.check for c in checks] == list(vd.GPU_CHECKS[1:])
    assert all((c.state, c.reason, c.gpu) == ("ok", "", "0") for c in checks)


@pytest.mark.parametrize(
    ("volatile", "aggregate", "expected"),
    [
        (0, 0, ("ok", "")),
        (0, 7, ("ok", "")),  # an old error the driver remembers: not a fault now
        (1, 1, ("fail", "1 uncorrectable ECC errors")),
        (3, 9, ("fail", "3 uncorrectable ECC errors")),
    ],
)
def test_ecc_uncorrectable_counts_the_volatile_counter(volatile, aggregate, expected):
    checks = gpu_checks(
        gpu_sample("ecc_uncorrected_errors_total", "0", volatile, scope="volatile"),
        gpu_sample("ecc_uncorrected_errors_total", "0", aggregate, scope="aggregate"),
    )
    assert state_of(checks, "ecc_uncorrectable") == expected


@pytest.mark.parametrize(
    ("name", "check", "words"),
    [
        ("remapped_rows_failure", "row_remap_failure", ("row remap failed", "replace the GPU")),
        ("remapped_rows_pending", "row_remap_pending", ("row remap pending", "reset the GPU")),
    ],
)
def test_row_remap_flags(name, check, words):
    assert state_of(gpu_checks(gpu_sample(name, "0", 0.0)), check) == ("ok", "")
    state, reason = state_of(gpu_checks(gpu_sample(name, "0", 1.0)), check)
    assert state == "fail"
    assert all(word in reason for word in words), reason


@pytest.mark.parametrize(
    ("single", "double", "pending", "expected", "words"),
    [
        (0, 0, 0, "ok", ()),
        (60, 3, 0, "ok", ()),
        (60, 3, 1, "warn", ("page retirement pending", "reboot")),
        (60, 4, 0, "fail", ("64 retired pages", "limit")),
        (64, 0, 1, "fail", ("64 retired pages", "limit")),  # fail outranks warn
        (0, 70, 0, "fail", ("70 retired pages", "limit")),
    ],
)
def test_retired_pages(single, double, pending, expected, words):
    checks = gpu_checks(
        gpu_sample("retired_pages", "0", single, cause="single_bit_ecc"),
        gpu_sample("retired_pages", "0", double, cause="double_bit_ecc"),
        gpu_sample("retired_pages_pending", "0", pending),
    )
    state, reason = state_of(checks, "retired_pages")
    assert state == expected
    assert all(word in reason for word in words), reason
    assert bool(reason) == (state != "ok")


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        (0, ("ok", "")),
        (1, ("fail", "driver asks for GPU reset")),
        (2, ("fail", "driver asks for node reboot")),
        (3, ("fail", "driver asks for drain P2P")),
        (4, ("fail", "driver asks for drain and reset")),
        (9, ("ok", "")),  # a code the catalog does not know
    ],
)
def test_recovery_action(action, expected):
    checks = gpu_checks(gpu_sample("recovery_action", "0", float(action)))
    assert state_of(checks, "recovery_action") == expected


def test_a_gpu_check_reads_only_its_own_gpu():
    samples = [
        info("0"),
        info("1"),
        gpu_sample("remapped_rows_pending", "1", 1.0),
        gpu_sample("ecc_uncorrected_errors_total", "1", 2.0, scope="volatile"),
    ]
    assert {c.state for c in vd.gpu_state_checks(samples, "0")} == {"ok"}
    assert state_of(vd.gpu_state_checks(samples, "1"), "row_remap_pending", "1")[0] == "fail"


def test_a_nan_reading_is_not_a_failure():
    checks = gpu_checks(
        gpu_sample("ecc_uncorrected_errors_total", "0", float("nan"), scope="volatile"),
        gpu_sample("retired_pages", "0", float("nan"), cause="single_bit_ecc"),
    )
    assert {c.state for c in checks} == {"ok"}


# --- XIDs against the baseline ------------------------------------------------------


def test_new_xids_count_from_the_baseline():
    counts = {"0000:18:00|79": 3, "0000:2a:00|13": 2, "0000:3a:00|48": 1}
    baseline = {"0000:18:00|79": 1, "0000:2a:00|13": 2, "0000:5d:00|79": 4}
    assert vd.new_xids(counts, baseline) == {"0000:18:00|79": 2, "0000:3a:00|48": 1}
    assert vd.new_xids(counts, counts) == {}
    assert vd.new_xids({}, baseline) == {}


def test_a_counter_below_its_baseline_counts_from_zero():
    """The collector's XID state was lost: its counters start again under the baseline."""
    assert vd.new_xids({"0000:18:00|79": 2}, {"0000:18:00|79": 5}) == {"0000:18:00|79": 2}
    assert vd.new_xids({"0000:18:00|79": 0}, {"0000:18:00|79": 5}) == {}


PCI_MAP = {f"0000:{bus}:00": [str(i), f"GPU-{i}"] for i, bus in enumerate(("18", "2a", "3a"))}


@pytest.mark.parametrize(
    ("new", "expected"),
    [
        ({}, ("ok", "")),
        ({"0000:2a:00|13": 5}, ("ok", "")),  # the application's own fault
        ({"0000:2a:00|43": 1}, ("ok", "")),
        ({"0000:2a:00|63": 1}, ("warn", "xid63 (row remap or page retirement recorded)")),
        ({"0000:2a:00|94": 1}, ("warn", "xid94 (contained memory error)")),
        ({"0000:2a:00|79": 1}, ("fail", "xid79 (fallen off the bus)")),
        ({"0000:2a:00|63": 4, "0000:2a:00|48": 1}, ("fail", "xid48 (double bit ECC error)")),
        ({"0000:2a:00|147": 1}, ("fail", "xid147 (NVLink5 unit error)")),
    ],
)
def test_xid_check_takes_the_worst_tier(new, expected):
    checks = vd.xid_checks(["0", "1", "2"], new, PCI_MAP)
    assert [(c.check, c.gpu) for c in checks] == [("xid", "0"), ("xid", "1"), ("xid", "2")]
    assert state_of(checks, "xid", "1") == expected
    assert state_of(checks, "xid", "0") == ("ok", "")


def test_xids_of_an_unknown_pci_address_go_to_the_node():
    checks = vd.xid_checks(["0"], {"0000:99:00|79": 1}, PCI_MAP)
    assert checks[-1] == vd.Check("xid", "", "fail", "xid79 (fallen off the bus)")
    assert state_of(checks, "xid", "0") == ("ok", "")
    # no node row when every XID has its GPU
    assert [c.gpu for c in vd.xid_checks(["0"], {"0000:18:00|48": 1}, PCI_MAP)] == ["0"]


def test_xid_of_a_gpu_that_fell_off_the_bus_names_that_gpu():
    """A GPU the collector saw before (in pci_map) that nvidia-smi no longer lists keeps
    its own xid check: the drain reason says "xid79 gpu2", not "xid79 node"."""
    checks = vd.xid_checks(["0", "1"], {"0000:3a:00|79": 1}, PCI_MAP)
    assert checks == [
        vd.Check("xid", "0", "ok", ""),
        vd.Check("xid", "1", "ok", ""),
        vd.Check("xid", "2", "fail", "xid79 (fallen off the bus)"),
    ]


def test_a_gone_gpu_without_new_xids_gets_no_check():
    assert [c.gpu for c in vd.xid_checks(["0", "1"], {}, PCI_MAP)] == ["0", "1"]
    # an XID that is no fault (13) on a gone GPU: its check is ok, the node has none
    checks = vd.xid_checks(["0"], {"0000:3a:00|13": 1}, PCI_MAP)
    assert {c.state for c in checks} == {"ok"} and "" not in {c.gpu for c in checks}


def test_gone_gpus_and_unknown_addresses_together():
    new = {"0000:3a:00|79": 1, "0000:2a:00|63": 1, "0000:99:00|48": 1}
    checks = vd.xid_checks(["0"], new, PCI_MAP)
    assert [(c.gpu, c.state) for c in checks] == [
        ("0", "ok"),
        ("1", "warn"),
        ("2", "fail"),
        ("", "fail"),  # an address no GPU ever had: the node's
    ]


# --- node checks and the whole verdict ----------------------------------------------


@pytest.mark.parametrize(
    ("error", "found", "expected", "states"),
    [
        (None, 8, 8, ("ok", "ok")),
        (None, 9, 8, ("ok", "ok")),
        (None, 7, 8, ("ok", "fail")),
        (None, 0, 8, ("ok", "fail")),
        (None, 3, None, ("ok", "ok")),
        (None, 3, 0, ("ok", "ok")),
        ("timeout", None, 8, ("unknown", "unknown")),
        ("timeout", None, None, ("unknown", "ok")),
    ],
)
def test_node_checks(error, found, expected, states):
    collector, count = vd.node_checks(error, found, expected)
    assert (collector.check, count.check) == ("collector", "gpu_count")
    assert (collector.state, count.state) == states
    assert collector.gpu == count.gpu == ""
    if error:
        assert collector.reason == f"collector failed: {error}"
    if count.state == "fail":
        assert count.reason == f"{found} of {expected} GPUs present"


def test_verdict_checks_of_a_healthy_node():
    samples = [info(g) for g in ("10", "2", "0", "1")]
    checks = vd.verdict_checks(samples, None, 4, {}, {}, {})
    assert [c.gpu for c in checks if c.check == "xid"] == ["0", "1", "2", "10"]
    assert len(checks) == 2 + 4 + 4 * 5
    assert vd.worst_state(checks) == "ok"


def test_verdict_checks_without_an_xid_source_has_no_xid_check():
    checks = vd.verdict_checks([info("0")], None, 1)
    assert "xid" not in {c.check for c in checks}


def test_a_failed_cycle_is_unknown_but_xids_still_count():
    """No GPU reading this cycle: a GPU the collector saw before keeps its xid check."""
    checks = vd.verdict_checks([], "not_found", 8, {"0000:18:00|79": 1}, {}, PCI_MAP)
    assert [(c.check, c.gpu, c.state) for c in checks] == [
        ("collector", "", "unknown"),
        ("gpu_count", "", "unknown"),
        ("xid", "0", "fail"),
    ]
    assert vd.worst_state(checks) == "fail"
    assert vd.worst_state(checks[:2]) == "unknown"


def test_a_failed_cycle_puts_xids_of_an_unknown_address_on_the_node():
    checks = vd.verdict_checks([], "not_found", 8, {"0000:99:00|79": 1}, {}, PCI_MAP)
    assert [(c.check, c.gpu, c.state) for c in checks] == [
        ("collector", "", "unknown"),
        ("gpu_count", "", "unknown"),
        ("xid", "", "fail"),
    ]


@pytest.mark.parametrize(
    ("states", "worst"),
    [
        ((), "ok"),
        (("ok", "ok"), "ok"),
        (("ok", "warn"), "warn"),
        (("warn", "unknown", "ok"), "unknown"),
        (("unknown", "fail", "warn"), "fail"),
    ],
)
def test_worst_state(states, worst):
    checks = [vd.Check("x", str(i), s, "") for i, s in enumerate(states)]
    assert vd.worst_state(checks) == worst


def test_verdict_samples_are_a_series_per_check_not_ok_and_a_one_hot_verdict():
    checks = [
        vd.Check("collector", "", "ok", ""),
        vd.Check("xid", "0", "warn", "xid63 (r)"),
        vd.Check("gpu_count", "", "unknown", ""),
    ]
    samples = vd.verdict_samples(checks)
    assert [s for s in samples if s.name == "health_check"] == [
        Sample(
            "health_check",
            (("gpu", "0"), ("check", "xid"), ("state", "warn"), ("reason", "xid63 (r)")),
            1.0,
        ),
        Sample(
            "health_check",
            (("gpu", ""), ("check", "gpu_count"), ("state", "unknown"), ("reason", "")),
            1.0,
        ),
    ]
    verdict = {dict(s.labels)["state"]: s.value for s in samples if s.name == "health_verdict"}
    assert verdict == {"ok": 0.0, "warn": 0.0, "fail": 0.0, "unknown": 1.0}
    healthy = vd.verdict_samples(checks[:1])
    assert {dict(s.labels)["state"]: s.value for s in healthy} == {
        "ok": 1.0,
        "warn": 0.0,
        "fail": 0.0,
        "unknown": 0.0,
    }


def test_verdict_document_round_trips_through_the_health_program():
    checks = [
        vd.Check("collector", "", "ok", ""),
        vd.Check("xid", "0", "ok", ""),
        vd.Check("xid", "1", "fail", "xid79 (fallen off the bus)"),
        vd.Check("ecc_uncorrectable", "1", "fail", "x" * 500),
    ]
    jobs = {"0": ["11"], "1": ["12", "13"]}
    text = vd.verdict_document(checks, NOW + 0.12345, "boot-9", jobs)
    data = json.loads(text)
    assert data["version"] == vd.VERDICT_VERSION == 1
    assert (data["time"], data["boot_id"], data["verdict"]) == (NOW + 0.123, "boot-9", "fail")
    assert data["checks"][1]["jobs"] == []  # only a check that is not ok names jobs
    assert data["checks"][2] == {
        "check": "xid",
        "gpu": "1",
        "state": "fail",
        "reason": "xid79 (fallen off the bus)",
        "jobs": ["12", "13"],
    }
    assert len(data["checks"][3]["reason"]) == vd.REASON_MAX_CHARS
    verdict = decide.parse_verdict(text, NOW + 1, 60)
    assert verdict.state == "fail"
    assert [(f.check, f.gpu, f.jobs) for f in verdict.failures] == [
        ("xid", "1", ("12", "13")),
        ("ecc_uncorrectable", "1", ("12", "13")),
    ]


def test_jobs_by_gpu_index():
    def job(gpu: str, job_id: str) -> Sample:
        return gpu_sample("slurm_job_info", gpu, 1.0, job_id=job_id, user="u")

    samples = [job("0", "12"), job("0", "3"), job("0", "12"), job("1", ""), info("0")]
    assert vd.jobs_by_gpu_index(samples) == {"0": ["12", "3"], "1": []}


# --- the XID catalog ----------------------------------------------------------------


def test_catalog_tiers():
    assert not CRITICAL_XIDS & WARNING_XIDS
    assert set(CATALOG) == CRITICAL_XIDS | WARNING_XIDS
    assert {63, 92, 94, 45, 121} <= WARNING_XIDS
    assert {13, 31, 43} & set(CATALOG) == set()
    assert {xid.tier for xid in CATALOG.values()} == {"critical", "warning"}
    assert all(xid.meaning and xid.action for xid in CATALOG.values())


def test_critical_set_is_the_collectors_former_one():
    """The collector's XID series (critical="true") used this set before the catalog."""
    former = {46, 48, 62, 64, 74, 79, 95, 109, 110, 119, 120, 136, 140, 143, 154, 155, 158}
    assert former | set(range(144, 151)) == CRITICAL_XIDS
