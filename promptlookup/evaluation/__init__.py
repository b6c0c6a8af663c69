"""The summarization benchmark behind ``summarize.py`` (see docs/summarize.md).

One concept per module:

- ``dataset``: CNN/DailyMail articles from a local file or the hub, validated.
- ``prompts``: article -> prompt token ids (TensorRT-LLM's ``TL;DR:`` prompt, truncation, chat).
- ``rouge``: ROUGE-1/2/L/Lsum aggregated like Hugging Face ``evaluate``.
- ``hf_baseline``: Hugging Face ``generate``, plain and prompt lookup, one prompt at a time.
- ``harness``: running a contender over batches; the warm-up batch is scored, not timed.
- ``contenders``: the systems compared and how each is opened (fresh runner per contender).
- ``metrics``: a run -> ROUGE, timing, acceptance, identity with plain decoding, speedup.
- ``sweep`` / ``plot``: the prompt-lookup parameter grid, best setting, PNG figure.
- ``report``: tables, the accuracy gate, CSV.
- ``pipeline``: the whole evaluation from settings to results.
- ``divergence``: where a speculative run parts from plain decoding, and the logit gap
  there (half-precision near-ties; docs/sampling.md).
"""
