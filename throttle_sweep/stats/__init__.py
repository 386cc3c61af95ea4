"""Pure statistics: run orders, the least-squares fit, verdicts, and what a comparison's records say."""
