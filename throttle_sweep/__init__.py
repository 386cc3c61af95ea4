"""throttle_sweep: find the cheapest way to serve a model with vLLM, and prove it."""

from __future__ import annotations

__version__ = "0.1.0"
