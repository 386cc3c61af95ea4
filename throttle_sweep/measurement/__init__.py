"""One replicate and what it is made of: the fixed work (workload, timed traces), the replicate itself, work sized
by time, its price and its energy."""
