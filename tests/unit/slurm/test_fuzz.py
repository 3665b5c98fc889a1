"""Seeded, bounded fuzzing of the job parsers (and the other parsers) on the real captures.

Three properties, each over a few hundred deterministic iterations (fixed seed):

1. Free text cannot change attribution: random text - key=value fragments, per-node GRES
   groups, hostlist bombs, forged record heads, line breaks, separators - written into the
   free-text fields of `scontrol show job -d -o` records (JobName, Command, WorkDir, StdErr,
   StdIn, StdOut, Features, added Comment/AdminComment) never gives any job other GPUs, user,
   account or partition than the clean capture, and never adds a job. Without a complete
   forged head or a line break, nothing changes at all, not even for the mutated record.
2. Any mutation of any parser's input (byte flips, cuts, duplicated spans, inserted
   fragments): no exception, output bounded by the input and the MAX_* bounds, fast.
3. The same for the JSON job parser on mutated documents (wrong types, bombs, missing keys).
"""

from __future__ import annotations

import json
import random
import re
import time

import pytest
from conftest import exp, fixture_text, runner_for

SEED = 20261125
ITERATIONS = 300
# CPU seconds of this thread (time.thread_time), so that a loaded machine cannot fail the
# bound: generous for slow CI machines (typical: milliseconds).
TIME_PER_PARSE = 2.0

CAPTURES = {
    d: fixture_text(d, "scontrol_jobs.txt") for d in ("22.05", "22.05-after", "24.11", "26.05")
}
QUEUES = {d: exp.parse_squeue(fixture_text(d, "squeue.txt"))[0] for d in CAPTURES}
FREE_TEXT_KEYS = ("Command", "WorkDir", "StdErr", "StdIn", "StdOut", "Features")

FRAGMENTS = (
    "UserId=victim(4242)",
    "GroupId=victim(4242)",
    "Account=victim_acct",
    "Partition=vip",
    "JobState=RUNNING",
    "JobId=4242",
    "ArrayJobId=4242",
    "NodeList=gpu09",
    "JOB_GRES=gpu:a100:8",
    "  Nodes=gpu09 CPU_IDs=0 Mem=0 GRES=gpu:a100:8(IDX:0-7)",
    "Nodes=gpu09 CPU_IDs=0 GRES=gpu:a100:8(IDX:0-7)",
    "Nodes=a[0-99999]b[0-99999]",
    "GRES=gpu:1(IDX:0-99999)",
    "GRES=gpu:99999999999",
    "TRES=cpu=1,gres/gpu=8",
    'CrontabSpec="* * UserId=victim(4242)"',
    "=",
    "==",
    "(",
    ")",
    "[",
    "]",
    "\t",
    "\r",
    "\x1c",
    "\u2028",
    "  ",
)
# A complete record head: the only way free text can make a record ambiguous.
FORGED_HEAD = (
    "UserId=victim(4242) GroupId=victim(4242) MCS_label=N/A Account=victim_acct "
    "JobState=RUNNING Partition=vip NodeList=gpu09 JOB_GRES=gpu:a100:8   "
    "Nodes=gpu09 CPU_IDs=0 Mem=0 GRES=gpu:a100:8(IDX:0-7) MinCPUsNode=1"
)
ALPHABET = "abcXYZ019 _-=/:.,()[]*@%"


def junk(rng: random.Random, job_ids: list[str]) -> tuple[str, set[str]]:
    """Random free text and what it contains: {"forged", "newline"}."""
    parts: list[str] = []
    kinds: set[str] = set()
    for _ in range(rng.randint(1, 6)):
        roll = rng.random()
        if roll < 0.45:
            parts.append(rng.choice(FRAGMENTS))
        elif roll < 0.75:
            parts.append("".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 24))))
        elif roll < 0.88:
            parts.append(FORGED_HEAD)
            kinds.add("forged")
        else:
            job_id = rng.choice([*job_ids, "4242", "99999"])
            user = rng.choice(["victim(4242)", "root(0)", "slurm(64030)"])
            parts.append(f"\nJobId={job_id} JobName=y {FORGED_HEAD.replace('victim(4242)', user)}")
            kinds.add("newline")
    sep = rng.choice([" ", "", "  "])
    return sep.join(parts), kinds


def mutate_free_text(rng: random.Random, text: str) -> tuple[str, set[str], set[str]]:
    """Write junk into 1-3 free-text fields; returns (text, kinds, ids of mutated records)."""
    lines = text.split("\n")
    job_lines = [i for i, line in enumerate(lines) if line.startswith("JobId=")]
    job_ids = [re.match(r"JobId=(\d+)", lines[i]).group(1) for i in job_lines]
    kinds: set[str] = set()
    touched: set[str] = set()
    for _ in range(rng.randint(1, 3)):
        i = rng.choice(job_lines)
        line = lines[i]
        value, found = junk(rng, job_ids)
        field = rng.choice(["JobName", *FREE_TEXT_KEYS, "Comment", "AdminComment"])
        if field == "JobName":
            start = line.index("JobName=") + len("JobName=")
            end = line.index(" UserId=", start)
        elif field in ("Comment", "AdminComment"):
            at = line.index(" StdErr=") if " StdErr=" in line else len(line)
            line = f"{line[:at]} {field}= {line[at:]}"
            start = at + len(field) + 2
            end = start
        else:
            m = re.search(rf"(?<= ){field}=(\S*)", line)
            if m is None:
                continue
            start, end = m.start(1), m.end(1)
        lines[i] = line[:start] + value + line[end:]
        kinds |= found
        touched.add(re.match(r"JobId=(\d+)", line).group(1))
    return "\n".join(lines), kinds, touched


def view(jobs) -> dict[str, tuple]:
    return {
        j.job_id: (j.state, j.user, j.account, j.partition, j.array_job_id, j.allocations)
        for j in jobs
    }


def attributed(jobs, queue) -> dict[str, tuple]:
    kept, _ = exp.verify_jobs(jobs, queue)
    return {
        j.job_id: (j.user, j.account, j.partition, j.allocations)
        for j in kept
        if j.state == "RUNNING" and j.allocations
    }


def timed(parse, text: str):
    start = time.thread_time()
    out = parse(text)
    assert time.thread_time() - start < TIME_PER_PARSE
    return out


def check_bounded(jobs, text: str) -> None:
    assert len(jobs) <= text.count("\n") + 1
    assert sum(len(j.allocations) for j in jobs) <= exp.MAX_HOSTS_PER_SCRAPE
    for job in jobs:
        for alloc in job.allocations:
            assert len(alloc.indices) <= exp.MAX_GRES_INDICES
            assert 0 <= alloc.gpus <= exp.MAX_GPU_COUNT * 64


def test_free_text_never_changes_attribution():
    rng = random.Random(SEED)
    outcomes = {"identical": 0, "dropped": 0}
    for _ in range(ITERATIONS):
        name = rng.choice(sorted(CAPTURES))
        clean_text, queue = CAPTURES[name], QUEUES[name]
        clean = view(exp.parse_scontrol_jobs(clean_text)[0])
        clean_attr = attributed(exp.parse_scontrol_jobs(clean_text)[0], queue)
        text, kinds, touched = mutate_free_text(rng, clean_text)
        jobs, _bad = timed(exp.parse_scontrol_jobs, text)
        check_bounded(jobs, text)
        got_attr = attributed(jobs, queue)
        # Never a different owner, node, GPU count or index, never a new job.
        for job_id, value in got_attr.items():
            assert clean_attr.get(job_id) == value, (job_id, kinds, text)
        got = view(jobs)
        if "newline" not in kinds:
            # Records nobody wrote into are untouched; a mutated one is the same or, only
            # with a complete forged head, left out.
            for job_id, value in clean.items():
                if job_id in touched and "forged" in kinds:
                    assert got.get(job_id, value) == value, (job_id, text)
                else:
                    assert got.get(job_id) == value, (job_id, kinds, text)
            assert set(got) <= set(clean)
        if not kinds:
            assert got_attr == clean_attr
        outcomes["identical" if got_attr == clean_attr else "dropped"] += 1
    # Most mutations change nothing at all; the fuzz did reach both outcomes.
    assert outcomes["identical"] > ITERATIONS // 2 and outcomes["dropped"] > 0


def mutate_one_field(rng: random.Random, records: dict[str, str]) -> tuple[str, str, set[str]]:
    """Write junk into one free-text field of one record; (job id, field, junk kinds)."""
    job_id = rng.choice(sorted(records))
    line = records[job_id]
    value, kinds = junk(rng, sorted(records))
    if rng.random() < 0.3:
        # A clone of another job's record, all that squeue shows of it, other GPUs.
        victim = records[rng.choice(sorted(records))]
        clone = re.sub(r"IDX:[0-9-]+", "IDX:0-7", victim).replace("Nodes=", "Nodes=x", 1)
        value, kinds = f"x\n{clone}", {"newline"}
    field = rng.choice(["JobName", *FREE_TEXT_KEYS, "Comment"])
    if field == "JobName":
        start = line.index("JobName=") + len("JobName=")
        end = line.index(" UserId=", start)
    elif field == "Comment":
        at = line.index(" StdErr=") if " StdErr=" in line else len(line)
        line = f"{line[:at]} Comment= {line[at:]}"
        start = end = at + len(" Comment=")
    else:
        m = re.search(rf"(?<= ){field}=(\S*)", line)
        if m is None:
            return job_id, field, set()
        start, end = m.start(1), m.end(1)
    records[job_id] = line[:start] + value + line[end:]
    return job_id, field, kinds


def collected_jobs(capture: str, records: dict[str, str]) -> dict[str, tuple]:
    """What the collector keeps from a job table made of ``records``: the whole table, and
    `scontrol show job -d -o ID` answered with that job's own record (issue 26 finding 2)."""
    base = runner_for(capture, texts={"scontrol_jobs": "\n".join(records.values()) + "\n"})
    table = exp.COMMANDS["scontrol_jobs"]

    def run(argv: list[str], timeout: float) -> exp.CommandResult:
        if argv[:-1] == table:
            return exp.CommandResult(records.get(argv[-1], "") + "\n", 0.01, None)
        return base(argv, timeout)

    collector = exp.Collector(runner=run, job_source="text")
    collector.collect()
    jobs = collector.status["scontrol_jobs"].result
    kept, _ = exp.verify_jobs(jobs, collector.status["squeue"].result)
    return view(kept)


def test_free_text_of_one_job_never_changes_another_jobs_values():
    """Seeded, bounded: random user text (forged heads, forged records with other jobs' ids,
    key=value fragments, separators) in any one free-text field of one job never changes
    or removes any other job's parsed values, and leaves the writer's own job as it was
    unless a line break in its name cuts its own record before its head."""
    rng = random.Random(f"{SEED}-one-field")
    lost_own = 0
    for _ in range(ITERATIONS // 2):
        capture = rng.choice(sorted(CAPTURES))
        lines = [x for x in CAPTURES[capture].split("\n") if x.startswith("JobId=")]
        clean = {re.match(r"JobId=(\d+)", x).group(1): x for x in lines}
        before = collected_jobs(capture, clean)
        records = dict(clean)
        job_id, field, kinds = mutate_one_field(rng, records)
        after = collected_jobs(capture, records)
        for other, value in before.items():
            if other != job_id:
                assert after.get(other) == value, (other, field, records[job_id])
        assert set(after) <= set(before)
        if field == "JobName" and "newline" in kinds:
            lost_own += job_id not in after
        else:
            assert after.get(job_id) == before.get(job_id), (field, records[job_id])
    assert lost_own > 0  # the fuzz did write line breaks into names


def mutate_anywhere(rng: random.Random, text: str) -> str:
    data = list(text)
    for _ in range(rng.randint(1, 8)):
        if not data:
            data = list(rng.choice(FRAGMENTS))
        op = rng.random()
        i = rng.randrange(len(data))
        if op < 0.25:
            data[i] = rng.choice(ALPHABET + "\n|")
        elif op < 0.45:
            del data[i : i + rng.randint(1, 40)]
        elif op < 0.65:
            data[i:i] = data[i : i + rng.randint(1, 200)]
        elif op < 0.9:
            data[i:i] = list(rng.choice([*FRAGMENTS, FORGED_HEAD, "n[0-65535]", "\n"]))
        else:
            del data[i:]
    return "".join(data)


PARSER_INPUTS = {
    "sinfo_nodes": ("22.05", "synthesized", "24.11", "26.05"),
    "squeue": ("22.05", "22.05-after", "24.11", "26.05"),
    "scontrol_jobs": ("22.05", "22.05-after", "synthesized", "24.11", "26.05"),
    "sdiag": ("22.05", "24.11", "26.05"),
    "sshare": ("synthesized", "26.05"),
}


@pytest.mark.parametrize("name", sorted(PARSER_INPUTS))
def test_mutated_input_never_raises_and_stays_bounded(name):
    rng = random.Random(f"{SEED}-{name}")
    parse = exp.PARSERS[name]
    files = {"sinfo_nodes": "sinfo_nodes.txt", "scontrol_jobs": "scontrol_jobs.txt"}
    texts = [fixture_text(d, files.get(name, f"{name}.txt")) for d in PARSER_INPUTS[name]]
    for _ in range(ITERATIONS):
        text = mutate_anywhere(rng, rng.choice(texts))
        result, bad = timed(parse, text)
        assert bad >= 0
        if isinstance(result, list):
            assert len(result) <= text.count("\n") + 1
        if name == "scontrol_jobs":
            check_bounded(result, text)


def mutate_json(rng: random.Random, doc: object, depth: int = 0) -> object:
    if isinstance(doc, dict):
        out = {}
        for key, value in doc.items():
            roll = rng.random()
            if roll < 0.05:
                continue  # drop the key
            out[key] = mutate_json(rng, value, depth + 1) if roll < 0.85 else random_value(rng)
        return out
    if isinstance(doc, list):
        items = [mutate_json(rng, v, depth + 1) for v in doc]
        if items and rng.random() < 0.2:
            items.append(rng.choice(items))  # a duplicate job, a longer gres_detail
        return items
    if rng.random() < 0.15:
        return random_value(rng)
    return doc


def random_value(rng: random.Random) -> object:
    return rng.choice(
        [
            None,
            True,
            -1,
            0,
            2**70,
            1.5,
            "",
            "RUNNING",
            ["RUNNING"],
            ["RUNNING", "COMPLETING"],
            "a[0-99999]b[0-99999]",
            "gpu[00000-70000]",
            ["gpu:1(IDX:0-99999)"],
            ["gpu:a100:8(IDX:0-7)"] * 3,
            {"set": True, "number": 7},
            {"set": False},
            {"list": "gpu[1-3]"},
            {},
            [],
        ]
    )


@pytest.mark.parametrize(
    ("fixture_dir", "name"),
    [
        ("synthesized-json", "scontrol_jobs.json"),
        ("24.11", "scontrol_jobs_json.txt"),
        ("26.05", "scontrol_jobs_json.txt"),
    ],
)
def test_mutated_json_never_raises_and_stays_bounded(fixture_dir, name):
    rng = random.Random(f"{SEED}-{name}")
    doc = json.loads(fixture_text(fixture_dir, name))
    for _ in range(ITERATIONS):
        text = json.dumps(mutate_json(rng, doc))
        if rng.random() < 0.2:
            text = mutate_anywhere(rng, text)  # mostly not JSON any more
        jobs, bad = timed(exp.parse_scontrol_jobs_json, text)
        assert bad >= 0 and len(jobs) <= len(doc["jobs"]) * 2
        check_bounded(jobs, "\n" * len(jobs))
        for job in jobs:
            assert job.state == "RUNNING" or not job.allocations  # only running jobs hold GPUs
