"""Third-party noise stays quiet unless asked for, and one switch (VLLM_LOGGING_LEVEL=INFO) turns it back on."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec

import pytest

pytestmark = pytest.mark.integration

IMPORT = ("from throttle_sweep.engines.vllm_inproc import prepare_environment\n"
          "prepare_environment()\n"
          "import vllm.triton_utils\n")


@pytest.mark.skipif(find_spec("triton") is None, reason="vLLM says nothing about Triton when it is not installed")
def test_vllms_import_time_triton_warning_is_quiet_unless_asked_for():
    def stderr(**env):
        base = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
        return subprocess.run([sys.executable, "-c", IMPORT], env={**base, **env}, capture_output=True, text=True,
                              check=True).stderr

    assert "Triton is installed" not in stderr()
    assert "Triton is installed" in stderr(VLLM_LOGGING_LEVEL="INFO")
