"""Usable cores from the affinity mask and the cgroup CPU quota, on fake cgroup trees laid out as
Docker, Kubernetes and systemd lay them out (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from dfine_deploy import cores


def tree(root: Path, files: dict[str, str], own: str = "0::/\n") -> tuple[Path, Path]:
    """A fake /sys/fs/cgroup under `root` and a fake /proc/self/cgroup naming `own`."""
    for name, text in files.items():
        path = root / "cgroup" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "cgroup").mkdir(exist_ok=True)
    (root / "self_cgroup").write_text(own)
    return root / "cgroup", root / "self_cgroup"


def limits(root: Path, files: dict[str, str], own: str = "0::/\n", affinity: int = 64) -> cores.CoreLimits:
    cgroup_root, proc_cgroup = tree(root, files, own)
    return cores.read_limits(cgroup_root, proc_cgroup, affinity=affinity)


def test_a_cgroup_v2_quota_of_two_cpus_on_a_64_core_host_gives_two(tmp_path):
    found = limits(tmp_path, {"cpu.max": "200000 100000\n"})
    assert found.quota == 2.0 and found.usable == 2
    assert found.quota_file == str(tmp_path / "cgroup" / "cpu.max")
    assert "cgroup CPU quota 2" in found.describe()


def test_a_cgroup_v1_quota_in_the_joined_cpu_cpuacct_folder(tmp_path):
    files = {"cpu,cpuacct/cpu.cfs_quota_us": "150000\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}
    found = limits(tmp_path, files, own="12:cpu,cpuacct:/docker/0123abcd\n")
    assert found.quota == 1.5 and found.usable == 1  # 1.5 CPUs keep one thread busy unthrottled


def test_a_cgroup_v1_cpu_folder_without_a_quota(tmp_path):
    files = {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}
    found = limits(tmp_path, files, own="1:cpu:/\n", affinity=8)
    assert found.quota is None and found.usable == 8


def test_no_quota_leaves_the_affinity_mask(tmp_path):
    found = limits(tmp_path, {"cpu.max": "max 100000\n"}, affinity=3)
    assert found.quota is None and found.usable == 3


def test_the_affinity_mask_wins_when_it_is_the_lower(tmp_path):
    assert limits(tmp_path, {"cpu.max": "800000 100000\n"}, affinity=4).usable == 4


def test_a_quota_below_one_cpu_still_gives_one_thread(tmp_path):
    assert limits(tmp_path, {"cpu.max": "50000 100000\n"}).usable == 1


def test_a_quota_on_a_parent_slice_applies_to_the_service_below_it(tmp_path):
    files = {
        "system.slice/cpu.max": "400000 100000\n",
        "system.slice/app.service/cpu.max": "max 100000\n",
    }
    found = limits(tmp_path, files, own="0::/system.slice/app.service\n")
    assert found.usable == 4 and found.quota_file.endswith("system.slice/cpu.max")


def test_a_host_path_missing_from_a_containers_view_reads_the_containers_own_root(tmp_path):
    found = limits(tmp_path, {"cpu.max": "300000 100000\n"}, own="0::/kubepods/burstable/pod42/abc\n")
    assert found.usable == 3


def test_no_cgroup_files_at_all(tmp_path):
    found = cores.read_limits(tmp_path / "absent", tmp_path / "absent_self", affinity=2)
    assert found.quota is None and found.usable == 2


def test_a_malformed_quota_file_is_named_and_ignored(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="dfine_deploy.cores"):
        found = limits(tmp_path, {"cpu.max": "lots 100000\n"}, affinity=6)
    assert found.usable == 6
    assert str(tmp_path / "cgroup") in caplog.text and "not a CPU quota" in caplog.text


def test_pool_threads_are_left_to_the_library_only_on_an_unrestricted_machine(monkeypatch):
    host = cores.read_limits().host
    monkeypatch.setattr(cores, "read_limits", lambda: cores.CoreLimits(host=host, affinity=host, quota=None))
    assert cores.pool_threads() is None
    quota = cores.CoreLimits(host=64, affinity=64, quota=2.0, quota_file="cpu.max")
    monkeypatch.setattr(cores, "read_limits", lambda: quota)
    assert cores.pool_threads() == 2 and cores.usable_cores() == 2


def test_this_process_is_read_from_the_real_tree():
    found = cores.read_limits()
    assert found.affinity == len(os.sched_getaffinity(0)) and 1 <= found.usable <= found.affinity
