"""How a comparison is shown (printout, summaries, plot), and live progress."""
