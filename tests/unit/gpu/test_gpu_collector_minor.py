"""Device minor numbers (/dev/nvidiaN): the key Slurm's GRES index means.

The fixture node has two GPUs whose minor numbers are the reverse of their nvidia-smi
indices (jobstats issue #34); the collector must report each GPU's own minor.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gpu_helpers import DATA, gc, values_of

INFORMATION = (DATA / "nvidia-gpu-information.txt").read_text()
# The fake nvidia-smi puts GPU index 0 at bus 0x18 and index 1 at bus 0x2A.
BUS_DIRS = ("0000:18:00.0", "0000:2a:00.0")


def _driver_file(proc: Path, bus_dir: str, minor: str | int, text: str = INFORMATION) -> None:
    directory = proc / "driver" / "nvidia" / "gpus" / bus_dir
    directory.mkdir(parents=True, exist_ok=True)
    body = text.replace("Device Minor: \t 1", f"Device Minor: \t {minor}")
    (directory / "information").write_text(body.replace("0000:18:00.0", bus_dir))


def _swapped(tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    _driver_file(proc, BUS_DIRS[0], 1)
    _driver_file(proc, BUS_DIRS[1], 0)
    return proc


def test_minor_number_differs_from_index(fake_smi, run_collector, tmp_path):
    fake_smi.set(gpus=2)
    text = run_collector("--proc-root", str(_swapped(tmp_path)))
    assert values_of(text, "node_gpu_info", gpu="0", minor_number="1") == [1]
    assert values_of(text, "node_gpu_info", gpu="1", minor_number="0") == [1]
    assert len(values_of(text, "node_gpu_info")) == 2
    # Other series keep their labels: the minor is on the info series only.
    assert "minor_number" not in "".join(
        line for line in text.splitlines() if not line.startswith("node_gpu_info{")
    )


def test_no_driver_file_no_label(fake_smi, run_collector, tmp_path):
    fake_smi.set(gpus=2)
    proc = tmp_path / "proc"
    _driver_file(proc, BUS_DIRS[1], 0)
    text = run_collector("--proc-root", str(proc))
    assert values_of(text, "node_gpu_info", gpu="1", minor_number="0") == [1]
    (gpu0,) = [line for line in text.splitlines() if line.startswith('node_gpu_info{gpu="0"')]
    assert "minor_number" not in gpu0


def test_a_minor_claimed_twice_is_dropped(fake_smi, run_collector, tmp_path):
    fake_smi.set(gpus=2)
    proc = tmp_path / "proc"
    _driver_file(proc, BUS_DIRS[0], 3)
    _driver_file(proc, BUS_DIRS[1], 3)
    text = run_collector("--proc-root", str(proc))
    assert len(values_of(text, "node_gpu_info")) == 2
    assert "minor_number" not in text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Device Minor: \t 255\n",  # nvidiactl, not a GPU
        "Device Minor: \t 1000\n",
        "Device Minor: \t -1\n",
        "Device Minor: \t 1x\n",
        "Device Minor: \t 1\nDevice Minor: \t 2\n",  # which one?
        "device minor: 1\n",
        "Device Minor: \t \u0661\n",  # a non-ASCII digit
        "Model: x\n" + "X" * gc.DRIVER_INFO_MAX_BYTES + "\nDevice Minor: 1\n",  # over the bound
    ],
)
def test_hostile_driver_files_give_no_minor(tmp_path, text):
    directory = tmp_path / "driver" / "nvidia" / "gpus" / BUS_DIRS[0]
    directory.mkdir(parents=True)
    (directory / "information").write_text(text)
    assert gc.read_device_minor(str(tmp_path), "00000000:18:00.0") is None


def test_reads_the_fixture_and_normalises_the_bus_id(tmp_path):
    _driver_file(tmp_path, BUS_DIRS[0], 1)
    assert gc.read_device_minor(str(tmp_path), "00000000:18:00.0") == "1"
    assert gc.driver_info_dir("00000000:3B:00.0") == "0000:3b:00.0"
    assert gc.driver_info_dir("00010000:3B:00.1") == "10000:3b:00.1"
    for bad in ("", "../../etc/passwd", "0000:3b:00.0/../x", "00000000:3B:00.8"):
        assert gc.driver_info_dir(bad) is None


def test_directory_in_place_of_the_file(tmp_path):
    (tmp_path / "driver" / "nvidia" / "gpus" / BUS_DIRS[0] / "information").mkdir(parents=True)
    assert gc.read_device_minor(str(tmp_path), "00000000:18:00.0") is None
