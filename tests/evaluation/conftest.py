"""Fixtures for the summarization evaluation tests: tokenizer, engine dir, tiny datasets.

The engine is a tiny random Llama (vocab 49152) with the SmolLM2 tokenizer from the
bundled GGUF, converted and built once per session; tests needing it skip when the
bundled model is not installed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHARED_SAMPLE = ROOT.parent / "shared" / "data" / "cnn_dailymail" / "train_sample.jsonl"
ENGINE_LIMITS = dict(max_batch_size=4, max_input_len=160, max_seq_len=200, max_draft_len=8)

ARTICLES = [
    ("a1", "The city council voted on Tuesday to build a new bridge over the river. The bridge will cost "
           "ten million dollars and open in two years. Residents said the old bridge was unsafe.",
     "City council votes to build a new bridge.\nIt will cost ten million dollars."),
    ("a2", "A small dog named Max was rescued from a frozen lake by two firefighters on Sunday. Max is "
           "recovering at home. The firefighters said the ice was thin.",
     "Dog named Max rescued from frozen lake.\nFirefighters say the ice was thin."),
    ("a3", "Scientists found a new species of frog in the rainforest. The frog is bright green and very "
           "small. It was found near a waterfall by a team of students.",
     "New species of green frog found in rainforest.\nStudents found it near a waterfall."),
    ("a4", "The football team won the championship after a long season. The coach praised the players "
           "for their hard work. Fans celebrated in the streets until midnight.",
     "Football team wins the championship.\nFans celebrate in the streets."),
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def article_rows() -> list[dict]:
    return [{"id": i, "article": a, "highlights": h} for i, a, h in ARTICLES]


@pytest.fixture()
def jsonl_dataset(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "data.jsonl", article_rows())


@pytest.fixture(scope="session")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


def _build(checkpoint: Path, engine: Path) -> None:
    from promptlookup.engine import build as engine_build

    if hasattr(engine_build, "build_engine"):
        engine_build.build_engine(checkpoint, engine, **ENGINE_LIMITS)
        return
    cfg = engine_build.build_config(
        **ENGINE_LIMITS, speculative_decoding_mode="draft_tokens_external", use_paged_context_fmha=True,
        gemm_plugin="auto", tokens_per_block=32, max_position_embeddings=2048)
    engine_build.build_torch_engine(checkpoint, engine, cfg)


@pytest.fixture(scope="session")
def engine_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer) -> Path:
    """A PyTorch engine dir of a tiny random Llama with the SmolLM2 tokenizer."""
    from promptlookup.checkpoint.convert import convert_model
    from tests.tiny import tiny_llama

    root = tmp_path_factory.mktemp("summarize_engine")
    convert_model(tiny_llama(vocab_size=49152), tokenizer, root / "checkpoint", dtype="float32")
    _build(root / "checkpoint", root / "engine")
    return root / "engine"
