"""What is kept on disk: replicate records, what a results folder measured, the one-writer lock, and what a records
file holds."""
