"""The sweep, in the order it runs: the search space (space.py), where preemption starts (boundary.py:
single-run probes), when a comparison is decided (sequential.py), the study driver that runs probes,
comparisons and confirmations on the slots and alone writes records and the study (driver.py), what it
found (report.py), and the winner as a `vllm serve --config` file (export.py)."""
