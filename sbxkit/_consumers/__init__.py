"""What callers open on an owned container: one-shot runs, sessions, PTYs, stdio workers, file
grants, batches."""
