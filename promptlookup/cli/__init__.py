"""The logic behind the top-level scripts (argument parsing, output).

Importing it asks OpenMP to wait passively (:func:`promptlookup.threads.prefer_passive_wait`),
which only works before torch is imported: every script imports this package first.
"""
from ..threads import prefer_passive_wait

prefer_passive_wait()
