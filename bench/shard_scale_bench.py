#!/usr/bin/env python3
"""Shard scale benchmark: one Prometheus shard with gpufleet's rendered configuration,
file_sd targets from the inventory plugin and gpufleet's rule files, scraping N GPU nodes.

    .venv/bin/python bench/shard_scale_bench.py [--nodes 250,500,1000] [--duration 60]
        [--cpus N] [--gpus 8] [--rules DIR] [--prometheus /usr/bin/prometheus] [--json]
    .venv/bin/python bench/shard_scale_bench.py --record http://HOST:9100/metrics [--out FILE]

Every node is a loopback address (127.1.x.y) answered by one small threaded HTTP server,
in its own process, that replays a recorded node_exporter + GPU collector payload
(bench/payloads/, recorded from the test bed's real exporters). Per node count it starts
Prometheus on a fresh data directory, waits for the targets and a warm-up, measures for
--duration seconds and prints head series, RSS, CPU, scrape duration p99 of job node, each
rule group's evaluation time and missed iterations, and the sum of the rule group times
per evaluation cycle. Prometheus shares the machine with the replay server and this
script: on a small machine (2 cores) the rule groups' wall-clock times include waiting for
a core, and the scrape durations include the replay server's latency. The default run
(250, 500, 1000 nodes; 60 s each after a 75 s warm-up) takes about 7 minutes.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import gzip
import http.server
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PAYLOADS = REPO / "bench" / "payloads"
DEFAULT_PAYLOAD = PAYLOADS / "gpu-node-h100x8.prom"
DEFAULT_RULES = REPO / "roles" / "prometheus" / "files" / "rules"
# Rule files the prometheus role renders from a template (tasks/instance.yml), by template.
TEMPLATED_RULES = {"capacity.rules.yml.j2": "gpufleet-capacity.rules.yml"}
SHARD = {"name": "shard-0", "mode": "shard", "shard": 0, "replica": 0}
CLUSTER = "bench"
NODES_PER_BLOCK = 250  # 127.1.<block>.<1..250>

SAMPLE_LABEL = r'(?<=[{{,]){label}="(\d+)"'


# ---------------------------------------------------------------- payload (pure parts)


def sample_name(line: str) -> str:
    """The metric name of a sample line of the text exposition format."""
    return re.split(r"[{\s]", line, maxsplit=1)[0]


def family_blocks(lines: list[str]) -> Iterator[tuple[list[str], list[str]]]:
    """(comment lines, sample lines) of each run of samples in the exposition text."""
    comments: list[str] = []
    samples: list[str] = []
    for line in lines:
        if line.startswith("#") or not line.strip():
            if samples:
                yield comments, samples
                comments, samples = [], []
            if line.strip():
                comments.append(line)
        else:
            samples.append(line)
    if comments or samples:
        yield comments, samples


def label_values(text: str, label: str) -> list[int]:
    """The distinct numeric values of a label (cpu, gpu) in the payload, sorted."""
    pattern = re.compile(SAMPLE_LABEL.format(label=label))
    return sorted({int(m.group(1)) for m in pattern.finditer(text)})


def replicate_label(text: str, label: str, count: int) -> str:
    """The payload as a host with `count` values 0..count-1 of `label` would serve it.

    Series with label="k" are copied: value i takes the series of recorded value
    i mod (number recorded), so cpu="0".."1" becomes cpu="0".."63"; values >= count are
    dropped. Lines without the label stay as they are, and each family stays contiguous.
    """
    recorded = label_values(text, label)
    if not recorded or count < 1:
        return text
    pattern = re.compile(SAMPLE_LABEL.format(label=label))
    out: list[str] = []
    for comments, samples in family_blocks(text.splitlines()):
        out.extend(comments)
        by_value: dict[int, list[str]] = {}
        for line in samples:
            match = pattern.search(line)
            if match:
                by_value.setdefault(int(match.group(1)), []).append(line)
            else:
                out.append(line)
        if not by_value:
            continue
        for index in range(count):
            source = recorded[index % len(recorded)]
            for line in by_value.get(source, []):
                out.append(pattern.sub(f'{label}="{index}"', line, count=1))
    return "\n".join(out) + "\n"


def synthesize_payload(text: str, cpus: int | None, gpus: int | None) -> str:
    """The recorded payload with `cpus` CPUs and `gpus` GPUs (None: as recorded)."""
    if cpus:
        text = replicate_label(text, "cpu", cpus)
    if gpus:
        text = replicate_label(text, "gpu", gpus)
    return text


def series_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and not line.startswith("#"))


def family_counts(text: str) -> dict[str, dict[str, int]]:
    """Series per metric name, split by what they scale with: per cpu, per gpu, fixed."""
    cpu = re.compile(SAMPLE_LABEL.format(label="cpu"))
    gpu = re.compile(SAMPLE_LABEL.format(label="gpu"))
    counts: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind = "per_cpu" if cpu.search(line) else "per_gpu" if gpu.search(line) else "fixed"
        entry = counts.setdefault(sample_name(line), {"per_cpu": 0, "per_gpu": 0, "fixed": 0})
        entry[kind] += 1
    return counts


def payload_summary(text: str) -> dict[str, int]:
    """Total series, and how many scale with the CPU and GPU count (per CPU, per GPU)."""
    cpus = len(label_values(text, "cpu")) or 1
    gpus = len(label_values(text, "gpu")) or 1
    totals = {"per_cpu": 0, "per_gpu": 0, "fixed": 0}
    for entry in family_counts(text).values():
        for kind, value in entry.items():
            totals[kind] += value
    return {
        "series": series_count(text),
        "cpus": len(label_values(text, "cpu")),
        "gpus": len(label_values(text, "gpu")),
        "fixed": totals["fixed"],
        "per_cpu_total": totals["per_cpu"],
        "per_gpu_total": totals["per_gpu"],
        "series_per_cpu": round(totals["per_cpu"] / cpus),
        "series_per_gpu": round(totals["per_gpu"] / gpus),
    }


def read_payload(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return data.decode()


# ---------------------------------------------------------------- node list (pure parts)


def node_list(nodes: int, gpus: int, cpus: int) -> str:
    """A gpufleet node list: `nodes` GPU nodes on 127.1.<block>.<n>, one shard."""
    lines = [
        "# Generated by bench/shard_scale_bench.py: GPU nodes on loopback addresses.",
        "plugin: gpufleet",
        f"cluster: {CLUSTER}",
        "nodes:",
    ]
    blocks = math.ceil(nodes / NODES_PER_BLOCK)
    for block in range(1, blocks + 1):
        size = min(NODES_PER_BLOCK, nodes - (block - 1) * NODES_PER_BLOCK)
        lines += [
            f'  - hosts: "b{block:02d}n[1-{size}]"',
            f'    address: "127.1.{block}.{{num}}"',
            f"    rack: r{block:02d}",
            "    partition: [gpu]",
            f"    gpu: {{vendor: nvidia, model: H100, count: {gpus}}}",
            "    gpu_collector: smi",
            f"    cpus: {cpus}",
        ]
    lines += [
        "servers:",
        "  - hosts: mon01",
        "    address: 127.0.0.1",
        "monitoring:",
        "  shards: 1",
        "  prometheus_hosts: mon01",
    ]
    return "\n".join(lines) + "\n"


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values, nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus duration such as 15s, 1m or 1m30s."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(n) * units[u] for n, u in parts)


# ---------------------------------------------------------------- replay server


def serve(port: int, payload_file: str) -> None:
    """Answer every GET on 0.0.0.0:port with the payload (gzip when accepted)."""
    body = Path(payload_file).read_bytes()
    zipped = gzip.compress(body, compresslevel=6)
    threading.stack_size(512 * 1024)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            use_gzip = "gzip" in self.headers.get("Accept-Encoding", "")
            data = zipped if use_gzip else body
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            if use_gzip:
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 4096

    with Server(("0.0.0.0", port), Handler) as server:
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        server.serve_forever()


# ---------------------------------------------------------------- processes


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGTERM when this script dies (PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def raise_nofile() -> None:
    """preexec_fn: as many open files as the unit's LimitNOFILE allows here."""
    die_with_parent()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(65536, hard), hard))


def stop(process: subprocess.Popen, grace: float = 60.0) -> None:
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=30)


def wait_for(what: str, check, timeout: float, every: float = 1.0):
    """Poll check() until it returns a true value; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError):
            value = check()
            if value:
                return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def port_open(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine spent busy (not idle, not iowait) since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def proc_status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


# ---------------------------------------------------------------- Prometheus API


class Api:
    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> dict:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.load(response)

    def query(self, promql: str) -> list[dict]:
        return self.get("/api/v1/query", query=promql)["data"]["result"]

    def scalar(self, promql: str) -> float:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else 0.0

    def own_metrics(self) -> dict[str, dict[str, float]]:
        """Prometheus' own /metrics: {name: {label text: value}} (exact counters)."""
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=60) as response:
            text = response.read().decode()
        out: dict[str, dict[str, float]] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                series, value = line.rsplit(" ", 1)
                name, _, labels = series.partition("{")
                out.setdefault(name, {})[labels.rstrip("}")] = float(value)
        return out


# Groups evaluated at most this often are waited for (two evaluations) before measuring;
# slower ones (gpufleet-prometheus-disk: 5 min) are read at their last evaluation.
WARM_GROUP_INTERVAL = 60.0


def group_values(api: Api, promql: str) -> dict[str, float]:
    """{rule group name: value} of a per-group query."""
    return {
        item["metric"]["rule_group"].split(";", 1)[-1]: float(item["value"][1])
        for item in api.query(promql)
    }


def rule_groups_warm(api: Api, evaluation: float) -> bool:
    """Every group with an interval up to WARM_GROUP_INTERVAL has run twice."""
    intervals = group_values(api, "prometheus_rule_group_interval_seconds")
    iterations = group_values(api, "prometheus_rule_group_iterations_total")
    wanted = [name for name, every in intervals.items() if every <= WARM_GROUP_INTERVAL]
    return bool(wanted) and all(iterations.get(name, 0) >= 2 for name in wanted)


# ---------------------------------------------------------------- shard setup


def inventory(inventory_dir: Path) -> dict:
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-inventory"),
            "-i",
            str(inventory_dir),
            "--list",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env=dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg")),
    )
    sys.path.insert(0, str(REPO / "src"))
    from gpufleet.inventory_json import plain

    return plain(json.loads(result.stdout))


def render_shard(
    data: dict, config_dir: Path
) -> tuple[str, dict[str, list[dict]], list[str], dict[str, str]]:
    """(prometheus.yml, file_sd targets per job, rule file names, templated rule files) of
    shard 0, rendered by the role's templates and filters as tasks/instance.yml does."""
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    from ansible.plugins.loader import filter_loader
    from render_role import render, role_variables

    filter_loader.add_directory(str(REPO / "plugins" / "filter"))
    sys.path.insert(0, str(REPO / "plugins" / "filter"))
    from gpufleet_filters import gpufleet_targets

    hostvars = data["_meta"]["hostvars"]
    groups = {k: v.get("hosts", []) for k, v in data.items() if k != "_meta"}
    groups["all"] = sorted(hostvars)
    for name in ("prometheus", "prometheus_global", "alertmanager", "grafana", "loki"):
        groups.setdefault(name, [])
    (host,) = groups["prometheus"]
    overrides = {"_instance": SHARD, "prometheus_config_dir": str(config_dir)}
    text = render("prometheus", "prometheus.yml.j2", host, overrides, (groups, hostvars))
    variables = role_variables("prometheus")
    registry = variables["exporters_registry"]
    # The shard's group also holds its monitoring host: only the GPU nodes are measured.
    scraped = [h for h in groups["prometheus_shard_0"] if hostvars[h]["gpufleet_role"] == "node"]
    # The replay server serves the payload recorded from node_exporter (with the GPU
    # collector's textfile series): the node job is measured; the registry's other shard
    # jobs (dcgm, slurm, ipmi) are configured with no targets.
    jobs = [job for job, exporter in registry.items() if "shard" in exporter["modes"]]
    node = registry["node"]
    targets = {job: [] for job in jobs}
    targets["node"] = gpufleet_targets(scraped, hostvars, node["port"], node["port_variable"])
    rendered = {
        TEMPLATED_RULES[template]: render(
            "prometheus", template, host, overrides, (groups, hostvars)
        )
        for template in TEMPLATED_RULES
    }
    rule_files = variables["_prometheus_rule_files"]["shard"]
    return text, targets, rule_files, rendered


def write_shard(
    workdir: Path, nodes: int, gpus: int, cpus: int, rules: Path
) -> tuple[Path, dict, list[str]]:
    """The shard's directory (config, rules, targets); returns (config file, config, rules)."""
    inventory_dir = workdir / "inventory"
    inventory_dir.mkdir()
    (inventory_dir / "nodes.gpufleet.yml").write_text(node_list(nodes, gpus, cpus))
    text, targets, rule_files, rendered = render_shard(inventory(inventory_dir), workdir)
    shard_dir = workdir / SHARD["name"]
    (shard_dir / "rules").mkdir(parents=True)
    (shard_dir / "targets").mkdir()
    installed = []
    for name in rule_files:
        if (rules / name).exists():
            shutil.copy(rules / name, shard_dir / "rules" / name)
            installed.append(name)
        else:
            print(f"note: {rules / name} does not exist, not installed", file=sys.stderr)
    # The role's templated rule files (the series budget alert) belong to this checkout's
    # rules: installed with them, not with an older --rules directory.
    if rules.resolve() == DEFAULT_RULES.resolve():
        for name, content in rendered.items():
            (shard_dir / "rules" / name).write_text(content)
            installed.append(name)
    for job, groups in targets.items():
        (shard_dir / "targets" / f"{job}.json").write_text(json.dumps(groups, indent=2) + "\n")
    config_file = shard_dir / "prometheus.yml"
    config_file.write_text(text)
    return config_file, yaml.safe_load(text), installed


# ---------------------------------------------------------------- one step


@dataclass
class Step:
    nodes: int
    series_per_node: int
    head_series: int = 0
    targets_up: int = 0
    samples_per_second: float = 0.0
    rss_mib_end: float = 0.0
    rss_mib_max: float = 0.0
    rss_mib_peak: float = 0.0
    cpu_cores: float = 0.0
    replay_cores: float = 0.0
    machine_busy_cores: float = 0.0
    scrape_p50_ms: float = 0.0
    scrape_p99_ms: float = 0.0
    scrape_max_ms: float = 0.0
    rule_groups: dict[str, dict[str, float]] = field(default_factory=dict)
    rule_samples_per_cycle: float = 0.0
    rule_time_per_cycle_s: float = 0.0
    evaluation_interval_s: float = 0.0
    missed_iterations: float = 0.0


def run_step(args: argparse.Namespace, nodes: int, payload_text: str, port: int) -> Step:
    with tempfile.TemporaryDirectory(prefix="gpufleet-shard-bench-") as tmp:
        workdir = Path(tmp)
        config_file, config, _ = write_shard(workdir, nodes, args.gpus, args.node_cpus, args.rules)
        interval = parse_duration(config["global"]["scrape_interval"])
        evaluation = parse_duration(config["global"]["evaluation_interval"])
        (own,) = [j for j in config["scrape_configs"] if j["job_name"] == "prometheus"]
        listen = f"127.0.0.1:{own['static_configs'][0]['targets'][0].rsplit(':', 1)[1]}"
        data_dir = workdir / "data"
        log = (workdir / "prometheus.log").open("w")
        process = subprocess.Popen(
            [
                args.prometheus,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={data_dir}",
                "--storage.tsdb.retention.time=30d",
                f"--web.listen-address={listen}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=raise_nofile,
        )
        try:
            return measure(
                args, process, Api(f"http://{listen}"), nodes, payload_text, interval, evaluation
            )
        except BaseException:
            log.flush()
            tail = (workdir / "prometheus.log").read_text()[-3000:]
            print(f"prometheus log (tail):\n{tail}", file=sys.stderr)
            raise
        finally:
            stop(process)
            log.close()


def measure(
    args: argparse.Namespace,
    process: subprocess.Popen,
    api: Api,
    nodes: int,
    payload_text: str,
    interval: float,
    evaluation: float,
) -> Step:
    started = time.monotonic()
    step = Step(
        nodes=nodes, series_per_node=series_count(payload_text), evaluation_interval_s=evaluation
    )
    wait_for("Prometheus to answer", lambda: api.query("up"), 120)
    wait_for(
        f"{nodes} node targets up",
        lambda: api.scalar('count(up{job="node"} == 1)') >= nodes,
        max(180, 4 * interval),
        every=2,
    )
    warmup = max(args.warmup, 2 * evaluation + 2 * interval)
    time.sleep(max(0.0, warmup - (time.monotonic() - started)))
    wait_for(
        "two rule evaluations of every group with an interval up to 1 minute",
        lambda: rule_groups_warm(api, evaluation),
        4 * max(evaluation, WARM_GROUP_INTERVAL) + 60,
    )
    before = api.own_metrics()
    cpu_before, t_before = proc_cpu_seconds(process.pid), time.monotonic()
    replay_before, busy_before = proc_cpu_seconds(args.replay_pid), machine_busy_seconds()
    rss: list[int] = []
    deadline = t_before + args.duration
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"Prometheus exited ({process.returncode}) during the measurement")
        rss.append(proc_status_kib(process.pid, "VmRSS"))
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
    cpu_after, t_after = proc_cpu_seconds(process.pid), time.monotonic()
    after = api.own_metrics()
    step.cpu_cores = (cpu_after - cpu_before) / (t_after - t_before)
    step.replay_cores = (proc_cpu_seconds(args.replay_pid) - replay_before) / (t_after - t_before)
    step.machine_busy_cores = (machine_busy_seconds() - busy_before) / (t_after - t_before)
    rss.append(proc_status_kib(process.pid, "VmRSS"))
    step.rss_mib_end = rss[-1] / 1024
    step.rss_mib_max = max(rss) / 1024
    step.rss_mib_peak = proc_status_kib(process.pid, "VmHWM") / 1024
    window = f"{int(args.duration)}s"
    step.head_series = int(api.scalar('prometheus_tsdb_head_series{job="prometheus"}'))
    step.targets_up = int(api.scalar('count(up{job="node"} == 1)'))
    appended = "prometheus_tsdb_head_samples_appended_total"
    step.samples_per_second = (sum(after[appended].values()) - sum(before[appended].values())) / (
        t_after - t_before
    )
    durations = [
        float(value)
        for series in api.query(f'scrape_duration_seconds{{job="node"}}[{window}]')
        for _, value in series["values"]
    ]
    step.scrape_p50_ms = percentile(durations, 0.50) * 1000
    step.scrape_p99_ms = percentile(durations, 0.99) * 1000
    step.scrape_max_ms = max(durations, default=float("nan")) * 1000
    groups: dict[str, dict[str, float]] = {}
    for name, interval in group_values(api, "prometheus_rule_group_interval_seconds").items():
        groups.setdefault(name, {})["interval"] = interval
    # A group evaluated less often than the window is read at its last evaluation.
    last = "prometheus_rule_group_last_duration_seconds{job='prometheus'}"
    slow = group_values(api, last)
    for name, seconds in group_values(api, f"avg_over_time({last}[{window}])").items():
        groups.setdefault(name, {})["seconds"] = seconds
    for name, seconds in slow.items():
        groups.setdefault(name, {}).setdefault("seconds", seconds)
    missed = "prometheus_rule_group_iterations_missed_total"
    for labels, value in after[missed].items():
        name = re.sub(r'.*rule_group=".*?;?([^;"]*)".*', r"\1", labels)
        groups.setdefault(name, {})["missed"] = value - before[missed].get(labels, 0.0)
    step.rule_groups = dict(sorted(groups.items()))
    step.rule_time_per_cycle_s = sum(
        g.get("seconds", 0.0) * evaluation / g.get("interval", evaluation) for g in groups.values()
    )
    step.missed_iterations = sum(g.get("missed", 0.0) for g in groups.values())
    for name, samples in rule_samples(api).items():
        groups.setdefault(name, {})["samples"] = samples
    step.rule_samples_per_cycle = sum(
        g.get("samples", 0.0) * evaluation / g.get("interval", evaluation) for g in groups.values()
    )
    return step


def rule_samples(api: Api) -> dict[str, float]:
    """Samples each group's rules read in one evaluation (the query engine's own count,
    totalQueryableSamples, of each rule's expression evaluated now): the work the rules
    do, independent of how busy the machine is."""
    out: dict[str, float] = {}
    for group in api.get("/api/v1/rules")["data"]["groups"]:
        total = 0
        for rule in group["rules"]:
            stats = api.get("/api/v1/query", query=rule["query"], stats="all")["data"]["stats"]
            total += stats["samples"]["totalQueryableSamples"]
        out[group["name"]] = float(total)
    return out


# ---------------------------------------------------------------- output


def machine() -> dict[str, str | int | float]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kib = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": model,
        "cores": os.cpu_count() or 0,
        "ram_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
    }


def prometheus_version(binary: str) -> str:
    result = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return (result.stdout + result.stderr).splitlines()[0].strip()


def table(steps: list[Step]) -> str:
    head = (
        f"{'nodes':>6} {'series/node':>11} {'head series':>11} {'up':>5} {'samples/s':>9} "
        f"{'RSS MiB':>8} {'max':>7} {'CPU cores':>9} {'(replay':>7} {'busy)':>6} "
        f"{'scrape p50':>10} {'p99 ms':>7} "
        f"{'rules s/cycle':>13} {'missed':>6} {'samples read/cycle':>18}"
    )
    rows = [head]
    for s in steps:
        rows.append(
            f"{s.nodes:>6} {s.series_per_node:>11} {s.head_series:>11} {s.targets_up:>5} "
            f"{s.samples_per_second:>9.0f} {s.rss_mib_end:>8.0f} {s.rss_mib_max:>7.0f} "
            f"{s.cpu_cores:>9.2f} {s.replay_cores:>7.2f} {s.machine_busy_cores:>6.2f} "
            f"{s.scrape_p50_ms:>10.1f} {s.scrape_p99_ms:>7.1f} "
            f"{s.rule_time_per_cycle_s:>13.3f} {s.missed_iterations:>6.0f} "
            f"{s.rule_samples_per_cycle:>18,.0f}"
        )
    names = sorted({name for s in steps for name in s.rule_groups})
    rows += [
        "CPU cores: Prometheus; (replay: the replay server; busy: the whole machine, all",
        "processes, during the window: busy minus the two is what else ran meanwhile)",
        "",
        "rule group evaluation time, seconds per evaluation (avg of last_duration over the",
        "window; a group slower than the window: its last evaluation), its interval, and",
        "missed iterations: wall-clock, groups run concurrently and share the machine's",
        "cores. 'rules s/cycle' adds each group's time per evaluation interval (a 1m group",
        "counts a quarter of its time per 15 s cycle). Samples: what the group's rules read",
        "in one evaluation (totalQueryableSamples), the machine-independent cost.",
    ]
    rows.append(f"{'group':<34}" + "".join(f"{s.nodes:>30}" for s in steps))
    for name in names:
        cells = []
        for s in steps:
            group = s.rule_groups.get(name, {})
            every = group.get("interval", s.evaluation_interval_s)
            cells.append(
                f"{group.get('seconds', float('nan')):>9.4f} {every:>3.0f}s "
                f"({group.get('missed', 0):.0f}) {group.get('samples', 0):>11,.0f}"
            )
        rows.append(f"{name:<34}" + "".join(f"{c:>30}" for c in cells))
    rows.append(
        f"{'per 15 s cycle':<34}"
        + "".join(
            f"{s.rule_time_per_cycle_s:>12.4f} {s.rule_samples_per_cycle:>17,.0f}" for s in steps
        )
    )
    return "\n".join(rows)


# ---------------------------------------------------------------- recording


def record(args: argparse.Namespace) -> None:
    """Fetch a live node_exporter's /metrics and write it as a payload fixture."""
    request = urllib.request.Request(args.record)
    if args.user:
        token = base64.b64encode(f"{args.user}:{args.password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    context = ssl.create_default_context(cafile=args.cacert) if args.cacert else None
    with urllib.request.urlopen(request, timeout=30, context=context) as response:
        text = response.read().decode()
    summary = payload_summary(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode()
    out.write_bytes(gzip.compress(data, mtime=0) if out.suffix == ".gz" else data)
    sidecar = {
        "source": args.record,
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "note": args.note,
        **summary,
        "families": family_counts(text),
    }
    sidecar_file = out.with_name(out.name.removesuffix(".gz").removesuffix(".prom") + ".json")
    sidecar_file.write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out} ({len(text)} bytes, {summary['series']} series) and {sidecar_file}")
    print(json.dumps(summary, indent=2))


# ---------------------------------------------------------------- main


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="250,500,1000", help="node counts, comma separated")
    parser.add_argument("--duration", type=float, default=60, help="measured seconds per step")
    parser.add_argument("--warmup", type=float, default=75, help="seconds before measuring")
    parser.add_argument("--cpus", type=int, help="CPUs per node (default: as recorded)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--payload", type=Path, default=DEFAULT_PAYLOAD)
    parser.add_argument("--prometheus", default="/usr/bin/prometheus")
    parser.add_argument("--rules", type=Path, default=DEFAULT_RULES, help="rule file directory")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--record", metavar="URL", help="record a payload from a node_exporter")
    parser.add_argument(
        "--out", default=str(DEFAULT_PAYLOAD), help="where --record writes (.gz: gzipped)"
    )
    parser.add_argument("--note", default="", help="--record: a note for the sidecar JSON")
    parser.add_argument("--user", help="--record: basic auth user")
    parser.add_argument("--password", help="--record: basic auth password")
    parser.add_argument("--cacert", help="--record: CA file for https")
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "FILE"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def start_replay(port: int, payload_file: Path) -> subprocess.Popen:
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(port), str(payload_file)],
        preexec_fn=raise_nofile,
    )
    wait_for("the replay server", lambda: port_open("127.1.1.1", port), 30, every=0.2)
    return server


def main(argv: list[str] | None = None) -> None:
    args = arguments(argv)
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return
    if args.record:
        record(args)
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    recorded = read_payload(args.payload)
    payload_text = synthesize_payload(recorded, args.cpus, args.gpus)
    args.node_cpus = args.cpus or len(label_values(recorded, "cpu")) or 1
    args.rules = args.rules.resolve()
    registry = yaml.safe_load((REPO / "roles/_exporters/defaults/main.yml").read_text())
    node_port = int(registry["exporters_registry"]["node"]["port"])
    counts = [int(n) for n in args.nodes.split(",") if n.strip()]
    facts = {
        "machine": machine(),
        "prometheus": prometheus_version(args.prometheus),
        "rules": str(args.rules),
        "payload": str(args.payload),
        "cpus_per_node": args.node_cpus,
        "gpus_per_node": len(label_values(payload_text, "gpu")),
        "series_per_node": series_count(payload_text),
    }
    if not args.json:
        m = facts["machine"]
        print(
            f"machine: {m['cpu']}, {m['cores']} cores, {m['ram_gib']} GiB RAM "
            f"(Prometheus shares the cores with the replay server); {facts['prometheus']}"
        )
        print(
            f"payload: {args.payload.name} as {facts['cpus_per_node']} CPUs / "
            f"{facts['gpus_per_node']} GPUs = {facts['series_per_node']} series per node; "
            f"rules: {args.rules}; {args.duration:.0f} s measured after "
            f">= {args.warmup:.0f} s warm-up",
            flush=True,
        )
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="gpufleet-replay-") as tmp:
        payload_file = Path(tmp) / "metrics.prom"
        payload_file.write_text(payload_text)
        server = start_replay(node_port, payload_file)
        args.replay_pid = server.pid
        try:
            for count in counts:
                step = run_step(args, count, payload_text, node_port)
                steps.append(step)
                if not args.json:
                    print(
                        f"  {count} nodes: {step.head_series} head series, "
                        f"{step.cpu_cores:.2f} cores, {step.rss_mib_end:.0f} MiB",
                        flush=True,
                    )
        finally:
            stop(server, grace=10)
    if args.json:
        print(json.dumps({**facts, "steps": [asdict(s) for s in steps]}, indent=2))
    else:
        print()
        print(table(steps))


if __name__ == "__main__":
    main()
