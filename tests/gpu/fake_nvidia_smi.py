#!/usr/bin/env python3
"""Test double of ``nvidia-smi`` that answers from real captures.

Configuration: environment variables, else KEY=VALUE lines in the file named by
``FAKE_NVIDIA_SMI_CONFIG`` (default ``/etc/fake-nvidia-smi.conf``); the
environment wins. Keys:

FAKE_NVIDIA_SMI_CAPTURE    capture file (tests/fixtures/nvidia-smi/*.txt), required
FAKE_NVIDIA_SMI_STATE      idle | load (default idle)
FAKE_NVIDIA_SMI_GPUS       replicate the capture's GPU to N GPUs (distinct index,
                           UUID, PCI bus id); default: as captured
FAKE_NVIDIA_SMI_MODE       normal | hang | crash | garbage (default normal)
FAKE_NVIDIA_SMI_UNKNOWN_FIELDS  comma list of query fields to reject like an
                           older driver ("Field ... is not a valid field", exit 2)
FAKE_NVIDIA_SMI_APPS       compute apps instead of the capture's:
                           "pid[:gpu_index[:used_mib]],..." ("none": no apps)
FAKE_NVIDIA_SMI_APPS_FILE  same syntax, read from a file at every call (so a
                           test can change the apps of a running system)
FAKE_NVIDIA_SMI_SET        field values to answer instead of the capture's, per GPU:
                           "index:field=value;..." (a GPU fault, e.g.
                           "1:remapped_rows.pending=Yes"; "" or unset: none)
FAKE_NVIDIA_SMI_SET_FILE   same syntax, read from a file at every call
FAKE_NVIDIA_SMI_CALL_LOG   append each argv (one line, tab separated) to this file
FAKE_NVIDIA_SMI_RUSAGE_LOG append "user sys" CPU seconds of this process at exit

Answers: ``--query-gpu=<fields> --format=csv[,noheader][,nounits]`` (projected
from the capture's full query-gpu CSV, aliases from --help-query-gpu accepted),
``--query-compute-apps=<fields> --format=...``, ``-L``, ``--version``, ``-h``,
``--help-query-gpu``, ``--help-query-compute-apps``, ``-q`` and no arguments.
"""

from __future__ import annotations

import os
import re
import resource
import sys
import time

CONFIG_DEFAULT = "/etc/fake-nvidia-smi.conf"
KEYS = (
    "CAPTURE",
    "STATE",
    "GPUS",
    "MODE",
    "UNKNOWN_FIELDS",
    "APPS",
    "APPS_FILE",
    "SET",
    "SET_FILE",
    "CALL_LOG",
    "RUSAGE_LOG",
)
# Bus numbers of a typical 8-GPU HGX board; more GPUs continue past them.
BUS_NUMBERS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
DRIVER_DOWN = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


def load_config(environ: dict[str, str]) -> dict[str, str]:
    config: dict[str, str] = {}
    path = environ.get("FAKE_NVIDIA_SMI_CONFIG", CONFIG_DEFAULT)
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                key, sep, value = line.strip().partition("=")
                if sep and not key.startswith("#"):
                    config[key.strip().removeprefix("FAKE_NVIDIA_SMI_")] = value.strip()
    except OSError:
        pass
    for key in KEYS:
        if f"FAKE_NVIDIA_SMI_{key}" in environ:
            config[key] = environ[f"FAKE_NVIDIA_SMI_{key}"]
    return config


def sections(text: str) -> dict[str, list[str]]:
    """Capture file -> {'idle :: query-gpu (csv, ...)': [lines], ...}.

    A section is '#####' / '# <title>' / optional '# $ command' / '#####' / body.
    """
    out: dict[str, list[str]] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("#####") and i + 1 < len(lines) and lines[i + 1].startswith("# "):
            title = lines[i + 1][2:].strip()
            j = i + 2
            while j < len(lines) and not lines[j].startswith("#####"):
                j += 1
            body_start = j + 1
            k = body_start
            while k < len(lines) and not lines[k].startswith("#####"):
                k += 1
            out[title] = lines[body_start:k]
            i = k
        else:
            i += 1
    return out


def find_section(secs: dict[str, list[str]], prefix: str) -> list[str]:
    for title, body in secs.items():
        if title.startswith(prefix):
            return body
    return []


def strip_blank(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip()]


def split_csv(line: str) -> list[str]:
    # nvidia-smi separates with ", " and never quotes; values do not contain ", ".
    return line.split(", ")


def as_row(names: list[str], values: list) -> dict:
    # not zip(): strict= does not exist on the Python 3.9 of older test hosts
    return {names[i]: values[i] for i in range(min(len(names), len(values)))}


def header_name(header: str) -> tuple[str, str]:
    """'power.draw [W]' -> ('power.draw', 'W')."""
    match = re.fullmatch(r"(.*?)(?: \[([^\]]*)\])?", header.strip())
    assert match
    return match.group(1), match.group(2) or ""


def parse_aliases(help_lines: list[str]) -> dict[str, list[str]]:
    """'"clocks.current.graphics" or "clocks.gr"' lines -> groups of synonyms."""
    groups: dict[str, list[str]] = {}
    for line in help_lines:
        if line.startswith('"'):
            names = re.findall(r'"([^"]+)"', line)
            for name in names:
                groups[name] = names
    return groups


def replicate_gpu(row: dict[str, str], index: int, count: int) -> dict[str, str]:
    bus = BUS_NUMBERS[index] if index < len(BUS_NUMBERS) else 0xDC + index
    out = dict(row)
    out["index"] = str(index)
    out["count"] = str(count)
    uuid = row.get("uuid", "GPU-00000000-0000-0000-0000-000000000000")
    out["uuid"] = uuid[: -len(f"{index:x}")] + f"{index:x}" if index else uuid
    out["pci.bus_id"] = f"00000000:{bus:02X}:00.0"
    out["pci.bus"] = f"0x{bus:02X}"
    out["pci.device"] = "0x00"
    out["pci.domain"] = "0x0000"
    return out


class Capture:
    def __init__(self, path: str, state: str) -> None:
        with open(path, encoding="utf-8") as handle:
            self.secs = sections(handle.read())
        self.state = state
        gpu_lines = strip_blank(find_section(self.secs, f"{state} :: query-gpu"))
        self.gpu_header = split_csv(gpu_lines[0])
        self.gpu_rows = [as_row(self.field_names(), split_csv(x)) for x in gpu_lines[1:]]
        self.gpu_units = {header_name(h)[0]: header_name(h)[1] for h in self.gpu_header}
        app_lines = strip_blank(find_section(self.secs, f"{state} :: query-compute-apps"))
        self.app_header = split_csv(app_lines[0]) if app_lines else []
        app_names = [header_name(h)[0] for h in self.app_header]
        self.app_rows = [as_row(app_names, split_csv(x)) for x in app_lines[1:]]
        self.app_units = {header_name(h)[0]: header_name(h)[1] for h in self.app_header}
        self.gpu_aliases = parse_aliases(find_section(self.secs, "capabilities :: help-query-gpu"))
        self.app_aliases = parse_aliases(
            find_section(self.secs, "capabilities :: help-query-compute-apps")
        )

    def field_names(self) -> list[str]:
        return [header_name(h)[0] for h in self.gpu_header]

    def section_text(self, prefix: str) -> str:
        return "\n".join(find_section(self.secs, prefix)).rstrip("\n") + "\n"


def resolve(field: str, columns: dict[str, str], aliases: dict[str, list[str]]) -> str | None:
    """Requested name -> column name of the capture (direct, alias or old throttle name)."""
    candidates = [field, *aliases.get(field, [])]
    candidates.append(field.replace("clocks_throttle_", "clocks_event_"))
    if field in ("used_memory", "used_gpu_memory"):
        candidates += ["used_gpu_memory", "used_memory"]
    return next((c for c in candidates if c in columns), None)


def project(
    requested: list[str],
    rows: list[dict[str, str]],
    units: dict[str, str],
    aliases: dict[str, list[str]],
    fmt: set[str],
) -> str:
    columns = [resolve(f, units, aliases) for f in requested]
    lines = []
    if "noheader" not in fmt:
        heads = []
        for field, col in as_row(requested, columns).items():
            unit = units.get(col or "", "")
            heads.append(f"{field} [{unit}]" if unit else field)
        lines.append(", ".join(heads))
    for row in rows:
        values = []
        for col in columns:
            value = row.get(col or "", "")
            unit = units.get(col or "", "")
            if "nounits" in fmt and unit and value.endswith(" " + unit):
                value = value[: -len(unit) - 1]
            values.append(value)
        lines.append(", ".join(values))
    return "\n".join(lines) + "\n"


def parse_apps_spec(spec: str, gpu_rows: list[dict[str, str]], template: dict[str, str]) -> list:
    apps = []
    for item in spec.replace("\n", ",").split(","):
        item = item.strip()
        if not item or item == "none":
            continue
        parts = item.split(":")
        gpu = gpu_rows[int(parts[1]) if len(parts) > 1 else 0]
        mib = parts[2] if len(parts) > 2 else "1024"
        row = dict(template)
        row.update(
            pid=parts[0],
            gpu_uuid=gpu["uuid"],
            gpu_bus_id=gpu["pci.bus_id"],
            gpu_name=gpu.get("name", ""),
            process_name=row.get("process_name", "python3") or "python3",
            used_gpu_memory=f"{mib} MiB",
        )
        apps.append(row)
    return apps


def gpu_rows(capture: Capture, config: dict[str, str]) -> list[dict[str, str]]:
    count = int(config.get("GPUS") or 0)
    if count <= 0:
        rows = capture.gpu_rows
    else:
        rows = [replicate_gpu(capture.gpu_rows[0], i, count) for i in range(count)]
    return with_set_values(rows, set_spec(config))


def set_spec(config: dict[str, str]) -> str:
    if config.get("SET_FILE"):
        try:
            with open(config["SET_FILE"], encoding="utf-8") as handle:
                return handle.read().strip()
        except OSError:
            return ""
    return config.get("SET", "")


def with_set_values(rows: list[dict[str, str]], spec: str) -> list[dict[str, str]]:
    """The rows with "index:field=value;..." applied (the field must be a column)."""
    out = [dict(row) for row in rows]
    for item in filter(None, (part.strip() for part in spec.split(";"))):
        index, _, assignment = item.partition(":")
        field, sep, value = assignment.partition("=")
        matches = [row for row in out if row.get("index") == index.strip()]
        if not sep or not matches or field.strip() not in matches[0]:
            raise SystemExit(f"fake nvidia-smi: bad SET item {item!r}")
        matches[0][field.strip()] = value.strip()
    return out


def app_rows(capture: Capture, config: dict[str, str], gpus: list[dict[str, str]]) -> list:
    template = capture.app_rows[0] if capture.app_rows else {"timestamp": "", "gpu_serial": ""}
    spec = config.get("APPS")
    if config.get("APPS_FILE"):
        try:
            with open(config["APPS_FILE"], encoding="utf-8") as handle:
                spec = handle.read()
        except OSError:
            spec = "none"
    if spec is not None:
        return parse_apps_spec(spec, gpus, template)
    rows = []
    for gpu in gpus:  # every replicated GPU runs the captured apps, distinct PIDs
        offset = 100000 * int(gpu["index"]) if len(gpus) > 1 else 0
        for app in capture.app_rows:
            row = dict(app)
            row.update(gpu_uuid=gpu["uuid"], gpu_bus_id=gpu["pci.bus_id"])
            row["pid"] = str(int(app["pid"]) + offset)
            rows.append(row)
    return rows


def query_fields(arg: str) -> list[str]:
    return [f.strip() for f in arg.split("=", 1)[1].split(",") if f.strip()]


def answer(argv: list[str], config: dict[str, str]) -> tuple[int, str]:
    """(exit code, stdout) for one invocation."""
    capture = Capture(config["CAPTURE"], config.get("STATE") or "idle")
    fmt_arg = next((a for a in argv if a.startswith("--format=")), "")
    fmt = set(fmt_arg.split("=", 1)[1].split(",")) if fmt_arg else set()
    query = next((a for a in argv if a.startswith(("--query-gpu=", "--query-compute-apps="))), "")
    if query:
        if "csv" not in fmt:
            return 2, "\"--format=\" switch is missing. Please run 'nvidia-smi -h' for help.\n"
        requested = query_fields(query)
        is_gpu = query.startswith("--query-gpu=")
        units = capture.gpu_units if is_gpu else capture.app_units
        aliases = capture.gpu_aliases if is_gpu else capture.app_aliases
        unknown = {f.strip() for f in config.get("UNKNOWN_FIELDS", "").split(",") if f.strip()}
        for field in requested:
            if field in unknown or resolve(field, units, aliases) is None:
                return 2, f'Field "{field}" is not a valid field to query.\n\n'
        gpus = gpu_rows(capture, config)
        rows = gpus if is_gpu else app_rows(capture, config, gpus)
        return 0, project(requested, rows, units, aliases, fmt)
    if "--version" in argv:
        return 0, capture.section_text("capabilities :: version")
    if "-L" in argv or "--list-gpus" in argv:
        gpus = gpu_rows(capture, config)
        return 0, "".join(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})\n" for g in gpus)
    simple = {
        "-h": "capabilities :: help (-h)",
        "--help": "capabilities :: help (-h)",
        "--help-query-gpu": "capabilities :: help-query-gpu",
        "--help-query-compute-apps": "capabilities :: help-query-compute-apps",
        "-q": f"{capture.state} :: query (-q)",
    }
    for flag, title in simple.items():
        if flag in argv:
            return 0, capture.section_text(title)
    if not argv:
        return 0, capture.section_text(f"{capture.state} :: nvidia-smi (default table)")
    return 2, f"Invalid combination of input arguments: {' '.join(argv)}\n"


def log_call(config: dict[str, str], argv: list[str]) -> None:
    if config.get("CALL_LOG"):
        with open(config["CALL_LOG"], "a", encoding="utf-8") as handle:
            handle.write("\t".join(argv) + "\n")


def log_rusage(config: dict[str, str]) -> None:
    if config.get("RUSAGE_LOG"):
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with open(config["RUSAGE_LOG"], "a", encoding="utf-8") as handle:
            handle.write(f"{usage.ru_utime:.6f} {usage.ru_stime:.6f}\n")


def main(argv: list[str]) -> int:
    config = load_config(dict(os.environ))
    log_call(config, argv)
    mode = config.get("MODE") or "normal"
    try:
        if mode == "hang":  # like a wedged driver: never answers
            while True:
                time.sleep(3600)
        if mode == "crash":
            sys.stdout.write(DRIVER_DOWN)
            return 9
        if mode == "garbage":
            sys.stdout.write("\x00\x01 <html>?? lorem ipsum\n###\n\n%%%% 12, ,\n")
            return 0
        if not config.get("CAPTURE"):
            sys.stderr.write("fake nvidia-smi: FAKE_NVIDIA_SMI_CAPTURE is not set\n")
            return 99
        code, out = answer(argv, config)
        sys.stdout.write(out)
        return code
    finally:
        log_rusage(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
