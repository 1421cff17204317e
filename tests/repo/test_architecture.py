"""The architecture docs/architecture.md states, checked on the code: layers, no cycles, sizes.

Every import of spot_jax/ and tasks/ (module-level and inside functions) is read from the source;
each component (a top-level module or package of spot_jax, or tasks) sits on one layer of LAYERS,
and an import may only go to the same layer or one below. Modules stay under 400 lines and
functions under 100 (tests excluded).
"""
import ast
import pathlib

import pytest
from tests.helpers import REPO


# Bottom to top; the same list (with what each holds) is in docs/architecture.md.
LAYERS = [
    ["errors", "validate", "quiet_logs", "spot_jax"],  # spot_jax: the package's face
    ["fileio", "paths", "partitioning", "orbax_io", "vocabulary", "losses", "stats", "verdicts",
     "power", "data", "runtime"],
    ["backbones", "run_dir"],
    ["models", "prompts", "cli"],
    ["embedded"],  # the shipped toy model's files (its pretraining program reads tasks: see below)
    ["tasks", "convert"],
    ["backbone"],
    ["train"],
    ["experiment"],  # the one runner of batches of prompt runs (demo, study, retrieval)
    ["eval", "plan", "spot", "demo"],
    ["serve", "library", "retrieve", "study", "report"],
    ["infer"],
    ["contrib"],
]
# Modules whose place differs from their package's: the embedded models' pretraining programs
# and its toy corpus builder use the task suite, above the model files they sit beside.
MODULE_LAYER = {"spot_jax.embedded.pretrain": "tasks", "spot_jax.embedded.toy_data": "tasks",
                "spot_jax.embedded.pretrain_decoder": "tasks"}
# Inside serve/, bottom to top (spot_jax/serve/__init__.py and docs/architecture.md say what
# each holds); the program (service, assemble, __main__) sits above them all.
SERVE_LAYERS = ["export", "catalog", "model", "scheduler", "http"]
MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 100


def _sources():
  for root in ("spot_jax", "tasks"):
    for path in sorted((REPO / root).rglob("*.py")):
      name = ".".join(path.relative_to(REPO).with_suffix("").parts)
      yield name.removesuffix(".__init__"), path


def _component(module: str) -> str:
  parts = module.split(".")
  return parts[0] if parts[0] == "tasks" else parts[1] if len(parts) > 1 else "spot_jax"


def _layer_of(module: str) -> int:
  name = MODULE_LAYER.get(module, _component(module))
  for i, layer in enumerate(LAYERS):
    if name in layer:
      return i
  raise AssertionError(f"{module} ({name}) is on no layer of LAYERS; add it there and to "
                       f"docs/architecture.md")


def _imports(module: str, path: pathlib.Path) -> set[str]:
  """The spot_jax/tasks modules `module` imports (the longest existing module of each name)."""
  tree = ast.parse(path.read_text())
  package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]
                        + ([base] if base else []))
      names = [f"{base}.{a.name}" for a in node.names]  # a submodule, else the package's name
    else:
      continue
    for name in names:
      if name.split(".")[0] in ("spot_jax", "tasks"):
        out.add(name)
  return out


@pytest.fixture(scope="module")
def graph():
  modules = dict(_sources())
  edges = {}
  for module, path in modules.items():
    targets = set()
    for name in _imports(module, path):
      while name and name not in modules:  # spot_jax.backbones.t5.config_by_name -> ...t5
        name = name.rsplit(".", 1)[0] if "." in name else ""
      if name and name != module and name != "spot_jax":
        targets.add(name)
    edges[module] = targets
  return modules, edges


def test_no_import_goes_up_a_layer(graph):
  _, edges = graph
  upward = sorted(f"{a} -> {b}" for a, targets in edges.items() for b in targets
                  if _layer_of(b) > _layer_of(a))
  assert not upward, "imports from a lower layer up to a higher one:\n" + "\n".join(upward)


def _serve_layer(module: str) -> int:
  part = module.split(".")[2] if module.count(".") >= 2 else ""
  return SERVE_LAYERS.index(part) if part in SERVE_LAYERS else len(SERVE_LAYERS)


def test_serve_layers_import_down_only(graph):
  _, edges = graph
  serve = lambda m: m.startswith("spot_jax.serve.")
  upward = sorted(f"{a} -> {b}" for a, targets in edges.items() if serve(a) for b in targets
                  if serve(b) and _serve_layer(b) > _serve_layer(a))
  assert not upward, "serve/ imports up its layers:\n" + "\n".join(upward)


def test_no_import_cycles(graph):
  _, edges = graph
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def visit(v):  # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in edges.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        cycles.append(sorted(component))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  assert not cycles, f"import cycles: {cycles}"


def test_modules_and_functions_are_small(graph):
  modules, _ = graph
  big_modules, big_functions = [], []
  for module, path in modules.items():
    text = path.read_text()
    if len(text.splitlines()) > MAX_MODULE_LINES:
      big_modules.append(f"{path.relative_to(REPO)}: {len(text.splitlines())} lines")
    for node in ast.walk(ast.parse(text)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        size = node.end_lineno - node.lineno + 1
        if size > MAX_FUNCTION_LINES:
          big_functions.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {size} lines")
  assert not big_modules and not big_functions, big_modules + big_functions


def test_the_checker_sees_an_upward_import():
  """The layer check can fail: a low module importing the trainer is caught."""
  assert _layer_of("spot_jax.train.loop") > _layer_of("spot_jax.run_dir")
  assert _layer_of("spot_jax.embedded.pretrain") > _layer_of("spot_jax.embedded")
  with pytest.raises(AssertionError, match="on no layer"):
    _layer_of("spot_jax.nowhere")
