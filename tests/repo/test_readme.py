"""The README's first screen sends a newcomer to the guide for training on their own data."""
from __future__ import annotations

import re
from tests.helpers import REPO

FIRST_SCREEN = 40  # lines


def _anchors(markdown: str) -> set[str]:
  """GitHub's anchors of a page's headings ("## Your own task" -> "your-own-task")."""
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
          for h in re.findall(r"^#+ (.+)$", markdown, re.M)}


def test_first_screen_links_training_on_your_own_data():
  first = "\n".join((REPO / "README.md").read_text().splitlines()[:FIRST_SCREEN])
  links = re.findall(r"\[([^\]]*own data[^\]]*)\]\((docs/tasks\.md)(?:#([\w-]+))?\)", first,
                     re.I)
  assert links, f"no link to docs/tasks.md about one's own data in the first {FIRST_SCREEN} lines"
  for _, page, anchor in links:
    assert not anchor or anchor in _anchors((REPO / page).read_text()), anchor
