"""build.sh --torch_compile inductor: the compile work done at build, loaded by run.py.

One tiny engine is built in a subprocess with limits that give a single step bucket
(``max_batch_size`` 1, ``max_draft_len`` 0: one token per step; ``max_seq_len`` 128, below
``MIN_K``: one context bucket), since each bucket costs a compile of about 10 s here;
compiled steps with drafts are checked against eager ones in tests/runtime/test_compiled.py. The loading side runs in a fresh process with an
empty ``TORCHINDUCTOR_CACHE_DIR``, so only the engine's artifacts can make inductor's FX
graph cache hit; the signal checked is inductor's hit/miss counters (reported in
run.py's JSON), never a time.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from promptlookup.cli.build import main as build_main
from promptlookup.cli.run import main as run_main
from promptlookup.engine.compile_cache import artifact_file, kernel_dir
from promptlookup.engine.load import load_runner
from promptlookup.errors import run_cli
from promptlookup.fsutil import MANIFEST
from promptlookup.runtime.compiled import inductor_unavailable_reason
from tests.cli.test_build_cli import build
from tests.cli.test_run_cli import run_cli as run_py

PROMPT = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]  # token ids: no chat template, no BOS
BUCKETS = [[1, 1, 128]]
RUN_FLAGS = ("--max_output_len", "12")


@pytest.fixture(scope="module")
def needs_inductor() -> None:
    reason = inductor_unavailable_reason(torch.device("cpu"))
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompt") / "prompt.json"
    path.write_text(json.dumps([PROMPT]))
    return path


@pytest.fixture(scope="module")
def aot_engine(needs_inductor, tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """A tiny random Llama engine built with ``--torch_compile inductor`` (in a subprocess,
    with its own empty inductor cache)."""
    from transformers import AutoTokenizer

    from promptlookup.checkpoint.convert import convert_model
    from tests.tiny import tiny_llama

    root = tmp_path_factory.mktemp("aot")
    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    ckpt = convert_model(tiny_llama(seed=3, vocab_size=len(tok)), tok, root / "checkpoint", dtype="float32")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor_cache_build"))
        r = build("--checkpoint_dir", str(ckpt), "--output_dir", str(root / "engine"), "--max_batch_size", "1",
                  "--max_input_len", "64", "--max_seq_len", "128", "--max_draft_len", "0", "--tokens_per_block", "16",
                  "--step_costs", "none", "--device", "cpu", "--torch_compile", "inductor")
    assert r.returncode == 0, r.stderr
    assert "compiled 1 step buckets on cpu" in r.stdout
    return root / "engine"


def run_compiled(engine: Path, prompt_file: Path, out: Path, cache_dir: Path):
    """run.py --torch_compile inductor in a fresh process whose inductor cache is ``cache_dir``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
        r = run_py("--engine_dir", str(engine), "--input_file", str(prompt_file), *RUN_FLAGS,
                   "--torch_compile", "inductor", "--output_json", str(out))
    assert r.returncode == 0, r.stderr
    return json.loads(out.read_text()), r.stderr


@pytest.fixture(scope="module")
def loaded_run(aot_engine, prompt_file, tmp_path_factory) -> tuple[dict, str, Path]:
    """(run.py's JSON, its stderr, its inductor cache dir, empty when it started)."""
    root = tmp_path_factory.mktemp("loaded")
    res, err = run_compiled(aot_engine, prompt_file, root / "out.json", root / "inductor_cache")
    return res, err, root / "inductor_cache"


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "compile" in line and line.startswith("note:")]


def test_the_build_stores_the_compile_caches_and_records_them(aot_engine):
    entry = json.loads((aot_engine / "config.json").read_text())["compiled"]["cpu"]
    assert entry["backend"] == "inductor" and entry["torch"] == torch.__version__
    assert entry["file"] == artifact_file("cpu") == "compiled/inductor-cpu.bin"
    assert entry["buckets"] == BUCKETS and entry["threads"] == 1 and entry["dtype"] == "float32"
    assert (aot_engine / entry["file"]).stat().st_size == entry["bytes"] > 0
    assert entry["compile_s"] > 0
    kernels = aot_engine / entry["kernels"]
    assert entry["kernels"] == kernel_dir("cpu") == "compiled/inductor-cpu-kernels"
    assert list(kernels.rglob("*.so")) and not (kernels / "locks").exists()
    assert entry["kernel_bytes"] == sum(f.stat().st_size for f in kernels.rglob("*") if f.is_file())
    leftovers = [p.name for p in aot_engine.rglob(".*") if p.name != MANIFEST]
    assert not leftovers and json.loads((aot_engine / MANIFEST).read_text())["kind"] == "engine"


def test_a_fresh_process_warms_every_bucket_from_the_caches_without_compiling(loaded_run):
    res, err, _ = loaded_run
    report = res["compile"]
    assert report["artifacts"] == "loaded" and report["buckets_warmed"] == len(BUCKETS)
    assert report["cache_hits"] >= len(BUCKETS) and report["cache_misses"] == 0  # FX graph cache: hits only
    assert report["warmup_s"] <= res["setup_time_s"]
    assert not notes(err), err


def test_the_engines_compiled_kernels_are_used_so_nothing_is_compiled_at_load(aot_engine, loaded_run):
    res, _, cache = loaded_run
    assert res["compile"]["kernel_files_installed"] > 0
    shipped = {p.relative_to(aot_engine / kernel_dir("cpu")) for p in (aot_engine / kernel_dir("cpu")).rglob("*.so")}
    present = {p.relative_to(cache) for p in cache.rglob("*.so")}
    assert present == shipped  # every shared object in the run's cache came from the engine: none was built


def test_the_loaded_compiled_run_equals_the_eager_run_token_for_token(aot_engine, prompt_file, loaded_run, tmp_path):
    out = tmp_path / "eager.json"
    assert run_main(["--engine_dir", str(aot_engine), "--input_file", str(prompt_file), *RUN_FLAGS,
                     "--torch_compile", "off", "--output_json", str(out)]) == 0
    eager = json.loads(out.read_text())
    assert eager["compile"] is None  # off: the artifacts are ignored
    got = [s["output_ids"] for s in loaded_run[0]["sequences"]]
    assert got == [s["output_ids"] for s in eager["sequences"]] and len(got[0]) == 12


def test_stale_artifacts_give_one_note_and_the_run_goes_on(aot_engine, prompt_file, loaded_run, tmp_path):
    engine = tmp_path / "engine"
    shutil.copytree(aot_engine, engine)
    config = json.loads((engine / "config.json").read_text())
    config["compiled"]["cpu"]["torch"] = "0.0.0"
    (engine / "config.json").write_text(json.dumps(config))
    # the loaded run's cache dir holds these graphs, so the lazy compiles are cheap here
    res, err = run_compiled(engine, prompt_file, tmp_path / "out.json", loaded_run[2])
    assert res["compile"]["artifacts"] == "stale" and res["compile"]["buckets_warmed"] == 0
    (note,) = notes(err)
    assert "stale (built with torch 0.0.0" in note and "compile lazily" in note and "--torch_compile inductor" in note
    assert [s["output_ids"] for s in res["sequences"]] == [s["output_ids"] for s in loaded_run[0]["sequences"]]


@pytest.mark.parametrize("case, expected, fragment", [
    ("no entry", "absent", "no compiled artifacts for cpu"),
    ("no file", "absent", "inductor-cpu.bin are missing"),
    ("other file", "stale", "do not match config.json"),
    ("other kv cache", "stale", "--max_tokens_in_paged_kv_cache"),
])
def test_unusable_artifacts_are_one_note_and_nothing_is_compiled_at_load(aot_engine, tmp_path, capsys, case,
                                                                        expected, fragment):
    engine = tmp_path / "engine"
    shutil.copytree(aot_engine, engine)
    config = json.loads((engine / "config.json").read_text())
    kv_tokens = None
    if case == "no entry":
        del config["compiled"]
    elif case == "no file":
        (engine / artifact_file("cpu")).unlink()
    elif case == "other file":
        (engine / artifact_file("cpu")).write_bytes(b"not the artifacts")
    else:
        kv_tokens = 1000
    (engine / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    runner = load_runner(engine, device="cpu", compile_mode="inductor", max_tokens_in_paged_kv_cache=kv_tokens)
    err = capsys.readouterr().err
    assert runner.compile_setup.artifacts == expected and runner.compiled.shapes == set()
    (note,) = err.strip().splitlines()
    assert note.startswith("note: ") and fragment in note and "compile lazily" in note


def test_compile_mode_off_ignores_the_artifacts(aot_engine, capsys):
    capsys.readouterr()
    runner = load_runner(aot_engine, device="cpu", compile_mode="off")
    assert runner.compiled is None and runner.compile_setup is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("backend", ["trtllm", "auto"])
def test_torch_compile_with_the_trtllm_backend_is_refused(tmp_path, capsys, monkeypatch, backend):
    if backend == "auto":  # auto picks TensorRT-LLM where it can run; pretend it can
        monkeypatch.setattr("promptlookup.runtime.trtllm.env.trtllm_unavailable_reason", lambda: None)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(build_main, ["--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "engine"),
                             "--backend", backend, "--torch_compile", "inductor"])
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --torch_compile inductor applies to PyTorch engines")
    assert not (tmp_path / "engine").exists()


def test_torch_compile_without_a_compiler_is_refused_before_loading(tmp_path, monkeypatch):
    from promptlookup.errors import UserError

    monkeypatch.setattr("promptlookup.runtime.compiled.shutil.which", lambda name: None)
    with pytest.raises(UserError, match="needs a C\\+\\+ compiler.*build with --torch_compile off"):
        build_main(["--checkpoint_dir", str(tmp_path / "ckpt"), "--output_dir", str(tmp_path / "engine"),
                    "--backend", "torch", "--device", "cpu", "--torch_compile", "inductor"])


def test_installing_kernels_adds_files_and_replaces_none(tmp_path, monkeypatch):
    from promptlookup.engine.compile_cache import _install_kernels

    shipped = tmp_path / "engine_kernels"
    (shipped / "ab").mkdir(parents=True)
    (shipped / "ab" / "k1.so").write_bytes(b"from the engine")
    (shipped / "ab" / "k2.py").write_bytes(b"from the engine")
    cache = tmp_path / "cache"
    (cache / "ab").mkdir(parents=True)
    (cache / "ab" / "k2.py").write_bytes(b"the user's own")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
    assert _install_kernels(shipped) == 1
    assert (cache / "ab" / "k1.so").read_bytes() == b"from the engine"
    assert (cache / "ab" / "k2.py").read_bytes() == b"the user's own"
    assert sorted(p.name for p in (cache / "ab").iterdir()) == ["k1.so", "k2.py"]  # no temporary left
    assert _install_kernels(shipped) == 0 and _install_kernels(tmp_path / "absent") == 0
