"""Multi-process set-up (`jax.distributed`) for the command lines' `--multiprocess` flag.

On TPU VMs and SLURM/MPI clusters `jax.distributed.initialize()` finds everything itself. On
other machines (GPU hosts, several CPU processes on one machine) give the coordinator and the
process layout, by flags or environment variables (flags win):

  --coordinator_address=HOST:PORT   SPOT_JAX_COORDINATOR_ADDRESS (or JAX_COORDINATOR_ADDRESS)
  --num_processes=N                 SPOT_JAX_NUM_PROCESSES
  --process_id=I                    SPOT_JAX_PROCESS_ID
  --heartbeat_timeout=SECONDS       SPOT_JAX_HEARTBEAT_TIMEOUT (jax's default: 100)

Every process runs the same command. When one process dies, the others stop once the
coordination service misses its heartbeats (within the heartbeat timeout) with an error
naming the missing task, instead of waiting forever in a collective.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

from spot_jax import validate
from spot_jax.errors import ConfigError

def _setting(*env: str, minimum: Optional[int] = None):
  """A setting of `DistributedConfig`: None unless given, its environment variables (the first
  set one counts) and, for an integer, its smallest valid value."""
  return dataclasses.field(default=None, metadata={"env": env, "minimum": minimum})


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
  """How this process joins the job (None: let jax detect it).

  Attributes:
    coordinator_address: "host:port" of process 0's coordination service.
    num_processes: processes in the job.
    process_id: this process's index in [0, num_processes).
    heartbeat_timeout: seconds without heartbeats after which a process is considered dead.
  """
  coordinator_address: Optional[str] = _setting("SPOT_JAX_COORDINATOR_ADDRESS",
                                                "JAX_COORDINATOR_ADDRESS")
  num_processes: Optional[int] = _setting("SPOT_JAX_NUM_PROCESSES", minimum=1)
  process_id: Optional[int] = _setting("SPOT_JAX_PROCESS_ID", minimum=0)
  heartbeat_timeout: Optional[int] = _setting("SPOT_JAX_HEARTBEAT_TIMEOUT", minimum=1)

  LAYOUT = ("coordinator_address", "num_processes", "process_id")  # given all together, or none

  @property
  def explicit(self) -> bool:
    """The process layout is given (else jax detects it)."""
    return any(getattr(self, k) is not None for k in self.LAYOUT)


def _int(name: str, value, minimum: int) -> Optional[int]:
  if value is None or value == "":
    return None
  try:
    number = int(value)
  except (TypeError, ValueError):
    raise ConfigError(f"{name}={value!r} is not an integer; give an integer >= {minimum}") from None
  return validate.positive_int(number, name, minimum=minimum)


def resolve(coordinator_address: Optional[str] = None, num_processes=None, process_id=None,
            heartbeat_timeout=None, environ: Mapping[str, str] = os.environ) -> DistributedConfig:
  """Merges flags with the environment and checks them (one-line ConfigErrors)."""
  given = {"coordinator_address": coordinator_address, "num_processes": num_processes,
           "process_id": process_id, "heartbeat_timeout": heartbeat_timeout}
  values = {}
  for setting in dataclasses.fields(DistributedConfig):
    value = given[setting.name]
    if value is None:
      value = next((environ[n] for n in setting.metadata["env"] if environ.get(n)), None)
    minimum = setting.metadata["minimum"]
    values[setting.name] = ((value or None) if minimum is None
                            else _int(setting.name, value, minimum))
  cfg = DistributedConfig(**values)
  if cfg.explicit:
    missing = [k for k in cfg.LAYOUT if getattr(cfg, k) is None]
    if missing:
      raise ConfigError(f"multi-process set-up is missing {', '.join(missing)}; give all of "
                        f"--coordinator_address=HOST:PORT, --num_processes=N and --process_id=I "
                        f"(or none, on TPU VMs and SLURM clusters)")
    if ":" not in cfg.coordinator_address:
      raise ConfigError(f"coordinator_address={cfg.coordinator_address!r} has no port; "
                        "give HOST:PORT")
    if cfg.process_id >= cfg.num_processes:
      raise ConfigError(f"process_id={cfg.process_id} must be < num_processes={cfg.num_processes}")
  return cfg


def initialize(cfg: DistributedConfig) -> None:
  """Calls `jax.distributed.initialize` with `cfg` (auto-detection when nothing is explicit)."""
  import jax  # pylint: disable=g-import-not-at-top
  kwargs = {}
  if cfg.explicit:
    kwargs.update(coordinator_address=cfg.coordinator_address, num_processes=cfg.num_processes,
                  process_id=cfg.process_id)
  if cfg.heartbeat_timeout is not None:
    kwargs["heartbeat_timeout_seconds"] = cfg.heartbeat_timeout
  jax.distributed.initialize(**kwargs)


# Fragments of the errors a collective or the coordination service raises in a surviving
# process when another process of the job died.
_PEER_LOST = ("Gloo", "Connection reset by peer", "heartbeat timeout", "coordination service",
              "another task died", "Socket closed")


class PeerLostError(ConnectionError):
  """Another process of a multi-process job stopped (its collectives or heartbeats failed)."""


def explain_peer_loss(error: BaseException) -> Optional[PeerLostError]:
  """A one-line `PeerLostError` for `error` if it means a peer process died, else None."""
  import jax  # pylint: disable=g-import-not-at-top
  text = str(error)
  if jax.process_count() <= 1 or not any(f in text for f in _PEER_LOST):
    return None
  first = text.strip().splitlines()[0][:200] if text.strip() else type(error).__name__
  return PeerLostError(f"process {jax.process_index()} of {jax.process_count()} lost contact with "
                       f"another process of the job ({first}); restart every process with the same "
                       f"command to resume from MODEL_DIR's last checkpoint")


def set_cpu_devices(count) -> None:
  """Splits this host's CPU into `count` JAX devices (before JAX starts its backends).

  On a CPU-only host the data-parallel mesh then runs one batch shard per device, which keeps
  every core busy through the single-threaded parts of the step (elementwise work, small
  matmuls) that one device leaves on one core. A no-op for None. Only the CPU backend is
  affected; accelerators keep their own devices.

  Raises:
    ConfigError: `count` is not a positive integer, or JAX's backends already started with a
      different number of CPU devices.
  """
  count = _int("--cpu_devices", count, 1)
  if count is None:
    return
  import jax  # pylint: disable=g-import-not-at-top
  try:
    jax.config.update("jax_num_cpu_devices", count)
  except RuntimeError as e:  # the backend is already initialised
    have = len(jax.devices("cpu"))
    if have != count:
      raise ConfigError(f"--cpu_devices={count} comes too late: JAX already runs {have} CPU "
                        f"device(s); set it before anything touches JAX ({e})") from None


def add_arguments(parser) -> None:
  """The multi-process flags every program that can run on several processes takes."""
  parser.add_argument("--multiprocess", action="store_true",
                      help="call jax.distributed.initialize() first (multi-host pods/clusters); "
                           "also enabled by SPOT_JAX_MULTIPROCESS=1 or by any of the flags below")
  parser.add_argument("--coordinator_address", default=None,
                      help="HOST:PORT of process 0 (GPU hosts, local CPU processes; TPU VMs "
                           "detect it)")
  parser.add_argument("--num_processes", default=None, help="processes in the job")
  parser.add_argument("--process_id", default=None, help="this process's index, 0..num_processes-1")
  parser.add_argument("--heartbeat_timeout", default=None,
                      help="seconds after which a silent process counts as dead (jax's "
                           "default 100)")


def setup(args, environ: Mapping[str, str] = os.environ) -> DistributedConfig:
  """Joins the multi-process job the parsed `add_arguments` flags (or the environment) describe."""
  cfg = resolve(args.coordinator_address, args.num_processes, args.process_id,
                args.heartbeat_timeout, environ)
  if args.multiprocess or environ.get("SPOT_JAX_MULTIPROCESS") == "1" or cfg.explicit:
    initialize(cfg)
  return cfg
