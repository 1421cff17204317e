"""ULPT (Wu et al. 2025, ultra-low-dimensional prompt tuning): each prompt row lives in r << E
dimensions and reaches the model's width through a frozen random projection.

    e_i = s o (P z_i) + b,   i.e.   E_prompt = (Z P) diag(s) + 1 b^T       (the paper's Eq. 3)

Z [n, r] trains (N(0, 1) at the start, as the paper's code: a torch `nn.Embedding`); s [E] is
the scale (ones) and b [E] the shift (zeros), both trained; P [r, E] is random and frozen. P is
not a parameter: the module rebuilds it from (generator, seed, r, E) with NumPy at trace time,
so under jit it is a compile-time constant, and the trainable tree is exactly {z, scale, shift}
(n r + 2 E numbers): no gradient, no optimizer state and no checkpoint ever holds P.

P comes from a named generator rather than JAX's PRNG, so a JAX release cannot silently change a
trained prompt: "numpy-pcg64-xavier-uniform" draws U(-sqrt(6 / (r + E)), +sqrt(6 / (r + E)))
(Xavier-uniform, the paper's code) from `np.random.Generator(np.random.PCG64(seed))`;
"identity" is P = I, only for r = E (ULPT then is Prompt Tuning of Z, scaled and shifted). A
run stores P beside every exported prompt (prompts/projection_{step_N,best}.npy, see
`export_arrays`) and records it in run.json by seed, generator and SHA-256 (`projection_record`,
the method's "projection"); `check_record` and `ULPT.check_run_dir` refuse, in one line, a P that
does not rebuild to what the run kept.

After training, `fold` computes the [n, E] prompt once: what is exported, served, added to a
SPoT library and written as PEFT's PROMPT_TUNING `prompt_embeddings`.
"""
from __future__ import annotations

import functools
import hashlib
import pathlib
import re
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError
from spot_jax.prompts import common, initializers, placement as placement_lib
from spot_jax.prompts.prompt_tuning import PromptTuning

Array = jax.Array

XAVIER = "numpy-pcg64-xavier-uniform"
IDENTITY = "identity"
GENERATORS = (XAVIER, IDENTITY)
PROJECTION = "projection"  # the exported companion: prompts/projection_{step_N,best}.npy
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def normal(std: float = 1.0) -> initializers.Initializer:
  """N(0, std^2) entries (Z's start in the paper's code: a torch embedding table, std 1)."""
  validate.non_negative(std, "ulpt.normal std")
  return initializers.with_origin(
      lambda rng, shape, embedding: std * jax.random.normal(rng, tuple(shape), jnp.float32),
      f"normal(std={std:g})")


def ones() -> initializers.Initializer:
  """All ones: the scale s starts as the identity."""
  return initializers.with_origin(
      lambda rng, shape, embedding: jnp.ones(tuple(shape), jnp.float32), "ones")


def zeros() -> initializers.Initializer:
  """All zeros: the shift b starts at nothing."""
  return initializers.with_origin(
      lambda rng, shape, embedding: jnp.zeros(tuple(shape), jnp.float32), "zeros")


@functools.lru_cache(maxsize=16)
def _build(generator: str, seed: int, rank: int, width: int) -> np.ndarray:
  if generator == IDENTITY:
    if rank != width:
      raise ConfigError(f"ULPT.projection_generator='identity' needs rank = the embedding width "
                        f"({width}), got rank={rank}; use {XAVIER!r} for rank < width")
    p = np.eye(width, dtype=np.float32)
  else:
    limit = np.sqrt(6.0 / (rank + width))
    rng = np.random.Generator(np.random.PCG64(seed))
    p = rng.uniform(-limit, limit, (rank, width)).astype(np.float32)
  p.setflags(write=False)
  return p


def projection(generator: str, seed: int, rank: int, width: int) -> np.ndarray:
  """The frozen P [r, E] float32 (read-only) of `generator` at `seed`.

  Raises:
    ConfigError: an unknown generator, rank outside 1..width, or 'identity' with rank != width.
  """
  validate.one_of(generator, "ULPT.projection_generator", GENERATORS)
  validate.positive_int(seed, "ULPT.projection_seed", minimum=0)
  if not isinstance(rank, (int, np.integer)) or not 1 <= rank <= width:
    raise ConfigError(f"ULPT.rank={rank!r} does not fit the embedding width {width}; give "
                      f"1 <= rank <= {width} (the paper's 64 for width 768)")
  return _build(generator, int(seed), int(rank), int(width))


def sha256(p: np.ndarray) -> str:
  """SHA-256 of P's shape and float32 bytes: the name a run records P by."""
  p = np.ascontiguousarray(p, np.float32)
  return hashlib.sha256(f"{p.shape}".encode() + p.tobytes()).hexdigest()


def projection_record(generator: str, seed: int, rank: int, width: int) -> dict[str, Any]:
  """{"generator", "seed", "rank", "width", "sha256"}: P by what rebuilds it and its hash."""
  p = projection(generator, seed, rank, width)
  return {"generator": generator, "seed": int(seed), "rank": int(rank), "width": int(width),
          "sha256": sha256(p)}


def check_record(record: Mapping[str, Any], where: str,
                 stored: Optional[np.ndarray] = None) -> np.ndarray:
  """P rebuilt from `record` (`projection_record`'s fields), refused in one line when it does not
  hash to the record's sha256, or differs from `stored` (the P a run kept)."""
  try:
    p = projection(record["generator"], record["seed"], record["rank"], record["width"])
  except KeyError as e:
    raise ConfigError(f"{where}: its ULPT projection record lacks {e}; give a ULPT run") from None
  got, want = sha256(p), record.get("sha256")
  if stored is not None and want is None:
    want = sha256(stored)
  if got != want or (stored is not None and sha256(stored) != got):
    raise ConfigError(f"{where}: ULPT projection {record['generator']} seed {record['seed']} "
                      f"[{record['rank']}, {record['width']}] rebuilds to sha256 {got[:12]}, not "
                      f"the recorded {str(want)[:12]}; use the NumPy that trained it, or retrain")
  return p


def ulpt_prompt(z: Array, p: Array, scale: Array, shift: Array) -> Array:
  """Z [n, r], P [r, E], s [E], b [E] -> (Z P) diag(s) + 1 b^T [n, E] float32."""
  zp = jnp.dot(jnp.asarray(z, jnp.float32), jnp.asarray(p, jnp.float32),
               precision=jax.lax.Precision.HIGHEST)
  return zp * jnp.asarray(scale, jnp.float32) + jnp.asarray(shift, jnp.float32)


def parameters(params: Any) -> dict[str, np.ndarray]:
  """{"z", "scale", "shift"} of a ULPT's parameter subtree (boxed or not) as float32 NumPy."""
  params = common.unboxed_numpy(params)
  missing = {"z", "scale", "shift"} - set(params)
  if missing:
    raise ConfigError(f"ULPT: the parameter subtree lacks {sorted(missing)}; pass the `prompt` "
                      f"subtree of a ULPT model")
  return {k: np.asarray(params[k], np.float32) for k in ("z", "scale", "shift")}


class ULPT(nn.Module):
  """n prompt rows in r dimensions, projected to the width E by a frozen P, scaled and shifted.

  Parameters (under the backbone's `prompt/` subtree; n r + 2 E trainable numbers):
    z [n, r] float32, axes ("prompt", "prompt_mlp"); scale [E] and shift [E], ("prompt_embed",).
  P [r, E] is a constant rebuilt from (projection_generator, projection_seed, r, E), never a
  parameter.

  Attributes:
    length: n, the prompt tokens (>= 1; the paper's 100 on T5).
    rank: r, 1 <= r <= E (the paper's 64 on T5-Base, down to 2).
    prompt_init: initialiser of Z [n, r] (default N(0, 1), the paper's code).
    scale_init, shift_init: initialisers of s [E] (ones) and b [E] (zeros).
    projection_seed: the seed P is drawn with (>= 0).
    projection_generator: a name in GENERATORS ("identity" only when r = E).
    projection_sha256: None, or the SHA-256 the rebuilt P must have (refused otherwise).
    placement: "prefix", "after_bos" or "suffix".
    dtype: optional activation dtype; must equal the backbone's (None follows it).
  """
  length: int
  rank: int = 64
  prompt_init: initializers.Initializer = normal()
  scale_init: initializers.Initializer = ones()
  shift_init: initializers.Initializer = zeros()
  projection_seed: int = 0
  projection_generator: str = XAVIER
  projection_sha256: Optional[str] = None
  placement: str = "prefix"
  dtype: Optional[Any] = None

  def __post_init__(self):
    validate.positive_int(self.length, "ULPT.length")
    validate.positive_int(self.rank, "ULPT.rank", note="the dimension of each prompt row's z_i")
    validate.positive_int(self.projection_seed, "ULPT.projection_seed", minimum=0)
    validate.one_of(self.projection_generator, "ULPT.projection_generator", GENERATORS)
    validate.one_of(self.placement, "ULPT.placement", placement_lib.PLACEMENTS)
    if self.projection_sha256 is not None and not _SHA256.match(str(self.projection_sha256)):
      raise ConfigError(f"ULPT.projection_sha256={self.projection_sha256!r} is not a SHA-256; give "
                        f"64 lowercase hex digits (a run's record) or None")
    super().__post_init__()

  def projection(self, width: int) -> np.ndarray:
    """P [r, E] for the embedding width E, checked against `projection_sha256` and against the
    projection any of the initialisers comes from (a ULPT source run, `from_run`)."""
    p = projection(self.projection_generator, self.projection_seed, self.rank, width)
    digest = sha256(p)
    if self.projection_sha256 is not None and digest != self.projection_sha256:
      raise ConfigError(f"ULPT projection {self.projection_generator} seed {self.projection_seed} "
                        f"[{self.rank}, {width}] rebuilds to sha256 {digest[:12]}, not "
                        f"ULPT.projection_sha256={self.projection_sha256[:12]}; use the NumPy "
                        f"that trained it, or retrain")
    for init in (self.prompt_init, self.scale_init, self.shift_init):
      source = getattr(init, "projection", None)
      if source is not None and source.get("sha256") != digest:
        raise ConfigError(f"ULPT: the source {source.get('where', '?')} was trained with "
                          f"projection {source.get('generator')} seed {source.get('seed')} rank "
                          f"{source.get('rank')}, this prompt's is {self.projection_generator} "
                          f"seed {self.projection_seed} rank {self.rank}; give the source's "
                          f"projection settings")
    return p

  @nn.compact
  def __call__(self, embedded: Array, tokens: Array, *, embedding: Array, deterministic: bool,
               valid: Optional[Array] = None) -> tuple[Array, Array]:
    """embedded [B, T, E], tokens [B, T], valid [B, T] bool (None: tokens > 0)
    -> (x [B, n + T, E], valid [B, n + T])."""
    del deterministic  # ULPT has no randomness.
    common.check_dtype(self.dtype, embedded, "ULPT")
    width = embedded.shape[-1]
    p = self.projection(width)
    z = common.prompt_param(self, "z", self.prompt_init, (self.length, self.rank),
                            ("prompt", "prompt_mlp"), embedding)
    scale = common.prompt_param(self, "scale", self.scale_init, (width,), ("prompt_embed",),
                                embedding)
    shift = common.prompt_param(self, "shift", self.shift_init, (width,), ("prompt_embed",),
                                embedding)
    prompt = ulpt_prompt(z, p, scale, shift)
    return placement_lib.combine(prompt, embedded, common.validity(tokens, valid), self.placement)

  def fold(self, params: Any) -> dict[str, Array]:
    """The parameters {"prompt": (Z P) diag(s) + b [n, E]} of the equivalent `folded_module()`.

    Args:
      params: this module's parameter subtree ({"z", "scale", "shift"}), boxed or not.
    """
    arrays = parameters(params)
    p = self.projection(arrays["scale"].shape[-1])
    return {"prompt": ulpt_prompt(arrays["z"], p, arrays["scale"], arrays["shift"])}

  def folded_module(self) -> PromptTuning:
    """The PromptTuning module that, with `fold(params)`, computes the same outputs."""
    return PromptTuning(self.length, placement=self.placement, dtype=self.dtype, parent=None)

  def export_prompt(self, params: Any) -> np.ndarray:
    """The folded prompt [n, E] float32."""
    return np.asarray(self.fold(params)["prompt"], np.float32)

  def export_arrays(self, params: Any) -> dict[str, np.ndarray]:
    """{"projection": P [r, E]}: the run keeps the P its prompt was trained with."""
    width = parameters(params)["scale"].shape[-1]
    return {PROJECTION: np.array(self.projection(width), np.float32)}

  def check_run_dir(self, run_dir: Any) -> None:
    """Refuses, in one line, to resume or read a run directory whose kept P (prompts/
    projection_*.npy) is not the one this module rebuilds (another seed, generator, rank or
    NumPy stream): its Z, scale and shift would silently mean another prompt."""
    folder = pathlib.Path(run_dir) / "prompts"
    for file in sorted(folder.glob(f"{PROJECTION}_*.npy")) if folder.is_dir() else []:
      stored = np.load(file, allow_pickle=False)
      rebuilt = projection(self.projection_generator, self.projection_seed, self.rank,
                           int(stored.shape[-1]))
      if stored.shape != rebuilt.shape or sha256(stored) != sha256(rebuilt):
        raise ConfigError(f"{file}: the run kept projection [{stored.shape[0]}, "
                          f"{stored.shape[-1]}] sha256 {sha256(stored)[:12]}, but ULPT "
                          f"{self.projection_generator} seed {self.projection_seed} rank "
                          f"{self.rank} rebuilds sha256 {sha256(rebuilt)[:12]}; give the run's "
                          f"settings (its run.json) or a new MODEL_DIR")

  def projection_record(self, width: int) -> dict[str, Any]:
    """This module's P at width E by what rebuilds it and its hash (`projection_record`)."""
    return projection_record(self.projection_generator, self.projection_seed, self.rank, width)


@functools.lru_cache(maxsize=8)
def _source(model_dir: str, step: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
  from spot_jax.run_dir import RunDir, companion_file  # pylint: disable=g-import-not-at-top
  run = RunDir(model_dir)
  record = run.read_record()
  method = {} if record is None else record.method
  if method.get("class") != "ULPT":
    raise ConfigError(f"{model_dir} is not a ULPT run (its run.json names "
                      f"{method.get('class') or 'no prompt method'}); give a ULPT source run")
  if step is None:
    prompt_file, step = run.exported_prompt()
    which = "best" if step is None else step
  else:
    which = step
    prompt_file = run.prompt_path(step)
  stored_file = companion_file(prompt_file, PROJECTION)
  if not stored_file.is_file():
    raise ConfigError(f"{model_dir}: {stored_file.name} is missing, the projection P the run was "
                      f"trained with; give a ULPT run that exported step {which}")
  stored = np.load(stored_file, allow_pickle=False)
  rec = {"generator": method.get("projection_generator"), "seed": method.get("projection_seed"),
         "rank": method.get("rank"), "width": int(stored.shape[-1]),
         "sha256": (method.get("projection") or {}).get("sha256", method.get("projection_sha256"))}
  check_record(rec, str(stored_file), stored)
  rec["sha256"] = sha256(stored)
  params, _ = run.restore_params(which, warn=lambda line: None)
  return parameters(params["prompt"]), dict(rec, where=model_dir)


def from_run(model_dir: str, part: str, step: Any = None) -> initializers.Initializer:
  """SPoT transfer between ULPT runs: an initialiser of `part` ("z", "scale" or "shift") from a
  ULPT source run's trained parameters (read now: the trainer creates prompts under jit).

  The source's P (stored beside its exported prompt) must rebuild from its record, and the
  target module refuses a source whose P differs from its own, each in one line.

  Args:
    model_dir: the source run's MODEL_DIR.
    part: the parameter it fills.
    step: a step, "best", or None (the step of the prompt the run serves: best, else latest).
  """
  validate.one_of(part, "ulpt.from_run part", ("z", "scale", "shift"))
  arrays, source = _source(str(model_dir), step)
  value = arrays[part]

  def init(rng, shape, embedding):
    del rng, embedding
    if tuple(value.shape) != tuple(shape):
      raise ConfigError(f"{model_dir}: its ULPT {part} has shape {value.shape}, the prompt needs "
                        f"{tuple(shape)} (length, rank and width must match)")
    return np.array(value, np.float32)

  init.projection = source
  return initializers.with_origin(init, f"ULPT run {model_dir} ({part}, step {step or 'served'})")
