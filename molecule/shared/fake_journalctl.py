#!/usr/bin/python3
"""Test double of ``journalctl -k -b -o json`` for the GPU collector's journald source.

A container's journal holds no kernel records, and none can be written from user space
(that is the point of the origin check). This double answers the collector's query from
JOURNAL, one journal entry (JSON) per line, each given the cursor "test-<line number>";
``--after-cursor=`` answers the entries after that one. A test appends entries: the
kernel's own (``_TRANSPORT=kernel``, ``SYSLOG_FACILITY=0``) and forged ones. Every other
argument is ignored. As journalctl: exit 1 with no output when the boot has no entries.
"""

import json
import sys

JOURNAL = "/var/lib/gpufleet-test/kernel-journal.jsonl"


def main(argv: list[str]) -> int:
    after = next((a.split("=", 1)[1] for a in argv if a.startswith("--after-cursor=")), None)
    try:
        with open(JOURNAL, encoding="utf-8") as handle:
            lines = [line for line in handle.read().splitlines() if line.strip()]
    except FileNotFoundError:
        lines = []
    if not lines:
        return 1
    out, started = [], after is None
    for number, line in enumerate(lines):
        entry = json.loads(line)
        entry["__CURSOR"] = f"test-{number}"
        if started:
            out.append(json.dumps(entry))
        started = started or entry["__CURSOR"] == after
    if out:
        print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
