"""The sweep, in the order it runs (driver.py sequences it):
- what it is told and what it knows: options.py (settings), trials.py (a trial's attributes), state.py
  (the study and the probes' findings, read-only), events.py (what progress displays are told);
- the runner (runner.py): comparisons on the slots, and the only writer of records;
- the stages: probes.py (the preemption boundary, boundary.py, predicted by kv_capacity.py; the yardstick),
  screen.py (the Optuna loop, with budget.py, twins.py and schedules.py), confirm.py (the best few against
  the baseline, winner.py);
- when a comparison is decided (sequential.py), the space (space.py), what it found (report.py), and the
  winner as a `vllm serve --config` file (export.py). The goodput sweep, which searches a rate per
configuration, is in goodput/."""
