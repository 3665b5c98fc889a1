"""Helpers for the GPU health tests: a fake scontrol, configs, verdict documents."""

from __future__ import annotations

import calendar
import json
import sys
from pathlib import Path
from typing import Any

from gpufleet_node.gpu_collector.model import Sample
from gpufleet_node.gpu_collector.verdict import Check, verdict_document
from gpufleet_node.gpu_health import cli, decide

REPO = Path(__file__).resolve().parents[3]
FAKE_SMI = REPO / "tests" / "gpu" / "fake_nvidia_smi.py"
H100 = (
    REPO
    / "tests"
    / "fixtures"
    / "nvidia-smi"
    / "linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
)

# 2026-11-27T10:02:00Z: the drain reason of the docs' example.
NOW = float(calendar.timegm((2026, 11, 27, 10, 2, 0)))
STAMP = "2026-11-27T10:02Z"
# Bus numbers the fake nvidia-smi gives GPUs 0..7 (FAKE_NVIDIA_SMI_GPUS=8).
BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")

# A Slurm 24.11 `scontrol show node[s] --json` answer, for the nodes of a table file.
# Drain: DRAIN is added to the state, the reason and its time are set (a reason is
# required); resume: only a drained or down node, DRAIN/DOWN go, the reason is cleared.
FAKE_SCONTROL = r"""#!{python} -S
import json
import sys

TABLE = {table!r}


def record(node):
    out = {{
        "name": node["name"],
        "hostname": node["name"],
        "state": list(node["state"]),
        "reason": node.get("reason", ""),
        "reason_changed_at": {{
            "set": bool(node.get("reason_time")),
            "infinite": False,
            "number": node.get("reason_time", 0),
        }},
        "reason_set_by_user": node.get("reason_user", ""),
        "partitions": list(node.get("partitions", [])),
        "gres": "gpu:h100:8",
    }}
    return out


def answer(nodes):
    return json.dumps({{
        "nodes": [record(n) for n in nodes],
        "last_update": {{"set": True, "infinite": False, "number": 1764237720}},
        "meta": {{"plugin": {{"type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld",
                             "data_parser": "data_parser/v0.0.42"}},
                 "slurm": {{"version": {{"major": "24", "micro": "5", "minor": "11"}},
                           "release": "24.11.5", "cluster": "gpufleet"}}}},
        "errors": [],
        "warnings": [],
    }}, indent=2)


def main(argv):
    with open(TABLE, encoding="utf-8") as handle:
        table = json.load(handle)
    with open(TABLE + ".calls", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(argv) + "\n")
    word = argv[0] if argv else ""
    if word in table.get("fail", {{}}):
        sys.stderr.write(table["fail"][word] + "\n")
        return 1
    byname = {{n["name"]: n for n in table["nodes"]}}
    if word == "show":
        if "raw" in table:
            sys.stdout.write(table["raw"])
            return 0
        if argv[1:2] == ["nodes"]:
            print(answer(table["nodes"]))
            return 0
        if argv[1:2] == ["node"] and len(argv) > 2 and argv[2] in byname:
            print(answer([byname[argv[2]]]))
            return 0
        sys.stderr.write("slurm_load_node error: Invalid node name specified\n")
        return 1
    if word == "update":
        fields = dict(arg.split("=", 1) for arg in argv[1:])
        node = byname.get(fields.get("NodeName", ""))
        if node is None:
            sys.stderr.write("slurm_update error: Invalid node name specified\n")
            return 1
        state = fields.get("State", "").upper()
        if state == "DRAIN":
            if not fields.get("Reason"):
                sys.stderr.write("You must specify a reason when DOWNING or DRAINING a node. "
                                 "Request denied\n")
                return 1
            targets = [node] + [byname[o] for o in table.get("with_drain", {{}}).get(
                node["name"], [])]
            for target in targets:
                if "DRAIN" not in target["state"]:
                    target["state"].append("DRAIN")
                target["reason"] = fields["Reason"]
                target["reason_time"] = table.get("clock", 1764237720)
                target["reason_user"] = "root"
        elif state == "RESUME":
            if "DRAIN" not in node["state"] and "DOWN" not in node["state"]:
                sys.stderr.write("slurm_update error: Invalid node state specified\n")
                return 1
            node["state"] = [s for s in node["state"] if s not in ("DRAIN", "DOWN")] or ["IDLE"]
            node["reason"] = ""
            node["reason_time"] = 0
            node["reason_user"] = ""
        else:
            sys.stderr.write("slurm_update error: Invalid node state specified\n")
            return 1
        with open(TABLE, "w", encoding="utf-8") as handle:
            json.dump(table, handle)
        return 0
    sys.stderr.write("invalid keyword\n")
    return 1


sys.exit(main(sys.argv[1:]))
"""


def node(
    name: str,
    *state: str,
    reason: str = "",
    reason_time: int = 0,
    partitions: tuple[str, ...] = ("gpu",),
) -> dict[str, Any]:
    """A node of the fake scontrol's table."""
    return {
        "name": name,
        "state": list(state or ("IDLE",)),
        "reason": reason,
        "reason_time": reason_time,
        "partitions": list(partitions),
    }


class FakeScontrol:
    """An executable ``scontrol`` in tmp_path over a JSON table of nodes."""

    def __init__(self, tmp_path: Path, nodes: list[dict[str, Any]]) -> None:
        self.table_path = tmp_path / "slurm" / "nodes.json"
        self.table_path.parent.mkdir(parents=True, exist_ok=True)
        self.bin = tmp_path / "slurm" / "scontrol"
        self.bin.write_text(
            FAKE_SCONTROL.format(python=sys.executable, table=str(self.table_path)),
            encoding="utf-8",
        )
        self.bin.chmod(0o755)
        self.write({"nodes": nodes, "clock": int(NOW)})

    def read(self) -> dict[str, Any]:
        return json.loads(self.table_path.read_text(encoding="utf-8"))

    def write(self, table: dict[str, Any]) -> None:
        self.table_path.write_text(json.dumps(table), encoding="utf-8")

    def update(self, **items: Any) -> None:
        table = self.read()
        table.update(items)
        self.write(table)

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.read()["nodes"] if n["name"] == name)

    def set_node(self, name: str, **fields: Any) -> None:
        table = self.read()
        for item in table["nodes"]:
            if item["name"] == name:
                item.update(fields)
        self.write(table)

    def calls(self) -> list[list[str]]:
        path = Path(str(self.table_path) + ".calls")
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]

    def updates(self) -> list[list[str]]:
        return [call for call in self.calls() if call[:1] == ["update"]]

    def clear_calls(self) -> None:
        Path(str(self.table_path) + ".calls").unlink(missing_ok=True)


def config_data(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    """A valid health program config; paths under tmp_path."""
    state = tmp_path / "collector-state"
    data: dict[str, Any] = {
        "mode": "drain",
        "node": "gpu-a",
        "verdict": str(state / "health.json"),
        "xid_state": str(state / "xid_state.json"),
        "xid_baseline": str(state / "xid_baseline.json"),
        "max_age_seconds": 120,
        "max_drained_share_partition": 0.5,
        "max_drained_share_cluster": 0.5,
        "resume_after_runs": 3,
        "max_resumes_per_day": 2,
        "state_dir": str(tmp_path / "health-state"),
        "textfile_dir": str(tmp_path / "textfile"),
        "scontrol": str(tmp_path / "slurm" / "scontrol"),
        "timeout_seconds": 10,
        "chain": "",
    }
    data.update(overrides)
    return data


def make_config(tmp_path: Path, **overrides: Any) -> cli.Config:
    return cli.parse_config(json.dumps(config_data(tmp_path, **overrides)))


def write_config(tmp_path: Path, **overrides: Any) -> Path:
    path = tmp_path / "gpu-health.json"
    path.write_text(json.dumps(config_data(tmp_path, **overrides)), encoding="utf-8")
    (tmp_path / "textfile").mkdir(exist_ok=True)
    return path


def ok_checks(gpus: int = 8) -> list[Check]:
    checks = [Check("collector", "", "ok", ""), Check("gpu_count", "", "ok", "")]
    for gpu in range(gpus):
        checks.append(Check("xid", str(gpu), "ok", ""))
    return checks


def xid79(gpu: str = "3") -> Check:
    return Check("xid", gpu, "fail", "xid79 (fallen off the bus)")


def verdict_text(
    checks: list[Check],
    now: float = NOW,
    jobs: dict[str, list[str]] | None = None,
) -> str:
    """The collector's own document (verdict.verdict_document) for these checks."""
    return verdict_document(checks, now, "boot-1", jobs or {})


def verdict_of(checks: list[Check], now: float = NOW, **kw: Any) -> decide.Verdict:
    return decide.parse_verdict(verdict_text(checks, now, **kw), now, 120)


def failing(gpu: str = "3", now: float = NOW, **kw: Any) -> decide.Verdict:
    return verdict_of([*ok_checks(), xid79(gpu)], now, **kw)


def passing(now: float = NOW) -> decide.Verdict:
    return verdict_of(ok_checks(), now)


UNKNOWN = decide.unknown("the verdict is not JSON")


def gpu_sample(name: str, gpu: str, value: float, **extra: str) -> Sample:
    labels = (("gpu", gpu), ("uuid", f"GPU-{gpu}"), ("vendor", "nvidia"), *extra.items())
    return Sample(name, tuple(labels), value)


def info(gpu: str) -> Sample:
    return gpu_sample("info", gpu, 1.0)


def parse_prom(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Exposition text -> {(name, labels): value}; label values without escapes."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        labels: frozenset[tuple[str, str]] = frozenset()
        name = head
        if "{" in head:
            name, rest = head.split("{", 1)
            pairs = json.loads("{" + _json_labels(rest.rstrip("}")) + "}")
            labels = frozenset(pairs.items())
        out[(name, labels)] = float(value)
    return out


def _json_labels(text: str) -> str:
    """a="x",b="y" -> "a":"x","b":"y" (exposition escapes are JSON's for \\ and ")."""
    parts, current, quoted, escaped = [], "", False, False
    for char in text:
        if escaped:
            current += char
            escaped = False
            continue
        if char == "\\":
            escaped = True
            current += char
            continue
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    if current:
        parts.append(current)
    return ",".join(f'"{p.split("=", 1)[0]}":{p.split("=", 1)[1]}' for p in parts)


def values_of(text: str, name: str, **labels: str) -> list[float]:
    want = set(labels.items())
    return [v for (n, ls), v in parse_prom(text).items() if n == name and want <= set(ls)]
