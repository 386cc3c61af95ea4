"""mode=plan: a finished capacity or goodput study and a demand curve -> replicas per bucket, the day's GPU-hours
and dollars. It measures nothing."""
