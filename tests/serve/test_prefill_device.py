"""--prefill_device: its values, the devices it picks, and the host devices the program makes."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from spot_jax.errors import ConfigError
from spot_jax.serve import assemble, service
from spot_jax.serve.model import slots


def _args(*argv):
  return service._parser().parse_args([*argv, "--prompt=p=/nowhere"])  # pylint: disable=protected-access


@pytest.mark.parametrize("value", ["gpu1", "-1", "1.5", ""])
def test_a_bad_prefill_device_is_refused_naming_the_valid_ones(value):
  with pytest.raises(ConfigError, match=r"--prefill_device=.* give 'auto', 'same' or a local"):
    service._check(_args(f"--prefill_device={value}"))  # pylint: disable=protected-access


def test_a_device_index_beyond_the_process_is_refused():
  params = {"w": jax.device_put(np.ones(3, np.float32))}
  count = len(jax.local_devices())
  with pytest.raises(ConfigError, match=rf"has {count} local device\(s\); give an index below"):
    assemble._prefill_device(str(count), params)  # pylint: disable=protected-access
  assert assemble._prefill_device("0", params) == jax.local_devices()[0]  # pylint: disable=protected-access
  assert assemble._prefill_device("same", params) is None  # pylint: disable=protected-access


def test_auto_takes_the_next_device_of_the_kind_else_none():
  params = {"w": jax.device_put(np.ones(3, np.float32), jax.devices()[0])}
  others = [d for d in jax.local_devices() if d != jax.devices()[0]]
  assert slots.second_device(params) == (others[0] if others else None)
  placed, device = slots.one_device(params)
  assert device == jax.devices()[0] and placed["w"].devices() == {device}


@pytest.mark.parametrize("argv,want", [
    (["--engine=continuous"], "2"),
    (["--engine", "continuous", "--prefill_device=auto"], "2"),
    (["--engine=continuous", "--prefill_device=same"], None),
    (["--engine=batch"], None),
    ([], None),
])
def test_the_program_makes_two_host_devices_only_to_prefill_beside(argv, want):
  environ = {"PATH": "/bin"}
  service.host_devices(argv, environ)
  assert environ.get("JAX_NUM_CPU_DEVICES") == want


@pytest.mark.parametrize("environ", [{"JAX_NUM_CPU_DEVICES": "4"},
                                     {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}])
def test_a_set_host_device_count_is_kept(environ):
  before = dict(environ)
  service.host_devices(["--engine=continuous"], environ)
  assert environ == before


def test_making_them_does_not_import_jax():
  """`runtime.keep_heap` turns JAX's asynchronous dispatch off when it finds jax imported, and
  the engine's host work hides behind its device calls only with it on."""
  code = ("import sys; from spot_jax.serve import service; "
          "service.host_devices(['--engine=continuous']); print('jax' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=pathlib.Path(__file__).parents[2], timeout=120)
  assert out.stdout.strip() == "False"


def test_auto_keeps_one_copy_of_weights_the_host_cannot_hold_twice(monkeypatch, capsys):
  params = {"w": jax.device_put(np.ones((256, 256), np.float32), jax.devices()[0])}  # 256 KiB
  other = jax.devices()[0]  # stands for a second host device
  monkeypatch.setattr(slots, "second_device", lambda unused: other)
  monkeypatch.setattr(assemble, "host_available", lambda: 2**30)
  assert assemble._prefill_device("auto", params) == other  # pylint: disable=protected-access
  monkeypatch.setattr(assemble, "host_available", lambda: 2**19 - 1)
  assert assemble._prefill_device("auto", params) is None  # pylint: disable=protected-access
  assert "a second copy of the weights (0.0 GiB) would take over half" in capsys.readouterr().err
  assert assemble.host_available() > 0
