"""Job summaries stored at the job's end, for jobs Prometheus no longer holds.

The slurmctld epilog (src/gpufleet_node/job_summary) writes the figures ``gpufleet
jobstats`` shows into the job's AdminComment (``GF1:`` + base64 of zlib'd JSON, format in
:mod:`gpufleet_node.job_summary.summary`). Read back from ``sacct`` where it runs here,
or from a file holding the text. The text is hostile (any Slurm admin may set
AdminComment): decoding is bounded and checked; every failure is one line.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import threading
from typing import IO, cast

from gpufleet.jobstats.collect import Figures
from gpufleet.jobstats.discover import JobPlace
from gpufleet_node.job_summary.summary import MAX_ENCODED, PREFIX, Summary, SummaryError, decode

SACCT_TIMEOUT_S = 60
MAX_READ = MAX_ENCODED + 4096  # the summary and a line or two of anything else


class NoSummary(Exception):
    """No usable summary; the message is one line."""


def from_text(text: str, job_id: str, where: str) -> Summary:
    """The job's summary among ``text``'s lines (the last valid one: a reused id's newest)."""
    lines = [line for line in text.splitlines() if line.strip().startswith(PREFIX)]
    if not lines:
        raise NoSummary(f"job {job_id}: {where} holds no gpufleet summary")
    try:
        return decode(lines[-1], job_id)
    except SummaryError as err:
        raise NoSummary(f"job {job_id}: {where}: unreadable summary: {err}") from err


def from_file(path: str, job_id: str) -> Summary:
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


def from_sacct(job_id: str) -> Summary:
    """The row of ``sacct -j JOBID -X -n -P -o JobIDRaw,AdminComment`` whose JobIDRaw is
    the job (-j of an array's id lists all its tasks; -j implies no start bound)."""
    rows = _sacct_rows(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "JobIDRaw,AdminComment"])
    mine = [comment for raw, comment in rows if raw == job_id]
    if not mine:
        raise NoSummary(f"job {job_id}: sacct does not list the job")
    return from_text("\n".join(mine), job_id, "sacct")


def _sacct_rows(argv: list[str]) -> list[tuple[str, str]]:
    """sacct's (first field, rest) rows, read as they come with SACCT_MAX_OUTPUT bytes at
    most in memory (sacct is killed past it or after SACCT_TIMEOUT_S)."""
    job = argv[2]
    with tempfile.TemporaryFile() as errors:
        try:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors)
        except OSError as err:
            raise NoSummary(f"job {job}: sacct: {err}") from err
        timer = threading.Timer(SACCT_TIMEOUT_S, proc.kill)
        timer.start()
        rows: list[tuple[str, str]] = []
        size, whole, too_much = 0, True, False
        stdout = cast(IO[bytes], proc.stdout)  # stdout=PIPE: never None
        try:
            while True:
                line = stdout.readline(MAX_READ + 1)
                if not line:
                    break
                size += len(line)
                if size > SACCT_MAX_OUTPUT:
                    too_much = True
                    proc.kill()
                    break
                # A piece of a line longer than MAX_READ is no row (nor is what follows it).
                starts_row, whole = whole, line.endswith(b"\n")
                if starts_row and whole:
                    raw, _, comment = line.decode("utf-8", "replace").rstrip("\n").partition("|")
                    rows.append((raw, comment))
        finally:
            timer.cancel()
            stdout.close()
            code = proc.wait()
        if too_much:
            raise NoSummary(f"job {job}: sacct printed more than {SACCT_MAX_OUTPUT} bytes")
        if code != 0:
            errors.seek(0)
            said = " ".join(errors.read(4096).decode("utf-8", "replace").split())[:200]
            raise NoSummary(f"job {job}: sacct failed ({code}): {said or 'killed'}")
    return rows


def place_and_figures(summary: Summary) -> tuple[JobPlace, Figures]:
    """The summary as the live report's inputs (verdict and advice are computed again)."""
    indices: dict[str, list[str]] = {}
    for node, gpu in summary.gpus:
        indices.setdefault(node, []).append(gpu)
    place = JobPlace(
        job_id=summary.job_id,
        user=summary.user,
        account=summary.account,
        partition=summary.partition,
        cluster=summary.cluster,
        start=summary.start,
        end=summary.end,
        gpus_allocated={node: count for node, (count, _) in summary.nodes.items()},
        gpu_indices={node: sorted(gpus, key=int) for node, gpus in indices.items()},
    )
    figures = Figures(
        {key: {k: v for k, v in values.items() if v is not None}
         for key, values in summary.gpus.items()},
        {node: {k: v for k, v in values.items() if v is not None}
         for node, (_, values) in summary.nodes.items()},
    )  # fmt: skip
    return place, figures
