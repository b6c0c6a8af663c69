"""Serving: the OpenAI-compatible server.

- :mod:`.openai_server`: the Starlette app behind ``serve.py`` (imports the server libraries),
  a client of the LLM API; the continuous-batching scheduler it runs on and the batch-aware
  draft budget live in the decoding layer (:mod:`promptlookup.decoding.scheduler`,
  :mod:`promptlookup.decoding.draft_budget`).
"""
