"""The goodput sweep: a rate search per proposed configuration, the cheapest confirmed against the baseline on fresh
interleaved runs, its report and pictures."""
