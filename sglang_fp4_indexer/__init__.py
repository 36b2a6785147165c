"""sglang-fp4-indexer: an MXFP4 index-key cache and Triton scorers for SGLang's DSA indexer.

The core (``format``, ``pool``, ``reference``, ``ops``, ``schedule_buffer``, ``gate``,
``dcp``) imports torch and Triton only; everything that touches SGLang lives in
``sglang_fp4_indexer.sglang_plugin``; ``cli`` (the command) sits above both. See the docs/ folder of the source repository.
"""

__version__ = "0.1.0"
