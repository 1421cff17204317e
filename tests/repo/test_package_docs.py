"""Every package's `__init__` docstring is its index: it names each of its modules and sub-packages.

A module counts as named when the docstring lists it at the start of an indented line
(`  loop   train(): ...`) or quotes it in backticks (`` `runs` ``, `` `runs.py` ``,
`` `models.PromptEncoderDecoderModel` ``). `__init__` and `__main__` are the package itself.
"""
import ast
import pathlib
import re

import pytest
from tests.helpers import REPO

ROOTS = ("spot_jax", "tasks", "benchmarks")


def _packages() -> list[pathlib.Path]:
  return sorted(init.parent for root in ROOTS if (REPO / root).is_dir()
                for init in (REPO / root).rglob("__init__.py"))


def _members(package: pathlib.Path) -> list[str]:
  """The package's modules (file stems) and sub-packages (folders with an `__init__.py`)."""
  names = [path.stem for path in package.glob("*.py")
           if path.stem not in ("__init__", "__main__")]
  names += [path.name for path in package.iterdir()
            if path.is_dir() and (path / "__init__.py").is_file()]
  return sorted(names)


def _named(docstring: str, name: str) -> bool:
  listed = re.search(rf"^[ \t]+(\* )?{re.escape(name)}(\.py|/)?[\s.:]", docstring, re.M)
  quoted = re.search(rf"`{re.escape(name)}(\.py|/)?[`.]", docstring)
  return bool(listed or quoted)


def test_a_module_is_named_only_when_listed_or_quoted():
  doc = "The index.\n\n  loop   the loop\n`job` and `models.Model`; evaluator is prose.\n"
  assert _named(doc, "loop") and _named(doc, "job") and _named(doc, "models")
  assert not _named(doc, "evaluator") and not _named(doc, "loo")


@pytest.mark.parametrize("package", _packages(), ids=lambda p: str(p.relative_to(REPO)))
def test_the_package_docstring_lists_every_module(package):
  tree = ast.parse((package / "__init__.py").read_text())
  docstring = ast.get_docstring(tree, clean=False) or ""
  missing = [name for name in _members(package) if not _named(docstring, name)]
  assert not missing, (f"{package.relative_to(REPO)}/__init__.py's docstring does not name "
                       f"{', '.join(missing)}: list each module with one line on what it holds")
