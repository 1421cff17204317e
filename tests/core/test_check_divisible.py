"""`partitioning.check_divisible` on abstract boxed parameters, with and without a mesh context.

The backbone loader checks the frozen weights' shardings before any array exists, so the check
must read `nn.Partitioned` boxes of ShapeDtypeStructs even where a mesh is set (flax's unbox
would apply a sharding constraint there, which an abstract array refuses).
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from spot_jax import partitioning
from spot_jax.errors import ConfigError


class _Dense(nn.Module):
  width: int

  @nn.compact
  def __call__(self, x):
    kernel = self.param("kernel", nn.with_logical_partitioning(
        nn.initializers.zeros, ("embed", "mlp")), (x.shape[-1], self.width))
    return x @ kernel


def _abstract(width):
  return jax.eval_shape(_Dense(width).init, jax.random.PRNGKey(0), jnp.zeros((1, 6)))


@pytest.mark.parametrize("under_mesh", [False, True])
def test_divisible_shapes_pass_and_others_are_named(under_mesh):
  mesh = partitioning.create_mesh(1)
  rules = partitioning.logical_rules()
  abstract = _abstract(4)
  shardings = partitioning.param_shardings(abstract, mesh, rules)
  if under_mesh:
    with jax.set_mesh(mesh), nn.logical_axis_rules(list(rules)):
      partitioning.check_divisible(abstract, shardings, mesh)
  else:
    partitioning.check_divisible(abstract, shardings, mesh)

  class _Wider:  # the mesh's shape as a 3-wide "model" axis would give it
    shape = {"data": 1, "model": 3}
  with pytest.raises(ConfigError, match=r"params/kernel of shape \[6, 4\].*axis 1 \(4\) over "
                                        r"model \(3\)"):
    partitioning.check_divisible(abstract, shardings, _Wider())
