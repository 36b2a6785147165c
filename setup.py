"""Build hook: ship the user documentation and the SGLang --config files inside the package.

``sglang_fp4_indexer/docs/`` and ``sglang_fp4_indexer/configs/`` in the wheel.

Everything else about the package is in pyproject.toml. The documents live at
the top of the checkout (README.md, CHANGELOG.md, docs/); ``build_py`` copies
them into the built package, where ``sglang-fp4-indexer docs`` finds them
(``sglang_fp4_indexer.guide.docs_dir``); configs/*.yaml go to ``configs/``
(``guide.configs_dir``, ``sglang-fp4-indexer docs --config NAME``).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: The user documents copied into the wheel, relative to the checkout.
USER_DOCS = ["README.md", "CHANGELOG.md",
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").iterdir() if p.suffix in (".md", ".png"))]
#: The SGLang --config files copied into the wheel, relative to the checkout.
CONFIGS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").glob("*.yaml"))


class BuildPyWithDocs(build_py):
    """``build_py`` that also copies ``USER_DOCS`` to ``sglang_fp4_indexer/docs/`` and ``CONFIGS`` to ``configs/``."""

    def run(self):
        super().run()
        for folder, names in (("docs", USER_DOCS), ("configs", CONFIGS)):
            target = Path(self.build_lib) / "sglang_fp4_indexer" / folder
            self.mkpath(str(target))
            for name in names:
                self.copy_file(str(ROOT / name), str(target / Path(name).name))


setup(cmdclass={"build_py": BuildPyWithDocs})
