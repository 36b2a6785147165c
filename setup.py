"""Build hook: ship the user documentation inside the package (``sglang_fp4_indexer/docs/`` in the wheel).

Everything else about the package is in pyproject.toml. The documents live at
the top of the checkout (README.md, CHANGELOG.md, docs/); ``build_py`` copies
them into the built package, where ``sglang-fp4-indexer docs`` finds them
(``sglang_fp4_indexer.guide.docs_dir``).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: The user documents copied into the wheel, relative to the checkout.
USER_DOCS = ["README.md", "CHANGELOG.md",
             *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").iterdir() if p.suffix in (".md", ".png"))]


class BuildPyWithDocs(build_py):
    """``build_py`` that also copies ``USER_DOCS`` into ``sglang_fp4_indexer/docs/`` of the build."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / "sglang_fp4_indexer" / "docs"
        self.mkpath(str(target))
        for name in USER_DOCS:
            self.copy_file(str(ROOT / name), str(target / Path(name).name))


setup(cmdclass={"build_py": BuildPyWithDocs})
