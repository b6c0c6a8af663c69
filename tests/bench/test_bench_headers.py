"""Every bench states the machine it ran on (CPU model, the vector flags that matter, the thread
count; the GPU on a GPU run) through the one helper, bench/machine.py; and that helper's record
and header line have those fields. Fast: no bench is timed, only sources read and one tiny run."""
from __future__ import annotations

import pytest

from tests.bench import BENCH, load_bench

BENCHES = sorted(p.stem for p in BENCH.glob("bench_*.py"))
# these print bench_runtime.machine(device), which is machine_header's line with torch's version
VIA_RUNTIME = {"bench_dtypes", "bench_trees", "bench_memory", "bench_gpu_quant", "bench_scale"}


@pytest.fixture()
def machine(monkeypatch):
    module = load_bench("machine")
    monkeypatch.setattr(module, "cpu_model_and_flags", lambda wanted: ("Test CPU 9000", [
        f for f in wanted if f in ("avx2", "fma", "avx512f")]))
    return module


def test_the_record_has_the_cpu_its_flags_and_the_threads(machine):
    info = machine.machine_info(2)
    assert info["cpu"] == "Test CPU 9000" and info["cpu_flags"] == ["avx2", "fma", "avx512f"]
    assert info["num_threads"] == 2 and info["cpus"] and info["gpu"] is None
    assert set(machine.CPU_FLAGS) >= {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
                                      "avx512_vnni", "amx_tile"}


def test_the_header_line_names_the_flags_present_and_absent_and_the_threads(machine):
    line = machine.machine_header(machine.machine_info(2))
    assert "\n" not in line and "Test CPU 9000" in line and "threads: 2" in line and "GPU" not in line
    present, _, absent = line.partition("(no ")
    assert "avx2 fma avx512f" in present and "avx512bw" in absent and "amx_tile" in absent
    assert "threads: 1, 2" in machine.machine_header(machine.machine_info([1, 2]))
    assert machine.machine_header({**machine.machine_info(1), "gpu": "H100"}).endswith("; GPU: H100")


def test_a_cpu_device_needs_no_gpu_lookup(machine):
    assert machine.gpu_name(None) is None and machine.gpu_name("cpu") is None


def test_a_gpu_run_names_the_gpu(machine, monkeypatch):
    torch = pytest.importorskip("torch")
    seen = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: seen.append(device) or "Fake GPU 80GB")
    info = machine.machine_info(4, "cuda:1")
    assert info["gpu"] == "Fake GPU 80GB" and seen == [torch.device("cuda:1")]
    assert machine.machine_header(info).endswith("threads: 4; GPU: Fake GPU 80GB")


@pytest.mark.parametrize("name", BENCHES)
def test_every_bench_states_the_machine_through_the_shared_helper(name):
    source = (BENCH / f"{name}.py").read_text()
    assert "from bench.machine import" in source, name
    assert "machine_info(" in source, name  # the JSON's keys (or, without JSON, the header's record)
    if name in VIA_RUNTIME:
        assert "from bench_runtime import" in source and "machine(" in source, name
    else:
        assert "machine_header(" in source, name
    # no copy of its own: the model, the flags and their list come from bench/machine.py
    assert "/proc/cpuinfo" not in source and "cpu_model_and_flags" not in source, name


def test_bench_runtime_builds_its_line_on_the_shared_header():
    source = (BENCH / "bench_runtime.py").read_text()
    assert "machine_header(machine_info(" in source


def test_a_tiny_candidates_run_prints_the_header(capsys):
    bench = load_bench("bench_candidates")
    assert bench.main(["--lengths", "64", "--steps", "3", "--synthetic", "--implementation", "python"]) == 0
    out = capsys.readouterr().out
    assert "CPU: " in out and "flags: " in out and "threads: 1" in out
