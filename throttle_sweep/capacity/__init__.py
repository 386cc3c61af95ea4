"""The capacity question (`mode=capacity`): the highest arrival rate at which a configuration keeps its latency
SLO. slo: which requests meet it, and a run's attainment; rates: the rates to run (a bracket, bisection with
single runs, then replicated runs around the knee); knee: the capacity and its interval from those runs;
runs: one run at a rate; steady: its warm-up and trend; report: the summary and picture. The goodput sweep
(sweep/goodput/) and the replica plan (replica_plan/) are built on these."""
