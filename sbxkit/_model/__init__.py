"""What a sandbox is asked to be, pure: the spec and its rules, limits, mounts, GPUs, settings,
results, uids, and governed networking's terms."""
