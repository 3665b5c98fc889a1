"""Job summaries stored at the job's end, for jobs Prometheus no longer holds.

The slurmctld epilog (src/gpufleet_node/job_summary) writes the figures ``gpufleet
jobstats`` shows into the job's AdminComment (``GF1:`` + base64 of zlib'd JSON, format in
:mod:`gpufleet_node.job_summary.summary`). Read back from ``sacct`` where it runs here,
or from a file holding the text. The text is hostile (any Slurm admin may set
AdminComment): decoding is bounded and checked; every failure is one line.
"""

from __future__ import annotations

import shutil
from dataclasses import fields

from gpufleet.jobstats.collect import Figures
from gpufleet.jobstats.discover import JobPlace
from gpufleet_node.commands import run_command
from gpufleet_node.job_summary.summary import (
    MAX_ENCODED,
    PREFIX,
    JobIdentity,
    Summary,
    SummaryError,
    decode,
)

SACCT_TIMEOUT_S = 60
MAX_READ = MAX_ENCODED + 4096  # the summary and a line or two of anything else


class NoSummary(Exception):
    """No usable summary; the message is one line."""


Found = tuple[Summary, list[str]]  # the summary, and one note per newer unreadable line


def from_text(text: str, job_id: str, where: str) -> Found:
    """The job's summary among ``text``'s lines: the last one that is valid (a reused id's
    newest). A corrupt or foreign line after it does not hide it: each is named in a note.
    """
    lines = [line for line in text.splitlines() if line.strip().startswith(PREFIX)]
    if not lines:
        raise NoSummary(f"job {job_id}: {where} holds no gpufleet summary")
    failed: list[tuple[int, SummaryError]] = []
    for number, line in reversed(list(enumerate(lines, 1))):
        try:
            summary = decode(line, job_id)
        except SummaryError as err:
            failed.append((number, err))
            continue
        notes = [
            f"job {job_id}: {where}: summary {k} of {len(lines)} unreadable ({err}): "
            f"showing summary {number}, the newest readable"
            for k, err in failed
        ]
        return summary, notes
    if len(lines) == 1:
        raise NoSummary(f"job {job_id}: {where}: unreadable summary: {failed[0][1]}")
    raise NoSummary(
        f"job {job_id}: {where}: none of its {len(lines)} summaries is readable "
        f"(the newest: {failed[0][1]})"
    )


def from_file(path: str, job_id: str) -> Found:
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_READ + 1)
    except OSError as err:
        raise NoSummary(f"--summary {path}: {err.strerror or err}") from err
    if len(raw) > MAX_READ:
        raise NoSummary(f"--summary {path}: larger than {MAX_READ} bytes: not a summary")
    return from_text(raw.decode("utf-8", "replace"), job_id, f"--summary {path}")


def sacct_available() -> bool:
    return shutil.which("sacct") is not None


SACCT_MAX_OUTPUT = 16 * MAX_READ  # an array's or a reused id's rows; more is not sacct's


def from_sacct(job_id: str) -> Found:
    """The row of ``sacct -j JOBID -X -n -P -o JobIDRaw,AdminComment`` whose JobIDRaw is
    the job (-j of an array's id lists all its tasks; -j implies no start bound)."""
    rows = _sacct_rows(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobIDRaw,AdminComment"])
    mine = [comment for raw, comment in rows if raw == job_id]
    if not mine:
        raise NoSummary(f"job {job_id}: sacct does not list the job")
    return from_text("\n".join(mine), job_id, "sacct")


def _sacct_rows(argv: list[str]) -> list[tuple[str, str]]:
    """sacct's (first field, rest) rows; sacct is killed past SACCT_MAX_OUTPUT bytes or
    SACCT_TIMEOUT_S. A line longer than MAX_READ is no row: a summary is shorter."""
    job = argv[2]
    done = run_command(argv, SACCT_TIMEOUT_S, max_output=SACCT_MAX_OUTPUT)
    if done.error == "output_limit":
        raise NoSummary(f"job {job}: sacct printed more than {SACCT_MAX_OUTPUT} bytes")
    said = " ".join(done.stderr.split())[:200]
    if done.error == "timeout":
        raise NoSummary(f"job {job}: sacct: no answer in {SACCT_TIMEOUT_S} s")
    if done.error in ("not_found", "exec_error"):
        raise NoSummary(f"job {job}: sacct: {said or done.error.replace('_', ' ')}")
    if done.error is not None:
        raise NoSummary(f"job {job}: sacct failed ({done.returncode}): {said or 'no message'}")
    rows = []
    for line in done.stdout.splitlines():
        if len(line) <= MAX_READ:
            raw, _, comment = line.partition("|")
            rows.append((raw, comment))
    return rows


def place_and_figures(summary: Summary) -> tuple[JobPlace, Figures]:
    """The summary as the live report's inputs (verdict and advice are computed again)."""
    indices: dict[str, list[str]] = {}
    for node, gpu in summary.gpus:
        indices.setdefault(node, []).append(gpu)
    identity = {item.name: getattr(summary, item.name) for item in fields(JobIdentity)}
    place = JobPlace(
        **identity,
        gpus_allocated={node: count for node, (count, _) in summary.nodes.items()},
        gpu_indices={node: sorted(gpus, key=int) for node, gpus in indices.items()},
    )
    figures = Figures(
        {key: {k: v for k, v in values.items() if v is not None}
         for key, values in summary.gpus.items()},
        {node: {k: v for k, v in values.items() if v is not None}
         for node, (_, values) in summary.nodes.items()},
        list(summary.faults),
    )  # fmt: skip
    return place, figures
