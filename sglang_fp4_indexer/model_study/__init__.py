"""The real-model study: what the FP4 index-key format costs a language model's answers.

Gemma 3 270M (``gemma``) runs with DSA-style sparse attention in its three
global layers, each query reading only the top-k keys a stand-in indexer
selects over exact, FP8 or FP4 index keys (``sparse``); ``run`` scores token
sequences under every variant, ``study`` builds the loss windows and passkey
prompts, aggregates with standard errors and renders the report
(``sglang-fp4-indexer model-accuracy``, docs/accuracy.md, "On a real model").

Core layer: nothing here imports SGLang.
"""
