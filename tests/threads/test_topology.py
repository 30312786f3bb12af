"""Where the thread count starts, on fake /sys trees and sysctl answers: the
machines this one is not (Apple silicon, Intel hybrid, SMT, a hidden /sys)."""

from __future__ import annotations

from pathlib import Path

from localllm.threads.topology import allowed_cpus, parse_cpu_list, start_threads


def fake_sys(root: Path, siblings: dict[int, str], pcores: str | None = None) -> Path:
    for cpu, sib in siblings.items():
        d = root / f"devices/system/cpu/cpu{cpu}/topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(sib + "\n")
    if pcores is not None:
        (root / "devices/cpu_core").mkdir(parents=True)
        (root / "devices/cpu_core/cpus").write_text(pcores + "\n")
    return root


def test_cpu_lists() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("5") == {5}


def test_smt_siblings_count_once(tmp_path: Path) -> None:
    """4 cores with 2 threads each: start at 4, may try up to 8."""
    sysfs = fake_sys(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    s = start_threads(system="Linux", machine="x86_64", sysfs=sysfs, allowed=set(range(8)))
    assert (s.threads, s.ceiling, s.why, s.note) == (4, 8, "4 physical cores", None)


def test_affinity_is_respected(tmp_path: Path) -> None:
    """Pinned to one CPU (as each xdist worker is): start and ceiling 1."""
    sysfs = fake_sys(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    s = start_threads(system="Linux", machine="x86_64", sysfs=sysfs, allowed={2})
    assert (s.threads, s.ceiling) == (1, 1)
    two_siblings = start_threads(system="Linux", machine="x86_64", sysfs=sysfs, allowed={1, 5})
    assert (two_siblings.threads, two_siblings.ceiling) == (1, 2)


def test_intel_hybrid_starts_from_the_p_cores_and_says_so(tmp_path: Path) -> None:
    """6 P-cores with hyper-threads (CPUs 0-11) and 8 E-cores (12-19)."""
    sib = {c: f"{c - c % 2},{c - c % 2 + 1}" for c in range(12)} | {c: str(c) for c in range(12, 20)}
    sysfs = fake_sys(tmp_path, sib, pcores="0-11")
    s = start_threads(system="Linux", machine="x86_64", sysfs=sysfs, allowed=set(range(20)))
    assert (s.threads, s.ceiling) == (6, 20)
    assert "P-cores" in s.why and s.note is not None and "E-cores" in s.note
    only_e = start_threads(system="Linux", machine="x86_64", sysfs=sysfs, allowed={12, 13})
    assert (only_e.threads, only_e.why) == (2, "2 physical cores")


def test_apple_silicon_starts_from_the_performance_cores() -> None:
    s = start_threads(system="Darwin", machine="arm64", allowed=set(range(10)),
                      sysctl=lambda name: "4" if name == "hw.perflevel0.physicalcpu" else None)
    assert (s.threads, s.ceiling, s.note) == (4, 10, None)
    assert "performance cores" in s.why
    broken = start_threads(system="Darwin", machine="arm64", allowed=set(range(10)), sysctl=lambda name: None, fallback=lambda: 10)
    assert broken.threads == 10 and broken.note is not None and "hw.perflevel0" in broken.note


def test_a_hidden_topology_falls_back_with_one_line(tmp_path: Path) -> None:
    s = start_threads(system="Linux", machine="x86_64", sysfs=tmp_path / "nothing", allowed={0, 1, 2}, fallback=lambda: 3)
    assert (s.threads, s.ceiling) == (3, 3)
    assert s.note is not None and "\n" not in s.note and "hidden" in s.note
    capped = start_threads(system="Linux", machine="x86_64", sysfs=tmp_path / "nothing", allowed={0}, fallback=lambda: 8)
    assert capped.threads == 1


def test_this_machine() -> None:
    """Whatever this machine is, a start within its affinity mask."""
    s = start_threads()
    assert 1 <= s.threads <= s.ceiling <= len(allowed_cpus())
