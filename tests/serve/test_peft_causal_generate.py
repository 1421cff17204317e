"""peft 0.21.2's `generate` for decoder-only prompt learning under transformers 5, as observed.

transformers 5 hands the KV cache to `prepare_inputs_for_generation` and the model as `cache`;
peft 0.21.2 still looks for `past_key_values`, finds none, and takes every step for the first:

- PROMPT_TUNING, `use_cache=True`: the prompt is prepended again at every step (each incremental
  call gets L + 1 embeddings), so the first new token is right and the later ones are not;
  `use_cache=False` is right.
- PREFIX_TUNING, `use_cache=True`: peft's prefix cache goes in as `past_key_values` beside
  generate's own empty `cache`, which the model uses: the prefixes are ignored from the first
  token. `use_cache=False`: the first token is right, then the filled prefix cache comes back as
  `cache` and the next step reads stale keys.
- PROMPT_TUNING, left padding: peft drops `position_ids`, so a left-padded row's positions count
  its padding (forward and generate alike).

Workaround (checked here): generate with the base model from `inputs_embeds` = [prompt; embedded
input] (a left-padded row: [padding; prompt; input]) and the mask extended by L ones; for
prefixes, a greedy loop over peft's forward. When a
test below fails because peft now agrees with its forward, update docs/serving.md.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from tests.helpers import causal_models  # noqa: E402

LENGTH = 3
STEPS = 5
SCALE = 0.5  # weights ~ N(0, 0.25): the wrong tokens show, not only the wrong logits
IDS = [[5, 9, 13, 7]]
FIXED = "peft's generate now agrees with its forward: update docs/serving.md's PEFT section"


def _peft(family: str, kind: str):
  """(base, peft model) with a random adapter (peft's own init under a fixed seed)."""
  base = causal_models.hf_model(family, scale=SCALE)
  config = (peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=LENGTH)
            if kind == "prompt" else
            peft.PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=LENGTH))
  torch.manual_seed(1)
  return base, peft.get_peft_model(base, config).eval()


def _generate(model, ids, mask=None, **kwargs):
  """(new tokens [B, STEPS], per-step logits [STEPS, B, V]) of greedy `generate`."""
  with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    out = model.generate(**ids, attention_mask=mask, max_new_tokens=STEPS,
                         min_new_tokens=STEPS, do_sample=False, pad_token_id=causal_models.PAD,
                         eos_token_id=None, output_scores=True, return_dict_in_generate=True,
                         **kwargs)
  return out.sequences[:, -STEPS:].numpy(), torch.stack(out.scores).numpy()


def _forward_greedy(model, ids):
  """Greedy decoding by peft's full forward at every step: what generate should give."""
  seq, steps = ids, []
  with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for _ in range(STEPS):
      logits = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[:, -1]
      steps.append(logits.numpy())
      seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
  return seq[:, -STEPS:].numpy(), np.stack(steps)


def _step_diffs(a, b):
  return [float(np.abs(x - y).max()) for x, y in zip(a, b)]


@pytest.mark.parametrize("family", causal_models.FAMILIES)
def test_prompt_tuning_cached_generate_prepends_the_prompt_again(family):
  base, model = _peft(family, "prompt")
  ids = torch.tensor(IDS)
  lengths = []
  hook = base.register_forward_pre_hook(
      lambda _, args, kwargs: lengths.append(kwargs["inputs_embeds"].shape[1]), with_kwargs=True)
  cached, cached_steps = _generate(model, {"input_ids": ids}, use_cache=True)
  hook.remove()
  plain, plain_steps = _generate(model, {"input_ids": ids}, use_cache=False)
  want, want_steps = _forward_greedy(model, ids)
  cached_diff, plain_diff = _step_diffs(cached_steps, want_steps), _step_diffs(plain_steps,
                                                                               want_steps)
  print(f"{family}: forward {want[0].tolist()} use_cache=False {plain[0].tolist()} "
        f"use_cache=True {cached[0].tolist()}; per-step max |dlogit| cached "
        f"{[f'{d:.1e}' for d in cached_diff]}, uncached {max(plain_diff):.1e}")
  assert max(plain_diff) < 1e-5 and np.array_equal(plain, want)
  assert cached_diff[0] < 1e-5  # the first token is right
  # every incremental step got the prompt again: L + 1 embeddings, not 1
  assert lengths == [LENGTH + len(IDS[0])] + [LENGTH + 1] * (STEPS - 1), FIXED
  assert min(cached_diff[1:]) > 1e-2, FIXED


@pytest.mark.parametrize("family", causal_models.FAMILIES)
def test_prefix_tuning_generate_is_wrong_with_and_without_cache(family):
  _, model = _peft(family, "prefix")
  ids = torch.tensor(IDS)
  cached, cached_steps = _generate(model, {"input_ids": ids}, use_cache=True)
  plain, plain_steps = _generate(model, {"input_ids": ids}, use_cache=False)
  want, want_steps = _forward_greedy(model, ids)
  cached_diff, plain_diff = _step_diffs(cached_steps, want_steps), _step_diffs(plain_steps,
                                                                               want_steps)
  print(f"{family}: forward {want[0].tolist()} use_cache=False {plain[0].tolist()} "
        f"use_cache=True {cached[0].tolist()}; per-step max |dlogit| vs forward: cached "
        f"{[f'{d:.1e}' for d in cached_diff]}, uncached {[f'{d:.1e}' for d in plain_diff]}")
  assert cached_diff[0] > 1e-2, FIXED  # the prefixes are ignored from the first token
  assert plain_diff[0] < 1e-5 and min(plain_diff[1:]) > 1e-2, FIXED


def test_prompt_tuning_left_padding_shifts_positions():
  base, model = _peft("llama", "prompt")
  batch = torch.tensor([[0, 0, 5, 9, 13], [4, 8, 12, 16, 3]])
  mask = (batch != causal_models.PAD).long()
  with torch.no_grad(), warnings.catch_warnings():
    warnings.simplefilter("ignore")
    padded = model(input_ids=batch, attention_mask=mask).logits[0, -1]
    alone = model(input_ids=batch[:1, 2:]).logits[0, -1]
  _, base_padded = _generate(base, {"input_ids": batch}, mask)
  _, base_alone = _generate(base, {"input_ids": batch[:1, 2:]})
  _, peft_padded = _generate(model, {"input_ids": batch}, mask, use_cache=False)
  _, peft_alone = _generate(model, {"input_ids": batch[:1, 2:]}, use_cache=False)
  diff = float((padded - alone).abs().max())
  generate_diff = float(np.abs(peft_padded[0, 0] - peft_alone[0, 0]).max())
  base_diff = float(np.abs(base_padded[0, 0] - base_alone[0, 0]).max())
  print(f"left-padded row vs alone: peft forward max |dlogit| {diff:.2e}, peft generate's first "
        f"step {generate_diff:.2e}; base model {base_diff:.1e}")
  assert np.abs(base_padded[:, 0] - base_alone[:, 0]).max() < 1e-5  # the base model handles it
  assert diff > 1e-2 and generate_diff > 1e-2, FIXED


@pytest.mark.parametrize("family", causal_models.FAMILIES)
def test_workaround_generate_from_inputs_embeds(family):
  """The base model's cached generate from [prompt; embedded input] is peft's forward's greedy
  decoding, for a lone row and for the same row left-padded in a batch, its padding put before
  the prompt (after it, Gemma 3's sliding window would lose prompt rows to the padding)."""
  base, model = _peft(family, "prompt")
  ids = torch.tensor(IDS)
  want, want_steps = _forward_greedy(model, ids)

  def generate(batch):
    mask = (batch != causal_models.PAD).long()
    with torch.no_grad():
      x, prompt = base.get_input_embeddings()(batch), model.get_prompt(1)[0]
      pads = (mask == 0).sum(1).tolist()
      embeds = torch.stack([torch.cat([x[r, :k], prompt, x[r, k:]]) for r, k in enumerate(pads)])
    mask = torch.cat([mask, torch.ones(len(pads), LENGTH, dtype=mask.dtype)], 1)
    return _generate(base, {"inputs_embeds": embeds}, mask, use_cache=True)

  got, got_steps = generate(ids)
  assert np.array_equal(got, want) and max(_step_diffs(got_steps, want_steps)) < 1e-5
  padded, padded_steps = generate(torch.tensor([[0, 0] + IDS[0], [4, 8, 12, 16, 3, 9]]))
  assert np.array_equal(padded[:1], want)
  assert max(_step_diffs(padded_steps[:, :1], want_steps)) < 1e-5
