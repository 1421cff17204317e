"""A stacked table of servable prompts: Prompt Tuning, folded Residual and MPT, SMoP (and
folded Residual SMoP), ATTEMPT, DePT and the deep prompts in one array set.

Every entry is stored as a mixture of k prompts of length l with a router, padded to the
table's largest k (K) and l (L), plus an optional offset of the input embeddings by position
(DePT's), padded to the table's longest (S):

  prompts [N, K, L, E] float32   entry n's prompts, left-aligned along L, zero padding
  router  [N, E, K] float32      SMoP's bias-free router kernel (zeros when there is none)
  num_prompts [N] int32          k_n (1 for Prompt Tuning and folded Residual prompts)
  lengths [N] int32              l_n
  routing [N] int32              ROUTING_CODES[...]: how the k_n prompts combine per example
  offsets [N, S, E] float32      row t: added to the embedding at input position t (zeros for
                                 entries without one; S = 0 when no entry has one)
  offset_lengths [N] int32       s_n, the input positions entry n's offset covers (0: none)

and ATTEMPT's attention network, padded to the largest width R (R = 0 without ATTEMPT entries;
zero padding leaves every other entry's arrays unused and ATTEMPT's outputs exact):

  keys [N, K, E] float32         max-pool over tokens of each prompt, divided by the temperature
  attn_down [N, E, R], attn_up [N, R, E], attn_scale [N, E], attn_bias [N, E]
  target [N] int32               which of the entry's prompts is the target (-1: none)

A plain prompt is the mixture k = 1 combined with weight 1, so one jitted function serves any
mix of entries: the row's entry index selects its arrays by a gather (see `mixed`).

Deep prompts (prefix tuning, P-tuning v2) add per-layer prefixes: `deep` maps each attention
type some entry prefixes ("encoder", "decoder", "cross") to

  kv [N, layers, 2, P, H, D] float32    entry n's plain key/value prefixes, right-aligned along
                                        P (zeros in front), so a shorter prefix keeps its
                                        positions next to the input
  lengths [N] int32                     p_n (0 for entries without prefixes of that type)

A deep-only entry has no input prompt (l = 0). Deep prompt tokens (P-tuning v2) are turned into
plain prefixes with the frozen backbone by `PromptTable.fold_tokens` before serving.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

import numpy as np

from spot_jax import validate
from spot_jax.errors import ConfigError

# "mean": weight 1/k each (a plain prompt when k = 1; SMoP "stochastic"/"single" at evaluation).
# "linear": the most probable prompt scaled by its probability (SMoP's default).
# "top2": p1 * P_i1 + p2 * P_i2.  "hard": the most probable prompt, weight 1 (SMoP "gumbel").
# "attempt": ATTEMPT's attention over the k prompts (sources + target) plus 1 on the target.
ROUTING_CODES = {"mean": 0, "linear": 1, "top2": 2, "hard": 3, "attempt": 4}
# SMoP module routing -> how it routes at evaluation.
SMOP_EVAL_ROUTING = {"linear": "linear", "top2": "top2", "gumbel": "hard", "stochastic": "mean",
                     "single": "mean"}


@dataclasses.dataclass(frozen=True)
class Attention:
  """ATTEMPT's attention network of a served entry (see `spot_jax.prompts.attempt`).

  Attributes:
    down: [E, r]; up: [r, E]; scale, bias: [E] (the LayerNorm's).
    temperature: the softmax temperature T.
    target: the index of the target among the entry's k prompts (the others are sources).
  """
  down: np.ndarray
  up: np.ndarray
  scale: np.ndarray
  bias: np.ndarray
  temperature: float
  target: int

  def __post_init__(self):
    for name in ("down", "up", "scale", "bias"):
      object.__setattr__(self, name, np.asarray(getattr(self, name), np.float32))
    embed, r = self.down.shape if self.down.ndim == 2 else (-1, -1)
    if (self.up.shape != (r, embed) or self.scale.shape != (embed,)
        or self.bias.shape != (embed,)):
      raise ConfigError(f"ATTEMPT attention network of shapes {self.down.shape}, {self.up.shape}, "
                        f"{self.scale.shape}, {self.bias.shape}; expected [E, r], [r, E], [E], [E]")
    if not self.temperature > 0:
      raise ConfigError(f"ATTEMPT temperature {self.temperature!r}; give a positive number")


@dataclasses.dataclass(frozen=True)
class ServedPrompt:
  """One servable prompt.

  Attributes:
    name: the name inputs use to select it.
    prompts: [k, l, E] float32 (k = 1 for a plain prompt).
    router: [E, k] float32 router kernel, or None (then routing must be "mean").
    routing: a key of ROUTING_CODES.
    source: where it came from (for messages and outputs).
    deep: a deep prompt's parts ({field: array}, see `spot_jax.prompts.deep`), or None; with
      one, `prompts` may be [0, E] (no input prompt).
    offset: [s, E] float32 added to the input embedding at positions 0..s-1 (DePT's folded
      offset), or None.
    attention: ATTEMPT's network (routing "attempt"), or None.
  """
  name: str
  prompts: np.ndarray
  router: Optional[np.ndarray] = None
  routing: str = "mean"
  source: str = ""
  deep: Optional[Mapping[str, np.ndarray]] = None
  offset: Optional[np.ndarray] = None
  attention: Optional[Attention] = None

  def __post_init__(self):
    prompts = np.asarray(self.prompts, np.float32)
    if prompts.ndim == 2:
      prompts = prompts[None]
    deep_only = bool(self.deep) and prompts.ndim == 3 and prompts.shape[:2] == (1, 0)
    if prompts.ndim != 3 or (0 in prompts.shape and not deep_only):
      raise ConfigError(f"prompt {self.name!r} has shape {np.shape(self.prompts)}; expected "
                        f"[L, E] (Prompt Tuning, folded Residual or MPT) or [k, l, E] (SMoP, "
                        f"ATTEMPT)")
    if not np.all(np.isfinite(prompts)):
      raise ConfigError(f"prompt {self.name!r} ({self.source}) holds NaN or infinite values; "
                        f"give a finite prompt")
    if self.routing not in ROUTING_CODES:
      raise ConfigError(f"prompt {self.name!r}: routing {self.routing!r} is unknown; valid: "
                        f"{', '.join(ROUTING_CODES)}")
    k, _, embed = prompts.shape
    router = None if self.router is None else np.asarray(self.router, np.float32)
    if router is None and self.routing not in ("mean", "attempt"):
      raise ConfigError(f"prompt {self.name!r}: routing {self.routing!r} needs a router kernel; "
                        f"only 'mean' works without one")
    if router is not None and router.shape != (embed, k):
      raise ConfigError(f"prompt {self.name!r}: router kernel of shape {router.shape} does not fit "
                        f"{k} prompts of width {embed}; expected {(embed, k)}")
    if self.routing == "top2" and k < 2:
      raise ConfigError(f"prompt {self.name!r}: routing 'top2' needs at least 2 prompts, got {k}")
    offset = None if self.offset is None else np.asarray(self.offset, np.float32)
    if offset is not None and (offset.ndim != 2 or offset.shape[1] != embed or not offset.shape[0]):
      raise ConfigError(f"prompt {self.name!r}: input offset of shape {offset.shape} does not fit "
                        f"prompts of width {embed}; expected [s, {embed}]")
    if offset is not None and not np.all(np.isfinite(offset)):
      raise ConfigError(f"prompt {self.name!r} ({self.source}): its input offset holds NaN or "
                        f"infinite values; give a finite offset")
    if (self.routing == "attempt") != (self.attention is not None):
      raise ConfigError(f"prompt {self.name!r}: routing 'attempt' goes with an ATTEMPT attention "
                        f"network and only with one")
    if self.attention is not None and (self.attention.down.shape[0] != embed
                                       or not 0 <= self.attention.target < k):
      raise ConfigError(f"prompt {self.name!r}: its ATTEMPT network does not fit {k} prompts of "
                        f"width {embed}")
    object.__setattr__(self, "prompts", prompts)
    object.__setattr__(self, "router", router)
    object.__setattr__(self, "offset", offset)
    if self.deep is not None:
      from spot_jax.prompts import deep as deep_lib  # pylint: disable=g-import-not-at-top
      record = deep_lib.to_record(self.deep)
      object.__setattr__(self, "deep", deep_lib.from_record(record, f"prompt {self.name!r}"))

  @property
  def has_tokens(self) -> bool:
    """Whether the deep prompt holds tokens the backbone must fold into prefixes."""
    return any(k.endswith("_tokens") for k in (self.deep or {}))

  @property
  def num_prompts(self) -> int:
    return self.prompts.shape[0]

  @property
  def length(self) -> int:
    return self.prompts.shape[1]

  @property
  def width(self) -> int:
    return self.prompts.shape[2]

  @property
  def offset_length(self) -> int:
    """s, the input positions the offset covers (0 without one)."""
    return 0 if self.offset is None else self.offset.shape[0]


class DeepArrays(NamedTuple):
  """One attention type's stacked prefixes (see the module docstring)."""
  kv: np.ndarray
  lengths: np.ndarray


class TableArrays(NamedTuple):
  """The stacked arrays (a pytree; see the module docstring for shapes)."""
  prompts: np.ndarray
  router: np.ndarray
  num_prompts: np.ndarray
  lengths: np.ndarray
  routing: np.ndarray
  offsets: np.ndarray
  offset_lengths: np.ndarray
  keys: np.ndarray
  attn_down: np.ndarray
  attn_up: np.ndarray
  attn_scale: np.ndarray
  attn_bias: np.ndarray
  target: np.ndarray
  deep: Mapping[str, DeepArrays] = {}


class PromptTable:
  """Named prompts stacked for serving.

  Attributes:
    entries: the `ServedPrompt`s, in table order.
    arrays: their `TableArrays`.
  """

  def __init__(self, entries: Sequence[ServedPrompt], emb_dim: Optional[int] = None):
    """Stacks `entries`; `emb_dim` (the model's width) is checked when given.

    Raises:
      ConfigError: no entries, duplicate names, or widths that differ from each other or from
        `emb_dim`.
    """
    entries = list(entries)
    if not entries:
      raise ConfigError("no prompts to serve; give at least one --prompt NAME=PATH")
    names = [e.name for e in entries]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
      raise ConfigError(f"prompt names must be unique; {', '.join(dupes)} given twice")
    want = emb_dim if emb_dim is not None else entries[0].width
    for e in entries:
      if e.width != want:
        raise ConfigError(f"prompt {e.name!r} ({e.source or 'given'}) has width {e.width} but "
                          f"the model's embedding width is {want}; give a prompt trained for "
                          f"this model")
    self.entries = entries
    self._emb_dim = emb_dim
    self._index = {n: i for i, n in enumerate(names)}
    big_k = max(e.num_prompts for e in entries)
    big_l = max(e.length for e in entries)
    prompts = np.zeros((len(entries), big_k, big_l, want), np.float32)
    router = np.zeros((len(entries), want, big_k), np.float32)
    offsets = np.zeros((len(entries), max(e.offset_length for e in entries), want), np.float32)
    for i, e in enumerate(entries):
      prompts[i, :e.num_prompts, :e.length] = e.prompts
      if e.router is not None:
        router[i, :, :e.num_prompts] = e.router
      if e.offset is not None:
        offsets[i, :e.offset_length] = e.offset
    self.arrays = TableArrays(
        prompts=prompts, router=router,
        num_prompts=np.array([e.num_prompts for e in entries], np.int32),
        lengths=np.array([e.length for e in entries], np.int32),
        routing=np.array([ROUTING_CODES[e.routing] for e in entries], np.int32),
        offsets=offsets, offset_lengths=np.array([e.offset_length for e in entries], np.int32),
        **_attention_arrays(entries, big_k, want),
        deep=_stack_deep(entries))

  @property
  def has_tokens(self) -> bool:
    """Whether some entry's deep prompt tokens still need `fold_tokens`."""
    return any(e.has_tokens for e in self.entries)

  def fold_tokens(self, fold: Callable[[np.ndarray, str], np.ndarray]) -> "PromptTable":
    """The same table with deep prompt tokens turned into plain prefixes.

    Args:
      fold: (tokens [layers, P, E], stack "encoder"/"decoder") -> [layers, 2, P, H, D], e.g.
        `spot_jax.prompts.deep.fold_tokens` with the served backbone.
    """
    entries = []
    for e in self.entries:
      if e.has_tokens:
        parts = {(k[:-len("_tokens")] if k.endswith("_tokens") else k):
                 (fold(v, k[:-len("_tokens")]) if k.endswith("_tokens") else v)
                 for k, v in e.deep.items()}
        e = dataclasses.replace(e, deep=parts)
      entries.append(e)
    return PromptTable(entries, self._emb_dim)

  @property
  def names(self) -> list[str]:
    return [e.name for e in self.entries]

  @property
  def max_length(self) -> int:
    """L, the positions every row's prompt occupies after padding."""
    return int(self.arrays.prompts.shape[2])

  def __len__(self) -> int:
    return len(self.entries)

  def index(self, name: str) -> int:
    """The row of prompt `name`.

    Raises:
      ConfigError: an unknown name (the message lists the known ones).
    """
    if name not in self._index:
      close = validate.close_names(str(name), self.names)
      hint = f" (did you mean {', '.join(close)}?)" if close else ""
      raise ConfigError(f"unknown prompt name {name!r}{hint}; valid: {', '.join(self.names)}")
    return self._index[name]

  def indices(self, names: Sequence[str]) -> np.ndarray:
    """[B] int32 rows for a list of names."""
    return np.array([self.index(n) for n in names], np.int32)

  def check_input_length(self, names: Sequence[str], input_length: int) -> None:
    """Refuses inputs longer than the offset of a prompt they use (DePT covers s positions).

    Raises:
      ConfigError: naming the prompt and its longest input.
    """
    for name in dict.fromkeys(names):
      entry = self.entries[self.index(name)]
      if entry.offset is not None and input_length > entry.offset_length:
        raise ConfigError(f"prompt {name!r} offsets the first {entry.offset_length} input "
                          f"positions (DePT) but inputs have {input_length}; give --input_length "
                          f"<= {entry.offset_length}")


def _stack_deep(entries: Sequence[ServedPrompt]) -> dict[str, DeepArrays]:
  """The entries' plain prefixes by attention type, right-aligned along P (tokens excluded)."""
  from spot_jax.prompts import deep as deep_lib  # pylint: disable=g-import-not-at-top
  out = {}
  for name in deep_lib.KV_FIELDS:
    parts = [(i, e.deep[name]) for i, e in enumerate(entries) if e.deep and name in e.deep]
    if not parts:
      continue
    shapes = {(p.shape[0],) + p.shape[3:] for _, p in parts}
    if len(shapes) != 1:
      raise ConfigError(f"the {name} prefixes of the served prompts differ in layers, heads or "
                        f"head size ({sorted(shapes)}); serve prompts of one model")
    big_p = max(p.shape[2] for _, p in parts)
    layers, heads, depth = parts[0][1].shape[0], *parts[0][1].shape[3:]
    kv = np.zeros((len(entries), layers, 2, big_p, heads, depth), np.float32)
    lengths = np.zeros((len(entries),), np.int32)
    for i, p in parts:
      kv[i, :, :, big_p - p.shape[2]:] = p
      lengths[i] = p.shape[2]
    out[name] = DeepArrays(kv, lengths)
  return out


def _attention_arrays(entries: Sequence[ServedPrompt], big_k: int, embed: int) -> dict:
  """The ATTEMPT arrays of TableArrays (see the module docstring), zero for other entries."""
  nets = [e.attention for e in entries]
  big_r = max((a.down.shape[1] for a in nets if a is not None), default=0)
  n = len(entries)
  out = {"keys": np.zeros((n, big_k, embed), np.float32),
         "attn_down": np.zeros((n, embed, big_r), np.float32),
         "attn_up": np.zeros((n, big_r, embed), np.float32),
         "attn_scale": np.zeros((n, embed), np.float32),
         "attn_bias": np.zeros((n, embed), np.float32),
         "target": np.full((n,), -1, np.int32)}
  for i, (e, a) in enumerate(zip(entries, nets)):
    if a is None:
      continue
    r = a.down.shape[1]
    out["keys"][i, :e.num_prompts] = e.prompts.max(axis=1) / np.float32(a.temperature)
    out["attn_down"][i, :, :r], out["attn_up"][i, :r] = a.down, a.up
    out["attn_scale"][i], out["attn_bias"][i], out["target"][i] = a.scale, a.bias, a.target
  return out
