"""The nvidia-smi test double itself."""

from __future__ import annotations

from gpu_helpers import H100, H100_MIG, RTX4080


def test_projection_with_units_and_aliases(fake_smi):
    result = fake_smi.run(
        "--query-gpu=index,memory.total,power.draw,clocks.gr,clocks_throttle_reasons.active",
        "--format=csv",
    )
    assert result.returncode == 0
    assert result.stdout.splitlines() == [
        "index, memory.total [MiB], power.draw [W], clocks.gr [MHz], "
        "clocks_throttle_reasons.active",
        "0, 81559 MiB, 69.85 W, 345 MHz, 0x0000000000000001",
    ]


def test_nounits_noheader(fake_smi):
    fake_smi.set(state="load")
    result = fake_smi.run(
        "--query-gpu=power.draw,utilization.gpu,pstate", "--format=csv,noheader,nounits"
    )
    assert result.stdout == "631.95, 100, P0\n"


def test_nounits_keeps_units_in_header(fake_smi):
    result = fake_smi.run("--query-gpu=memory.used", "--format=csv,nounits")
    assert result.stdout == "memory.used [MiB]\n0\n"


def test_unknown_field_like_real_nvidia_smi(fake_smi):
    result = fake_smi.run("--query-gpu=index,bogus.field", "--format=csv")
    assert result.returncode == 2
    assert 'Field "bogus.field" is not a valid field to query.' in result.stdout
    fake_smi.set(unknown_fields="gpu_recovery_action")
    result = fake_smi.run("--query-gpu=gpu_recovery_action", "--format=csv")
    assert result.returncode == 2


def test_replicated_gpus(fake_smi):
    fake_smi.set(gpus=8)
    result = fake_smi.run("--query-gpu=index,uuid,pci.bus_id,count", "--format=csv,noheader")
    rows = [line.split(", ") for line in result.stdout.splitlines()]
    assert [r[0] for r in rows] == [str(i) for i in range(8)]
    assert len({r[1] for r in rows}) == 8
    assert len({r[2] for r in rows}) == 8
    assert {r[3] for r in rows} == {"8"}
    listing = fake_smi.run("-L").stdout.splitlines()
    assert len(listing) == 8 and listing[7].startswith("GPU 7: NVIDIA H100 80GB HBM3 (UUID: GPU-")


def test_compute_apps_from_capture_and_override(fake_smi, tmp_path):
    fake_smi.set(capture=RTX4080, state="load")
    result = fake_smi.run("--query-compute-apps=pid,process_name,used_memory", "--format=csv")
    assert result.stdout.splitlines() == [
        "pid, process_name, used_memory [MiB]",
        "2165, /usr/bin/kwin_wayland, 25 MiB",
        "5022, ffmpeg, 503 MiB",
        "5021, ffmpeg, 360 MiB",
    ]
    apps = tmp_path / "apps"
    apps.write_text("4242:0:77\n")
    fake_smi.set(apps_file=apps)
    result = fake_smi.run("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    assert result.stdout == "4242, 77\n"


def test_idle_compute_apps_prints_only_the_header(fake_smi):
    fake_smi.set(capture=H100_MIG)
    result = fake_smi.run("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv")
    assert result.stdout == "gpu_uuid, pid, used_memory [MiB]\n"


def test_version_and_modes(fake_smi):
    assert "DRIVER version      : 590.48.01" in fake_smi.run("--version").stdout
    fake_smi.set(mode="crash")
    result = fake_smi.run("-L")
    assert result.returncode == 9 and "couldn't communicate" in result.stdout


def test_config_file_when_env_unset(fake_smi, tmp_path, monkeypatch):
    conf = tmp_path / "fake.conf"
    conf.write_text(
        f"# test host\nFAKE_NVIDIA_SMI_CAPTURE={H100}\nFAKE_NVIDIA_SMI_GPUS=2\nSTATE=load\n"
    )
    monkeypatch.delenv("FAKE_NVIDIA_SMI_CAPTURE")
    monkeypatch.delenv("FAKE_NVIDIA_SMI_STATE")
    monkeypatch.setenv("FAKE_NVIDIA_SMI_CONFIG", str(conf))
    result = fake_smi.run("--query-gpu=index,power.draw", "--format=csv,noheader")
    assert result.stdout == "0, 631.95 W\n1, 631.95 W\n"
