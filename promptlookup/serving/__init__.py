"""Serving: continuous batching over the PyTorch runner, and the OpenAI-compatible server.

- :mod:`.draft_budget`: the batch-aware draft budget (drafts shrink as the batch grows).
- :mod:`.scheduler`: a background loop that lets requests join and leave one live
  :class:`~promptlookup.runtime.torch_runner.DecodeBatch` between steps.
- :mod:`.openai_server`: the Starlette app behind ``serve.py`` (imports the server libraries).
"""
