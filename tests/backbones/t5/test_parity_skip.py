"""Without the t5 package, the T5 parity tests skip cleanly and say why
(t5 blocked in a subprocess)."""
from __future__ import annotations

import os
import subprocess
import sys
from tests.helpers import REPO


# sys.modules["t5"] = None makes every `import t5...` fail as if the package were not installed.
BLOCKED = ("import sys; sys.modules['t5'] = None; import pytest; "
           "sys.exit(pytest.main(['tests/backbones/t5/test_parity_tasks.py', '-q', '-rs', '-p', "
           "'no:cacheprovider']))")


def test_parity_tests_skip_with_a_reason_when_t5_is_absent():
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(REPO))
  proc = subprocess.run([sys.executable, "-c", BLOCKED], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=600)
  # 5: pytest collected no test, since the whole module skipped at import
  assert proc.returncode == 5, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert "1 skipped" in proc.stdout, proc.stdout[-3000:]
  assert ("T5 parity needs the t5 package: pip install --no-deps t5==0.9.4"
          in proc.stdout), proc.stdout[-3000:]
  assert ("passed" not in proc.stdout and "failed" not in proc.stdout
          and "error" not in proc.stdout.lower())
