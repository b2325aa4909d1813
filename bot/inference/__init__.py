"""The engine: one shared ParlAI model, cloned agents per conversation, batched generation.

Importing it changes nothing process-wide: the ParlAI shims (`compat.apply()`), torch's thread
count and logging are set up once by the composition root, bot/__main__.py (the tests' conftest
and the benchmarks install the shims themselves).
"""
