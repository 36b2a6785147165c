"""Stand-in for Hugging Face ``datasets``, on the benchmark client's path only where ``datasets`` is not installed.

It stands for the real package on the GPU machine, which has no network and whose runtime wheels leave out
``datasets`` (its ``pyarrow`` dependency alone is larger than what one call carries). SGLang 0.5.23's
``sglang.benchmark.serving`` imports ``datasets.load_dataset`` at module level (through its MMMU loader), but the
``random-ids`` prompts that ``scripts/sglang_bench.py serving`` asks for load no dataset, so nothing here is called
on that path. Any call says so instead of returning data.
"""

__version__ = "0+standin"


def load_dataset(*args, **kwargs):
    """Raise: this stand-in holds no datasets (see the module docstring)."""
    raise RuntimeError("datasets is a stand-in here (scripts/bench_standins): install Hugging Face datasets "
                       "to benchmark with a dataset other than random-ids")
