"""The capacity question (`mode=capacity`): the highest arrival rate at which a configuration keeps its latency
SLO. slo: which requests meet it, and a run's attainment; search: the rates to run (a bracket, bisection with
single runs, then replicated runs around the knee); knee: the capacity and its interval from those runs."""
