"""Every relative link of README.md and docs/ leads somewhere: an existing file and, for
`#anchor`, an existing heading of it (GitHub's anchors: lower case, punctuation dropped, spaces
to hyphens, repeats numbered)."""
import pathlib
import re

import pytest
from tests.helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def anchors(markdown: str) -> set[str]:
  """GitHub's anchor of each heading outside code blocks."""
  seen: dict[str, int] = {}
  for line in FENCE.sub("", markdown).splitlines():
    heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
    if not heading:
      continue
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.group(1))  # a link's text
    slug = re.sub(r"[^\w\- ]", "", text.replace("`", "").lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    yield slug if count == 0 else f"{slug}-{count}"


def broken_links(page: pathlib.Path, root: pathlib.Path = REPO) -> list[str]:
  broken = []
  for target in LINK.findall(FENCE.sub("", page.read_text())):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
      continue
    path, _, anchor = target.partition("#")
    linked = (page.parent / path).resolve() if path else page
    if not linked.exists():
      broken.append(f"{target}: no file {linked.relative_to(root)}")
    elif anchor and linked.suffix == ".md" and anchor not in set(anchors(linked.read_text())):
      broken.append(f"{target}: no heading #{anchor} in {linked.relative_to(root)}")
  return broken


def test_anchors_follow_github():
  page = ("# The demo (`spot_jax.demo`)\n```\n# not a heading\n```\n"
          "## Step 1: run it\n## Step 1: run it\n")
  assert list(anchors(page)) == ["the-demo-spot_jaxdemo", "step-1-run-it", "step-1-run-it-1"]


def test_a_broken_link_is_found(tmp_path):
  page = tmp_path / "page.md"
  (tmp_path / "other.md").write_text("# Other\n## Its section\n")
  page.write_text("[ok](other.md#its-section) [bad](other.md#nowhere) [gone](missing.md) "
                  "[web](https://example.com/x.md)\n")
  assert broken_links(page, tmp_path) == ["other.md#nowhere: no heading #nowhere in other.md",
                                           "missing.md: no file missing.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
  broken = broken_links(page)
  assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)
